"""The GPU check in one command (issue 37): tiny fixtures packaged for `--ep cuda`, run with
onnxruntime-genai on the GPU, checked against transformers and the cpu bundle, timed against
onnxruntime-genai's builder.

    python benchmarks/gpu_check.py --install --out $OUT          # on a GPU machine
    python benchmarks/gpu_check.py --dry-run --lines dense-fp16  # anywhere: every CPU step

Each line (`_gpu_lines.LINES`, most important first) writes a tiny random checkpoint on the
spot (no download), packages it for cuda in fp16, bf16 or int4 (with the cuda kernels
it checks turned on, e.g. MoE) and for cpu, and runs the steps of
`_gpu_run.py` in a process of its own: one line failing, crashing or hanging leaves the others
running. `--jobs` lines run side by side (their packaging overlaps; their device steps take
turns). A line gets at most `--line-s` seconds and the whole run `--budget-s` (lines that no
longer fit are listed as skipped), so the run ends before the device command's limit. Results
go to `gpu_check.json` (every step, its numbers and notes) and `gpu_check.md` (the table)
under `--out` ($OUT when set), rewritten after every line.

`--install` first prints, then runs, what the run needs beside the repository: the CUDA
wheels of onnxruntime-genai (the version CI tests) and onnxruntime, which replace the CPU ones
(they share import names), the project's other dependencies, transformers, and torch where the
installed one has no CUDA; `--wheels DIR ...` installs from wheel files instead (a machine
without an index; pieces `NAME.whl.part-*` are joined first), which `--download-wheels PREFIX`
fetches where an index is and cuts into folders one device call carries (`_gpu_install.py`).
The repository itself goes on the interpreter's path with a .pth file, so isolated
(`python -I`) processes import it. Before any line, a process of its own checks that torch
sees a GPU and that everything the lines import imports.

`--dry-run` runs everything a CPU can: packaging every bundle, the builder, transformers'
reference, onnxruntime's CPU provider on the cuda graphs where it has their kernels (not bf16;
the vision graph with PackedMultiHeadAttention's standard body inlined), the comparisons, the
timing code and the table; tests/benchmarks/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _gpu_install import (  # noqa: E402
    add_checkout_to_path,
    download_wheels,
    install_commands,
    installed_version,
)
from _gpu_table import verdict, write_outputs  # noqa: E402

MIN_LINE_S = 15
LOG_TAIL = 3000
POLL_S = 0.5


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        return _child(args)
    from _gpu_lines import LINES

    names = list(LINES) if args.lines is None else args.lines.split(",")
    unknown = [name for name in names if name not in LINES]
    if unknown:
        print(
            f"gpu_check: unknown line {', '.join(unknown)}; accepted: {', '.join(LINES)}",
            file=sys.stderr,
        )
        return 2
    if args.jobs < 1:
        print(f"gpu_check: --jobs is {args.jobs}; accepted: 1 or more", file=sys.stderr)
        return 2
    if args.download_wheels:
        return _download(Path(args.download_wheels))
    for command in install_commands(args.wheels, dry_run=args.dry_run):
        print("install:", shlex.join(command), flush=True)
        if (args.install or args.wheels) and subprocess.run(command).returncode != 0:
            print(f"gpu_check: the install step failed: {shlex.join(command)}", file=sys.stderr)
            return 2
    if args.install or args.wheels:
        add_checkout_to_path()
    out = Path(args.out or os.environ.get("OUT") or HERE / "_work" / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    environment = _environment(args.dry_run)
    problem = environment.get("error") or (None if environment.get("cuda") else "no CUDA device")
    if not args.dry_run and problem:
        write_outputs(out, environment, [])
        print(
            f"gpu_check: this machine is not ready for the GPU run: {problem}; accepted: an "
            "NVIDIA GPU with the packages --install or --wheels puts in, or --dry-run",
            file=sys.stderr,
        )
        return 2
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    results = _run_lines(names, work, out, args, environment)
    return 0 if all(result["status"] == "pass" for result in results) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for gpu_check.json and .md (default: $OUT)")
    parser.add_argument("--lines", help="comma-separated line names (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="every step a CPU can run")
    parser.add_argument("--install", action="store_true", help="install from the index first")
    parser.add_argument("--wheels", nargs="+", help="install these folders' wheels first")
    parser.add_argument(
        "--download-wheels", metavar="PREFIX", help="fetch the GPU machine's wheels and stop"
    )
    parser.add_argument("--budget-s", type=float, default=390, help="seconds for all lines")
    parser.add_argument("--line-s", type=float, default=90, help="seconds for one line")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens compared")
    parser.add_argument(
        "--jobs",
        type=int,
        default=_default_jobs(),
        help="lines at once; their device steps take turns (default: a line per 4 cores, <= 3)",
    )
    parser.add_argument("--work", help="scratch folder (default: a new temporary one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def _default_jobs() -> int:
    """Lines side by side: one per 4 cores, at most 3 (packaging is what overlaps: the device
    steps take turns); a 2-core machine runs one at a time."""
    return max(1, min(3, (os.cpu_count() or 1) // 4))


_PROBE = """
import json
info = {}
try:
    import torch
    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    import onnxruntime
    info["ort_providers"] = onnxruntime.get_available_providers()
    import onnxruntime_genai, transformers, mobius_genai, tests._hf  # what every line imports
