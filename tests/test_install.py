"""A non-editable `pip install .` into a fresh venv gives a working CLI with its data files."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from tests.conftest import TINY_QWEN2

ROOT = Path(__file__).resolve().parents[1]
# The fresh venv must import mobius_genai from the wheel, not from a PYTHONPATH checkout.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _run(*args: str | Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=ENV, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_installs_a_working_cli(tmp_path):
    wheels = tmp_path / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        wheels,
        ROOT,
        cwd=tmp_path,
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Dependencies come from the test environment's site-packages (no download in tests);
    # mobius_genai itself only from the wheel.
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("mobius_genai-*.whl"))
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    where = _run(python, "-c", "import mobius_genai; print(mobius_genai.__file__)", cwd=tmp_path)
    assert str(env_dir) in where
    cli = env_dir / "bin" / "mobius-genai"
    assert "cuda" in _run(cli, "eps", cwd=tmp_path)
    out = tmp_path / "tiny-cpu"
    env = {**ENV, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [
            str(cli),
            "package",
            str(TINY_QWEN2),
            "--ep",
            "cpu",
            "-o",
            str(out),
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (out / "genai_config.json").is_file() and (out / "model.onnx").is_file()
