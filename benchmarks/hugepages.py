"""CPU speed of bundles with glibc's allocations in transparent huge pages, against without.

At one token a decode step reads every weight once, and onnxruntime keeps the CPU weights it
prepacks (MatMul, MatMulNBits) in memory from malloc. With 4 KiB pages, streaming hundreds of
MiB per token walks the page tables every 4 KiB and stops the hardware prefetcher at each page
boundary. Where the kernel's transparent huge pages are in `madvise` mode (see
/sys/kernel/mm/transparent_hugepage/enabled), glibc (2.35 and later) asks for 2 MiB pages when
started with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`; nothing in a bundle can ask for them.

For each bundle, prefill and decode tokens/s with onnxruntime-genai (`_og_speed.py`: one
intra-op thread, a 256-token prompt, 64 new tokens) in `--processes` processes per setting, the
two settings taking turns; prints medians, the ratio with / without, and how much memory each
setting's processes held in huge pages.

    python benchmarks/hugepages.py BUNDLE [BUNDLE ...] [--processes 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TUNABLE = "glibc.malloc.hugetlb=1"
SETTINGS = {"4 KiB pages": None, "huge pages": TUNABLE}


def _environment(tunable: str | None) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunable:
        environment["GLIBC_TUNABLES"] = tunable
    return environment


def measure(bundle: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Pooled rounds per setting: tokens/s lists and the huge-page MiB of each process."""
    pooled: dict[str, dict[str, list[float]]] = {name: {} for name in SETTINGS}
    for index in range(args.processes):
        names = list(SETTINGS) if index % 2 == 0 else list(reversed(SETTINGS))
        for name in names:
            command = [sys.executable, str(HERE / "_og_speed.py"), bundle]
            command += ["--prompt", str(args.prompt), "--new", str(args.new)]
            command += ["--rounds", str(args.rounds)]
            done = subprocess.run(
                command, capture_output=True, text=True, env=_environment(SETTINGS[name])
            )
            if done.returncode != 0:
                sys.exit(f"speed run failed:\n{done.stderr[-4000:]}")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            for key, values in report["results"][bundle].items():
                pooled[name].setdefault(key, []).extend(values)
            pooled[name].setdefault("anon_huge_mib", []).append(report["anon_huge_mib"] or 0.0)
    return pooled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--processes", type=int, default=4, help="per bundle and setting")
    parser.add_argument("--rounds", type=int, default=3, help="generations per process")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as stream:
            print(f"transparent_hugepage/enabled: {stream.read().strip()}")
    except OSError:
        sys.exit(
            "no /sys/kernel/mm/transparent_hugepage: transparent huge pages are a Linux feature"
        )
    print("| bundle | metric | 4 KiB pages | huge pages | ratio |")
    print("|---|---|--:|--:|--:|")
    for bundle in args.bundles:
        pooled = measure(bundle, args)
        for metric in ("prefill", "decode", "prefill_cpu", "decode_cpu", "anon_huge_mib"):
            small, huge = (statistics.median(pooled[name][metric]) for name in SETTINGS)
            ratio = f"{huge / small:.2f}" if metric != "anon_huge_mib" else ""
            label = metric.replace("_cpu", " (CPU time)")
            label = (
                "memory in huge pages (MiB)" if metric == "anon_huge_mib" else label + " tokens/s"
            )
            print(f"| {bundle} | {label} | {small:,.1f} | {huge:,.1f} | {ratio} |")


if __name__ == "__main__":
    main()