except Exception as error:
    info["error"] = f"{type(error).__name__}: {error}"
print(json.dumps(info))
"""


def _download(prefix: Path) -> int:
    """Fetch the wheels for a GPU machine without an index, and say how to carry them."""
    folders = download_wheels(prefix.resolve())
    names = [os.path.relpath(folder) for folder in folders]
    for name in names[:-1]:
        print(f"call: carry [{name!r}], command: ls {name}")
    wheels = " ".join(names)
    print(
        f"call: carry [{names[-1]!r}], command: python3 benchmarks/gpu_check.py "
        f"--wheels {wheels} --out $OUT"
    )
    return 0


def _environment(dry_run: bool) -> dict[str, Any]:
    """Versions of what the run uses and, unless a dry run, what torch and onnxruntime see."""
    names = ("torch", "transformers", "onnxruntime", "onnxruntime-gpu")
    names += ("onnxruntime-genai", "onnxruntime-genai-cuda", "onnx-ir", "onnxscript")
    environment: dict[str, Any] = {
        "python": sys.version.split()[0],
        "versions": {name: installed_version(name) for name in names if installed_version(name)},
        "dry_run": dry_run,
    }
    if dry_run:
        return environment
    probe = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE], capture_output=True, text=True, check=False
    )
    try:
        environment.update(json.loads(probe.stdout))
    except ValueError:
        environment["error"] = (probe.stderr.strip().splitlines() or ["no answer"])[-1]
    return environment


@dataclasses.dataclass
class _Child:
    """A line's process, running in a session of its own."""

    name: str
    process: subprocess.Popen
    started: float
    timeout: float
    killed: bool = False


def _run_lines(
    names: list[str], work: Path, out: Path, args: argparse.Namespace, environment: dict
) -> list[dict[str, Any]]:
    """Up to `args.jobs` lines at once (each line's device steps wait for the device: _gpu_run's
    `device_turn`), each within `--line-s` and all within `--budget-s`; the results in the
    order of `names`, written out as each line ends."""
    results: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + args.budget_s
    waiting, running = list(names), []
    while waiting or running:
        while waiting and len(running) < args.jobs:
            name = waiting.pop(0)
            left = deadline - time.monotonic()
            if left < MIN_LINE_S:
                results[name] = {"line": name, "status": "skipped", "note": "time budget spent"}
                write_outputs(out, environment, [results[n] for n in names if n in results])
            else:
                running.append(_start_child(name, work, args, min(args.line_s, left)))
        time.sleep(POLL_S)
        for child in [child for child in running if _ended(child)]:
            running.remove(child)
            result = _result(child, work)
            result["seconds"] = round(time.monotonic() - child.started, 1)
            result["status"] = verdict(result)
            results[child.name] = result
            print(f"{child.name}: {result['status']} ({result['seconds']} s)", flush=True)
            write_outputs(out, environment, [results[n] for n in names if n in results])
    return [results[name] for name in names]


def _start_child(name: str, work: Path, args: argparse.Namespace, timeout: float) -> _Child:
    """One line in an isolated process of its own session (so it can be killed with
    everything it started), its output in `work`/NAME.log."""
    command = [sys.executable, "-I", str(Path(__file__).resolve()), "--child", name]
    command += ["--work", str(work), "--new-tokens", str(args.new_tokens)]
    if args.dry_run:
        command.append("--dry-run")
    (work / f"{name}.json").unlink(missing_ok=True)
    with (work / f"{name}.log").open("wb") as stream:
        process = subprocess.Popen(
            command, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True
        )
    return _Child(name, process, time.monotonic(), timeout)


def _ended(child: _Child) -> bool:
    """Whether the line's process has ended, killing it (and all it started) past its time."""
    if child.process.poll() is not None:
        return True
    if time.monotonic() - child.started < child.timeout:
        return False
    os.killpg(child.process.pid, signal.SIGKILL)
    child.process.wait()
    child.killed = True
    return True


def _result(child: _Child, work: Path) -> dict[str, Any]:
    record = work / f"{child.name}.json"
    if record.is_file():
        return json.loads(record.read_text())
    tail = (work / f"{child.name}.log").read_text(errors="replace")[-LOG_TAIL:]
    why = f"the process ended ({child.process.returncode})"
    if child.killed:
        why = f"no result within {child.timeout:.0f} s"
    return {"line": child.name, "error": why, "log_tail": tail}


def _child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    if not args.dry_run:
        import onnxruntime
        import torch  # noqa: F401  (its CUDA libraries, loaded first, serve onnxruntime too)

        try:  # CUDA and cuDNN from the nvidia wheels; torch has loaded most of them already
            onnxruntime.preload_dlls()
        except Exception as error:
            print(f"onnxruntime.preload_dlls: {error}", file=sys.stderr)
    from _gpu_lines import LINES
    from _gpu_run import run_line

    work = Path(args.work)
    result = run_line(
        LINES[args.child], work / args.child, dry_run=args.dry_run, new_tokens=args.new_tokens
    )
    (work / f"{args.child}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
