"""Scale (issues 8 and 13): a 7B-shaped bf16 checkpoint packaged, and a 70B graph-only build.

1. Generates a checkpoint in the real Qwen2.5-7B shapes (random bf16 weights, ~15 GB; needs
   ~35 GB free disk for it and the largest bundle), then measures the README's commands on it,
   `mobius-genai package CKPT --ep cpu --precision int4` and `mobius-genai package CKPT --ep
   cuda` (float16, on this CPU-only machine), with the default smoke test, and the latter with
   `--no-smoke-test`: wall time, peak RSS of the process tree, of `package`'s own process and
   of its smoke test process, the bundle's size and which smoke test ran (the manifest's
   record). Target: peak RSS of the tree <= 4 GiB: weights are read, converted (or quantized)
   and written tensor by tensor, and the smoke test runs a twin with fewer layers when the
   whole bundle would need more memory than `package` allows itself.
2. Builds the graph of a Llama-3-70B config without weights (`build(..., load_weights=False)`):
   target "seconds".

Each bundle is deleted after its row, and the checkpoint too unless --keep-checkpoint.

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
TARGET_RSS_MIB = 4 * 1024
FREE_DISK_NEEDED = 35 * 2**30
#: (EP, precision, extra package arguments) of each 7B row.
SEVEN_B_ROWS = (
    ("cpu", "int4", ()),
    ("cuda", "fp16", ()),
    ("cuda", "fp16", ("--no-smoke-test",)),
)


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
    print(f"checkpoint {folder_mib(checkpoint):,.0f} MiB; target: tree peak <= {TARGET_RSS_MIB:,}")
    print(
        "| command | wall (s) | peak RSS, tree (MiB) | package process (MiB) | smoke test "
        "process (MiB) | bundle (MiB) | smoke test | target met |"
    )
    print("|---|--:|--:|--:|--:|--:|---|:-:|")
    for ep, precision, extra in SEVEN_B_ROWS:
        out = WORK / f"ours-7b-{ep}-{precision}"
        command = [MOBIUS, "package", str(checkpoint), "--ep", ep, "--precision", precision]
        command += ["-o", str(out), "--force", *extra]
        measured = run_measured(command, cwd=WORK, interval_s=0.05)
        if measured.returncode != 0:
            sys.exit(f"package failed ({measured.returncode}):\n{measured.output[-4000:]}")
        manifest = json.loads((out / "mobius_manifest.json").read_text())
        met = "yes" if measured.peak_rss_mib <= TARGET_RSS_MIB else "NO"
        shown = " ".join(["package 7B", "--ep", ep, "--precision", precision, *extra])
        print(
            f"| `{shown}` | {measured.wall_s:.0f} | {measured.peak_rss_mib:,.0f} | "
            f"{measured.command_peak_mib:,.0f} | {measured.descendant_peak_mib:,.0f} | "
            f"{folder_mib(out):,.0f} | {_smoke_test(manifest)} | {met} |",
            flush=True,
        )
        shutil.rmtree(out)
    if not keep_checkpoint:
        shutil.rmtree(checkpoint)


def _smoke_test(manifest: dict) -> str:
    record = manifest["build"].get("smoke_test")
    if record is None:
        return "none"
    scope = (
        "whole"
        if record["layers"] == record["of"]
        else f"twin, {record['layers']} of {record['of']} layers"
    )
    return f"{scope}, {'ran' if record['ran'] else 'skipped'}"


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
