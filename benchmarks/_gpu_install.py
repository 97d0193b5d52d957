"""What gpu_check.py installs on a GPU machine, and the wheels it carries to one that has no
package index.

A machine with an index runs `pip install` of the CUDA wheels, the project's other
dependencies and the reference's packages. This workplace's GPU machines reach no index: their
Python (3.12, with torch built for CUDA 13, transformers, onnx, onnxscript, onnxruntime's CPU
wheel) lacks the packages in DEVICE_PACKAGES, and a call carries at most 64 MiB of files, less
than onnxruntime-gpu's wheel. `download_wheels` (run where the index is) fetches them and cuts
them into folders that each fit one call; `--wheels` joins the pieces and installs them there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: onnxruntime-genai's CUDA wheel at the version CI tests, and the onnxruntime-gpu it needs:
#: onnxruntime-genai-cuda 0.18.0 requires onnxruntime-gpu>=1.31.0, and 1.31.1 is the newest
#: on PyPI (CI's CPU onnxruntime 1.32.0 has no gpu wheel). Both are built for CUDA 13.
GPU_WHEELS = ("onnxruntime-gpu==1.31.1", "onnxruntime-genai-cuda==0.18.0")
#: The CPU wheels with the same import names (onnxruntime, onnxruntime_genai).
CPU_WHEELS = ("onnxruntime", "onnxruntime-genai")
#: CI's torch; its default Linux wheel on PyPI is built with CUDA.
TORCH = "torch==2.13.0"
#: The reference's packages beside the project's own dependencies (pyproject's test extra).
REFERENCE = ("transformers>=4.57", "tokenizers>=0.22")
#: What the GPU machines' Python lacks (or has too old: onnx-ir 1.0, transformers 5.17, whose
#: missing ExaoneConfig and InternLM3Config the fixtures import) of what the run imports, with
#: transformers' own needs beyond that image (huggingface-hub 2 and what it imports), carried
#: at the versions installed where the wheels are downloaded (CI's).
DEVICE_PACKAGES = (
    "onnx-ir",
    "gguf",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "transformers",
    "huggingface-hub",
    "kernels",
    "tomlkit",
    "httpx2",
    "httpcore2",
    "truststore",
    "hf-xet",
    "click",
)
#: The GPU machines' interpreter and platform, for `pip download`.
DEVICE_PLATFORM = (
    "--python-version=3.12",
    "--implementation=cp",
    "--platform=manylinux_2_28_x86_64",
    "--platform=manylinux_2_27_x86_64",
    "--platform=manylinux_2_17_x86_64",
    "--platform=manylinux2014_x86_64",
)
#: Bytes of wheels per carried folder: a call carries 64 MiB with the working tree (~3 MiB).
CARRY_BYTES = 57 << 20
_PART = ".part-"


def installed_version(package: str, default: str = "") -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return default


def install_commands(wheels: list[str] | None, *, dry_run: bool) -> list[list[str]]:
    """The pip commands that make this interpreter ready for the GPU run: the CPU wheels out,
    then the GPU ones and the rest from the index, or every wheel in the `wheels` folders."""
    pip = [sys.executable, "-m", "pip"]
    commands = [[*pip, "uninstall", "-y", *CPU_WHEELS]]
    if wheels:
        files = join_parts([Path(folder) for folder in wheels])
        return [*commands, [*pip, "install", "--no-index", "--no-deps", *map(str, files)]]
    packages = [*GPU_WHEELS, *_project_dependencies(), *REFERENCE]
    if not dry_run and "+cpu" in installed_version("torch", "+cpu"):
        packages.append(TORCH)
    return [*commands, [*pip, "install", *packages]]


def _project_dependencies() -> list[str]:
    """pyproject's dependencies less the CPU wheels the GPU ones replace."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [
        requirement
        for requirement in project["dependencies"]
        if requirement.split(">")[0].split("=")[0].split("<")[0].strip() not in CPU_WHEELS
    ]


def join_parts(folders: list[Path]) -> list[Path]:
    """Every wheel in `folders`, pieces named NAME.whl.part-* joined into NAME.whl (in the first
    folder) in the order of their names."""
    wheels = [path for folder in folders for path in sorted(folder.glob("*.whl"))]
    parts: dict[str, list[Path]] = {}
    for folder in folders:
        for path in folder.glob(f"*.whl{_PART}*"):
            parts.setdefault(path.name.split(_PART)[0], []).append(path)
    for name, pieces in sorted(parts.items()):
        whole = folders[0] / name
        with whole.open("wb") as stream:
            for piece in sorted(pieces, key=lambda path: path.name):
                stream.write(piece.read_bytes())
        wheels.append(whole)
    return wheels


def add_checkout_to_path() -> None:
    """A .pth file naming the repository, so isolated processes import mobius_genai from it
    (unless it is installed already)."""
    try:
        import mobius_genai  # noqa: F401
    except ImportError:
        site = Path(sysconfig.get_paths()["purelib"])
        (site / "mobius_genai_checkout.pth").write_text(f"{ROOT}\n")


def download_wheels(prefix: Path) -> list[Path]:
    """The device's wheels from the index, cut into folders `prefix`-1, -2, ... of at most
    CARRY_BYTES each (a big wheel in pieces); returns the folders."""
    pinned = [f"{name}=={installed_version(name)}" for name in DEVICE_PACKAGES]
    download = prefix.with_name(f"{prefix.name}-download")
    shutil.rmtree(download, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += [*DEVICE_PLATFORM, "-d", str(download), *GPU_WHEELS, *pinned]
    subprocess.run(command, check=True)
    pieces = [piece for wheel in sorted(download.glob("*.whl")) for piece in _cut(wheel)]
    folders: list[Path] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda path: -path.stat().st_size):  # first fit
        size = piece.stat().st_size
        index = next((i for i, left in enumerate(room) if size <= left), len(folders))
        if index == len(folders):
            folders.append(prefix.with_name(f"{prefix.name}-{index + 1}"))
            shutil.rmtree(folders[-1], ignore_errors=True)
            folders[-1].mkdir(parents=True)
            room.append(CARRY_BYTES)
        shutil.move(piece, folders[index] / piece.name)
        room[index] -= size
    shutil.rmtree(download)
    return folders


def _cut(wheel: Path) -> list[Path]:
    """`wheel` itself, or pieces of it of CARRY_BYTES each (the wheel removed)."""
    if wheel.stat().st_size <= CARRY_BYTES:
        return [wheel]
    pieces = []
    with wheel.open("rb") as stream:
        while chunk := stream.read(CARRY_BYTES):
            pieces.append(wheel.with_name(f"{wheel.name}{_PART}{len(pieces):03d}"))
            pieces[-1].write_bytes(chunk)
    wheel.unlink()
    return pieces
