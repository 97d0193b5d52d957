"""Scale (issue 8): a 7B-shaped bf16 checkpoint packaged to int4, and a 70B graph-only build.

1. Generates a checkpoint in the real Qwen2.5-7B shapes (random bf16 weights, ~15 GB; needs
   ~25 GB free disk for it and the bundle), then measures `mobius-genai package CKPT --ep cpu
   --precision int4 --no-smoke-test`: wall time and peak RSS of the process tree (target: peak
   RSS <= 3 GB: weights read, quantized and written tensor by tensor). The smoke test is left
   out: running a 4 GB+ int4 model needs more memory than the target allows by itself.
2. Builds the graph of a Llama-3-70B config without weights (`build(..., load_weights=False)`):
   target "seconds".

The bundle is deleted afterwards, and the checkpoint too unless --keep-checkpoint.

    python benchmarks/scale_7b_int4.py [--keep-checkpoint] [--skip-7b]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from _measure import folder_mib, run_measured
from graph_only import CONFIGS
from make_qwen25_05b_shape import DEFAULT_FOLDERS, WORK, make_checkpoint

MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
TARGET_RSS_MIB = 3 * 1024
FREE_DISK_NEEDED = 25 * 2**30


_GRAPH_ONLY = (
    "import sys, time; started = time.perf_counter(); import mobius_genai; "
    "mobius_genai.build(sys.argv[1], 'cpu', 'f32', load_weights=False); "
    "print(f'{time.perf_counter() - started:.2f}')"
)


def seven_b(keep_checkpoint: bool) -> None:
    folder = DEFAULT_FOLDERS["7b"]
    WORK.mkdir(parents=True, exist_ok=True)
    if not (folder / "stamp.json").is_file():
        free = shutil.disk_usage(WORK).free
        if free < FREE_DISK_NEEDED:
            sys.exit(
                f"needs {FREE_DISK_NEEDED / 2**30:.0f} GB free in {WORK}, has {free / 2**30:.0f}"
            )
        print("generating the 7B-shaped checkpoint (~15 GB) ...", flush=True)
    checkpoint = make_checkpoint("7b")
    out = WORK / "ours-7b-int4"
    command = [MOBIUS, "package", str(checkpoint), "--ep", "cpu", "--precision", "int4"]
    command += ["-o", str(out), "--force", "--quiet", "--no-smoke-test"]
    print(f"packaging: {' '.join(command[1:])}", flush=True)
    measured = run_measured(command, cwd=WORK, interval_s=0.05)
    if measured.returncode != 0:
        sys.exit(f"package failed ({measured.returncode}):\n{measured.output[-4000:]}")
    size = folder_mib(out)
    met = "yes" if measured.peak_rss_mib <= TARGET_RSS_MIB else "NO"
    print(
        f"7B int4: {measured.wall_s:.1f} s, peak RSS {measured.peak_rss_mib:,.0f} MiB "
        f"(target <= {TARGET_RSS_MIB:,} MiB: {met}), checkpoint "
        f"{folder_mib(checkpoint):,.0f} MiB, bundle {size:,.0f} MiB"
    )
    shutil.rmtree(out)
    if not keep_checkpoint:
        shutil.rmtree(checkpoint)


def seventy_b() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(CONFIGS["Llama-3-70B"]))
        measured = run_measured([sys.executable, "-c", _GRAPH_ONLY, tmp])
    if measured.returncode != 0:
        sys.exit(f"graph-only build failed:\n{measured.output[-4000:]}")
    build_s = float(measured.output.strip().splitlines()[-1])
    print(
        f"70B graph only (Llama-3-70B config, cpu, no weights): {build_s:.1f} s including "
        f"import ({measured.wall_s:.1f} s process), peak RSS {measured.peak_rss_mib:,.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-checkpoint", action="store_true")
    parser.add_argument("--skip-7b", action="store_true", help="only the 70B graph-only build")
    args = parser.parse_args()
    seventy_b()
    if not args.skip_7b:
        seven_b(args.keep_checkpoint)


if __name__ == "__main__":
    main()
