"""Load time of a cpu int4 bundle with Gemma 4 26B-A4B's expert counts: the shipped body (a
MatMulNBits per expert, the cpu entry's "MatMulNBits.experts" row) against QMoE's Loop body
(the same EP with that row off).

A tiny random gemma4_text checkpoint (tests/_hf.py's MoE layout) with 30 layers of 128 experts,
8 per token, and a tiny hidden size: the node count, not the weights, is what loads slowly.
Each bundle is packaged once under benchmarks/_work/moe_load/, then loaded in a `python -I`
process of its own: an onnxruntime session of model.onnx, then og.Model (wall seconds each),
and the graph's node count (subgraphs included).

    python benchmarks/moe_load.py [--layers 30] [--experts 128]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "_work" / "moe_load"

_LOAD = """
import sys, time
import onnx, onnxruntime as ort, onnxruntime_genai as og
folder = sys.argv[1]
started = time.perf_counter()
ort.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
session = time.perf_counter() - started
started = time.perf_counter()
og.Model(folder)
model = time.perf_counter() - started
def count(graph):
    return sum(1 + sum(count(a.g) for a in n.attribute if a.g.node) for n in graph.node)
nodes = count(onnx.load(folder + "/model.onnx", load_external_data=False).graph)
print(f"{session:.2f} {model:.2f} {nodes}")
"""


def _bundles(layers: int, experts: int) -> dict[str, Path]:
    """The checkpoint and both bundles (packaged unless already there)."""
    sys.path.insert(0, str(ROOT))
    from mobius_genai import packager
    from mobius_genai.ep import get_ep
    from mobius_genai.quantize import Int4Options
    from tests._hf import GEMMA4_MOE
    from tests.models.families.test_bundles import _checkpoint

    work = WORK / f"{layers}x{experts}"
    ckpt = work / "ckpt"
    if not ckpt.exists():
        layout = {"num_experts": experts, "top_k_experts": 8, "num_hidden_layers": layers}
        types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"]
        layout["layer_types"] = types[:layers]
        _checkpoint(ckpt, "gemma4_text", **{**GEMMA4_MOE, **layout})
    cpu = get_ep("cpu")
    eps = {"per-expert": cpu, "loop": cpu.with_kernels({"MatMulNBits.experts": False})}
    bundles = {}
    for name, caps in eps.items():
        bundles[name] = work / name
        if not bundles[name].exists():
            options = Int4Options(block_size=16)
            packager.package(ckpt, caps, bundles[name], precision="int4", int4=options, quiet=True)
    return bundles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--experts", type=int, default=128)
    args = parser.parse_args()
    print(f"{'':12} {'session':>9} {'og.Model':>9} {'nodes':>7}")
    for name, folder in _bundles(args.layers, args.experts).items():
        line = subprocess.run(
            [sys.executable, "-I", "-c", _LOAD, str(folder)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        session, model, nodes = float(line[0]), float(line[1]), int(line[2])
        print(f"{name:12} {session:8.2f}s {model:8.2f}s {nodes:7d}")


if __name__ == "__main__":
    main()
