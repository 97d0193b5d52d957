"""Scale (issues 8 and 13): a 7B-shaped bf16 checkpoint packaged, and a 70B graph-only build.

1. Generates a checkpoint in the real Qwen2.5-7B shapes (random bf16 weights, ~15 GB; needs
   ~35 GB free disk for it and the largest bundle), then measures the README's commands on it,
   `mobius-genai package CKPT --ep cpu --precision int4` and `mobius-genai package CKPT --ep
   cuda` (float16, on this CPU-only machine), with the default smoke test, and the latter with
   `--no-smoke-test`, and `--ep cuda --precision int4` (a float16 graph: the default int4
   recipe calibrates it in float32 on the CPU): wall time, peak RSS of the process tree, of `package`'s own process and
   of its smoke test process, the bundle's size and which smoke test ran (the manifest's
   record). Target: peak RSS of the tree <= 4 GiB: weights are read, converted (or quantized)
   and written tensor by tensor, and the smoke test runs a twin with fewer layers when the
   whole bundle would need more memory than `package` allows itself.
2. Builds the graph of a Llama-3-70B config without weights (`build(..., load_weights=False)`):
   target "seconds".
3. With `--shape qwen3-30b-a3b` (issue 15) instead: checkpoints in Qwen3-30B-A3B's real shapes
   (make_moe_shape.py; bf16, ~1.2 GiB per layer) with each of `--layers` layer counts (the full
   48 fit this machine's disk only sparse, below), each packaged to cpu int4 with
   the default smoke test and measured as above, one after the other: the peak must not grow
   with the layers, since experts are quantized and written one at a time. `--sparse-experts N`
   draws only N experts per layer and leaves the rest zeros in file holes (make_moe_shape.py), so
   the full 48 layers fit (~0.2 GiB of disk per layer for N=16, plus the bundle's ~0.4).

Each bundle is deleted after its row, and the checkpoint too unless --keep-checkpoint.

    python benchmarks/scale_7b_int4.py [--keep-checkpoint] [--skip-7b] [--rows cuda-int4]
    python benchmarks/scale_7b_int4.py --shape qwen3-30b-a3b --layers 6,12
    python benchmarks/scale_7b_int4.py --shape qwen3-30b-a3b --layers 48 --sparse-experts 16
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import make_moe_shape as moe_shape
from _measure import folder_mib, run_measured
from graph_only import CONFIGS
from make_qwen25_05b_shape import DEFAULT_FOLDERS, WORK, make_checkpoint

MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
TARGET_RSS_MIB = 4 * 1024
FREE_DISK_NEEDED = 35 * 2**30
MOE_SHAPE = "qwen3-30b-a3b"
#: Disk for the MoE checkpoint (bf16: ~1.2 GiB a layer, 1.2 GiB of embedding and LM head) and
#: its int4 bundle, with room to spare.
MOE_DISK_PER_LAYER, MOE_DISK_BASE = 1.7 * 2**30, 6 * 2**30
#: The same with sparse experts: each drawn expert 9 MiB, the layer's other tensors ~38 MiB, the
#: bundle's ~0.37 GiB a layer; 8 GB left free for others' work.
MOE_EXPERT_DISK, MOE_SPARSE_LAYER_DISK, MOE_SPARSE_BASE = 9.5 * 2**20, 0.45 * 2**30, 12 * 2**30
#: (EP, precision, extra package arguments) of each 7B row.
SEVEN_B_ROWS = (
    ("cpu", "int4", ()),
    ("cuda", "fp16", ()),
    ("cuda", "fp16", ("--no-smoke-test",)),
    ("cuda", "int4", ()),
)


_GRAPH_ONLY = (
    "import sys, time; started = time.perf_counter(); import mobius_genai; "
    "mobius_genai.build(sys.argv[1], 'cpu', 'f32', load_weights=False); "
    "print(f'{time.perf_counter() - started:.2f}')"
)


def _header() -> None:
    print(
        "| command | wall (s) | peak RSS, tree (MiB) | package process (MiB) | smoke test "
        "process (MiB) | bundle (MiB) | smoke test | target met |"
    )
    print("|---|--:|--:|--:|--:|--:|---|:-:|")


def measure_row(checkpoint: Path, label: str, ep: str, precision: str, extra=()) -> None:
    """Run `mobius-genai package` on `checkpoint`, print its table row, delete the bundle."""
    out = WORK / f"ours-{checkpoint.name}-{ep}-{precision}"
    command = [MOBIUS, "package", str(checkpoint), "--ep", ep, "--precision", precision]
    command += ["-o", str(out), "--force", *extra]
    measured = run_measured(command, cwd=WORK, interval_s=0.05)
    if measured.returncode != 0:
        sys.exit(f"package failed ({measured.returncode}):\n{measured.output[-4000:]}")
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    met = "yes" if measured.peak_rss_mib <= TARGET_RSS_MIB else "NO"
    shown = " ".join([f"package {label}", "--ep", ep, "--precision", precision, *extra])
    print(
        f"| `{shown}` | {measured.wall_s:.0f} | {measured.peak_rss_mib:,.0f} | "
        f"{measured.command_peak_mib:,.0f} | {measured.descendant_peak_mib:,.0f} | "
        f"{folder_mib(out):,.0f} | {_smoke_test(manifest)} | {met} |",
        flush=True,
    )
    shutil.rmtree(out)


def _need_disk(needed: float, what: str) -> None:
    free = shutil.disk_usage(WORK).free
    if free < needed:
        sys.exit(f"{what} needs {needed / 2**30:.0f} GB free in {WORK}, has {free / 2**30:.0f}")


def seven_b(keep_checkpoint: bool, quality: str | None, rows: set[str] | None) -> None:
    folder = DEFAULT_FOLDERS["7b"]
    WORK.mkdir(parents=True, exist_ok=True)
    if not (folder / "stamp.json").is_file():
        _need_disk(FREE_DISK_NEEDED, "the 7B-shaped checkpoint")
        print("generating the 7B-shaped checkpoint (~15 GB) ...", flush=True)
    checkpoint = make_checkpoint("7b")
    print(f"checkpoint {folder_mib(checkpoint):,.0f} MiB; target: tree peak <= {TARGET_RSS_MIB:,}")
    _header()
    for ep, precision, extra in SEVEN_B_ROWS:
        if rows is not None and f"{ep}-{precision}" not in rows:
            continue
        if quality and precision == "int4":
            extra = (*extra, "--int4-quality", quality)
        measure_row(checkpoint, "7B", ep, precision, extra)
    if not keep_checkpoint:
        shutil.rmtree(checkpoint)


def _moe_disk(layers: int, sparse_experts: int | None) -> float:
    if sparse_experts is None:
        return MOE_DISK_PER_LAYER * layers + MOE_DISK_BASE
    per_layer = MOE_SPARSE_LAYER_DISK + MOE_EXPERT_DISK * sparse_experts
    return per_layer * layers + MOE_SPARSE_BASE


def moe_30b(layer_counts: list[int], keep_checkpoint: bool, sparse_experts: int | None) -> None:
    """Qwen3-30B-A3B's shapes with each of `layer_counts` layers, to cpu int4, one at a time."""
    WORK.mkdir(parents=True, exist_ok=True)
    full = moe_shape.FULL_LAYERS[MOE_SHAPE]
    print(f"target: tree peak <= {TARGET_RSS_MIB:,} MiB")
    _header()
    for layers in layer_counts:
        if not moe_shape.folder_for(MOE_SHAPE, layers, sparse_experts).is_dir():
            _need_disk(_moe_disk(layers, sparse_experts), f"{layers} layers")
        checkpoint = moe_shape.make_checkpoint(MOE_SHAPE, layers, sparse_experts=sparse_experts)
        sparse = "" if sparse_experts is None else f", {sparse_experts} of 128 experts drawn"
        label = (
            f"Qwen3-30B-A3B shape, {layers} of {full} layers{sparse} "
            f"({folder_mib(checkpoint):,.0f} MiB)"
        )
        measure_row(checkpoint, label, "cpu", "int4")
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
    parser.add_argument(
        "--shape",
        choices=("qwen2.5-7b", MOE_SHAPE),
        default="qwen2.5-7b",
        help=f"{MOE_SHAPE}: the MoE rows instead of the 7B and 70B ones",
    )
    parser.add_argument(
        "--layers", default="6,12", help=f"layer counts of the {MOE_SHAPE} checkpoints"
    )
    parser.add_argument(
        "--sparse-experts",
        type=int,
        default=None,
        metavar="N",
        help=f"{MOE_SHAPE}: draw N experts per layer, the rest zeros in file holes",
    )
    parser.add_argument(
        "--int4-quality", default=None, help="the 7B int4 rows' recipe (default: package's)"
    )
    parser.add_argument(
        "--rows",
        default=None,
        help="the 7B rows to measure, EP-precision comma-separated (e.g. cpu-int4,cuda-int4; "
        "default: all)",
    )
    args = parser.parse_args()
    if args.shape == MOE_SHAPE:
        layers = [int(n) for n in args.layers.split(",")]
        moe_30b(layers, args.keep_checkpoint, args.sparse_experts)
        return
    seventy_b()
    if not args.skip_7b:
        rows = None if args.rows is None else set(args.rows.split(","))
        seven_b(args.keep_checkpoint, args.int4_quality, rows)


if __name__ == "__main__":
    main()
