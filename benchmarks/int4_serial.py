"""The serial part of the default cpu int4 package (issue 29): `package`'s own process's CPU
time against its search workers', the two measured apart with getrusage after the pool closes.

The workers' share shrinks with cores; the calling process's does not, so on a many-core
machine its CPU time is the package's wall time. Each run is a fresh `python -I` process that
runs `mobius-genai package` of the Qwen2.5-0.5B shape (`make_qwen25_05b_shape.py`) to cpu int4
(default recipe, `--no-smoke-test`), closes the worker pool, and reports RUSAGE_SELF
(the calling process: imports, build, calibration, reading, writing) and RUSAGE_CHILDREN (the
workers). `--profile FILE` writes a cProfile of the calling process in CPU time (ours, first round).

    python benchmarks/int4_serial.py --rounds 2 --baseline /work/main/.venv/bin/python

`--baseline` runs another checkout's environment (e.g. main's) in the same turns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "int4_serial"
CHECKPOINT = HERE / "_work" / "qwen2.5-0.5b-shape"

#: Run in the measured process: the package, the pool closed, then the two rusages.
_CHILD = """
import cProfile, json, resource, sys, time
profile = sys.argv[1]
start = time.perf_counter()
argv = sys.argv[2:]
from mobius_genai.cli import main
profiler = cProfile.Profile(time.process_time) if profile else None
if profiler:
    profiler.enable()
code = main(argv)
from mobius_genai.quantize import search_pool
search_pool._close_pool()
if profiler:
    profiler.disable()
    profiler.dump_stats(profile)
wall = time.perf_counter() - start
own, workers = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"code": code, "wall": wall, "own": own.ru_utime + own.ru_stime,
    "workers": workers.ru_utime + workers.ru_stime, "own_peak_mib": own.ru_maxrss / 1024}))
"""


def _run(python: str, folder: str, profile: str, extra: list[str]) -> dict:
    out = WORK / folder
    shutil.rmtree(out, True)
    package = ["package", str(CHECKPOINT), "--ep", "cpu", "--precision", "int4", "-o", str(out)]
    package += ["--force", "--quiet", "--no-smoke-test", *extra]
    done = subprocess.run(
        [python, "-I", "-c", _CHILD, profile, *package], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{python} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", help="the python of another checkout's environment")
    parser.add_argument("--profile", default="", help="write a cProfile of ours here")
    parser.add_argument("extra", nargs="*", help="more `package` arguments (after --)")
    args = parser.parse_args()
    if not (CHECKPOINT / "config.json").is_file():
        sys.exit("run benchmarks/make_qwen25_05b_shape.py first")
    WORK.mkdir(parents=True, exist_ok=True)
    pythons = {"ours": sys.executable}
    if args.baseline:
        pythons["baseline"] = args.baseline
    results: dict[str, list[dict]] = {}
    for index in range(args.rounds):
        names = list(pythons) if index % 2 == 0 else list(reversed(pythons))
        for name in names:
            load = os.getloadavg()[0]
            profile = args.profile if name == "ours" and index == 0 else ""
            measured = _run(pythons[name], name, profile, args.extra)
            results.setdefault(name, []).append(measured)
            print(
                f"round {index + 1} {name}: calling process {measured['own']:.1f} s CPU, "
                f"workers {measured['workers']:.1f} s, wall {measured['wall']:.1f} s, "
                f"own peak {measured['own_peak_mib']:.0f} MiB (load average {load:.1f})",
                flush=True,
            )
    print("\n| metric | " + " | ".join(results) + " |")
    print("|---" + "|--:" * len(results) + "|")
    for key, label in (
        ("own", "calling process CPU (s)"),
        ("workers", "workers CPU (s)"),
        ("wall", "wall (s)"),
        ("own_peak_mib", "calling process peak RSS (MiB)"),
    ):
        cells = [f"{statistics.median(r[key] for r in runs):.1f}" for runs in results.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
