"""Packaging the Qwen2.5-0.5B shape to cpu int4 with the default recipe against onnxruntime-genai's
builder (issue 29): wall time, CPU time (user + system of the whole process tree) and peak RSS
of the tree, the two commands taking turns, with the load average before each round.

On a shared machine the wall time moves with the load; the CPU time much less, so both are
printed, with their medians and ratios. The commands (as `compare_builder.py`'s int4 rows):

    mobius-genai package CKPT --ep cpu --precision int4 -o OUT --force --quiet --no-smoke-test
    python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p int4 -e cpu -c CACHE

    python benchmarks/make_qwen25_05b_shape.py && python benchmarks/int4_build_cpu.py [--rounds 3]

`--baseline /path/to/other/.venv/bin/python` runs that environment's `mobius-genai package`
(another checkout, e.g. main before a change) in the same turns, so that a change is measured
against the code before it under the same load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from _measure import run_measured
from compare_builder import builder_command

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "int4_build_cpu"
CHECKPOINT = HERE / "_work" / "qwen2.5-0.5b-shape"
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))


def _commands(extra: list[str], baseline: str | None) -> dict[str, list[str]]:
    commands = {"mobius-genai": _ours(MOBIUS, "ours", extra)}
    if baseline is not None:  # another checkout's installed mobius-genai, e.g. main's
        commands["baseline"] = _ours(str(Path(baseline).with_name("mobius-genai")), "base", extra)
    return commands | {"builder": builder_command(CHECKPOINT, WORK / "builder", "int4")}


def _ours(executable: str, folder: str, extra: list[str]) -> list[str]:
    ours = [executable, "package", str(CHECKPOINT), "--ep", "cpu", "--precision", "int4"]
    return [*ours, "-o", str(WORK / folder), "--force", "--quiet", "--no-smoke-test", *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline",
        help="the python of another checkout's environment: its `package` takes turns too",
    )
    parser.add_argument("extra", nargs="*", help="more `package` arguments (after --)")
    args = parser.parse_args()
    if not (CHECKPOINT / "config.json").is_file():
        sys.exit("run benchmarks/make_qwen25_05b_shape.py first")
    WORK.mkdir(parents=True, exist_ok=True)
    commands = _commands(args.extra, args.baseline)
    results: dict[str, list] = {}
    for index in range(args.rounds):
        names = list(commands)
        for name in names if index % 2 == 0 else reversed(names):
            shutil.rmtree(WORK / Path(commands[name][commands[name].index("-o") + 1]).name, True)
            load = os.getloadavg()[0]
            measured = run_measured(commands[name])
            if measured.returncode != 0:
                sys.exit(f"{name} failed:\n{measured.output[-3000:]}")
            results.setdefault(name, []).append(measured)
            print(
                f"round {index + 1} {name}: wall {measured.wall_s:.1f} s, CPU {measured.cpu_s:.1f}"
                f" s, peak RSS {measured.peak_rss_mib:.0f} MiB (load average {load:.1f})",
                flush=True,
            )
    print(
        "\n| metric | "
        + " | ".join(results)
        + " | "
        + " | ".join(f"{name} / builder" for name in results if name != "builder")
        + " |"
    )
    print("|---" + "|--:" * (2 * len(results) - 1) + "|")
    for metric, unit in (
        ("wall_s", "wall time (s)"),
        ("cpu_s", "CPU time (s)"),
        ("peak_rss_mib", "peak RSS, tree (MiB)"),
    ):
        medians = {k: statistics.median(getattr(m, metric) for m in v) for k, v in results.items()}
        ratios = [medians[k] / medians["builder"] for k in medians if k != "builder"]
        cells = [f"{value:.1f}" for value in medians.values()] + [f"{r:.2f}" for r in ratios]
        print(f"| {unit} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
