"""Qwen2.5-VL's vision graph on CPU: PackedMultiHeadAttention's standard body against the
block-diagonal bias it replaced.

The checkpoint: random weights in the real Qwen2.5-VL vision shapes (hidden 1280, 16 heads,
intermediate 3420, patches of 14, windows of 112 pixels, merge 2) with `--blocks` blocks
(default 4), the last one attending to the whole frame as every 8th block of the real tower
does, and a one-layer text model (not measured). Written once under benchmarks/_work/.

The vision graph is built for cuda in fp32 (its com.microsoft::PackedMultiHeadAttention nodes
kept), then expanded two ways: with the op's standard body (components/attention_bodies.py:
the windows padded, at most 1024 queries per Attention), what every EP without the kernel
runs; and with the spec's expansion, the form every EP ran before: a [patches, patches]
block-diagonal bias from cumulative_sequence_length and one standard Attention over all
patches. Each graph runs in a process of its own on a square image of each `--sides` pixels
(random patches): wall time of the `run` call (one thread pool, onnxruntime's defaults) and
the process's peak RSS; the two outputs must agree.

    python benchmarks/vision_attention.py [--sides 504,1008] [--blocks 4]

Memory: the block-diagonal graph needs ~heads x patches² x 4 bytes per block (1.7 GB at
1008 x 1008, 6.4 GB at 1400 x 1400); choose `--sides` for the machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

PATCH = 14
VISION = {
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": PATCH,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 64,
}
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 160,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
}
PACKED = ("com.microsoft", "PackedMultiHeadAttention", "")


def make_checkpoint(blocks: int) -> Path:
    """The vision-shaped checkpoint (cached while its stamp matches)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    folder = WORK / f"qwen25vl-vision-{blocks}b"
    stamp = {**VISION, "depth": blocks, "version": 1}
    stamp_file = folder / "stamp.json"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    vision = {**VISION, "depth": blocks, "fullatt_block_indexes": [blocks - 1]}
    config = Qwen2_5_VLConfig(
        text_config=TEXT,
        vision_config=vision,
        image_token_id=150,
        video_token_id=151,
        vision_start_token_id=152,
        vision_end_token_id=153,
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    model.save_pretrained(folder)
    stamp_file.write_text(json.dumps(stamp))
    return folder


def _block_diagonal(tape, params):
    """The spec's expansion: a [1, 1, P, P] bias, 0 within a sequence, the float lowest
    elsewhere, and one standard Attention over all P tokens."""
    import onnx_ir as ir

    query, key, value, _bias, _offset, cumulative, _attention_bias = params

    def ints(*values):
        return tape.op("Constant", [], {"value_ints": list(values)})

    tokens = tape.op("Squeeze", [tape.op("Shape", [query], {"end": 1})])
    one, zero = (tape.op("Constant", [], {"value_int": v}) for v in (1, 0))
    positions = tape.op("Range", [zero, tokens, one])
    ends = tape.op("Cast", [tape.op("Slice", [cumulative, ints(1), ints(2**62)])], {"to": 7})
    after = tape.op("GreaterOrEqual", [tape.op("Unsqueeze", [positions, ints(1)]), ends])
    sequence = tape.op("ReduceSum", [tape.op("Cast", [after], {"to": 7}), ints(1)], {"keepdims": 0})
    same = tape.op(
        "Equal",
        [tape.op("Unsqueeze", [sequence, ints(1)]), tape.op("Unsqueeze", [sequence, ints(0)])],
    )
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    bias = tape.op(
        "Where",
        [
            same,
            tape.op("Constant", [], {"value": ir.tensor(np.array(0, np.float32))}),
            tape.op("Constant", [], {"value": ir.tensor(lowest)}),
        ],
    )
    heads = {
        name: ir.RefAttr(name, "num_heads", ir.AttributeType.INT)
        for name in ("q_num_heads", "kv_num_heads")
    }
    batch = ints(0)
    attended = tape.op(
        "Attention",
        [
            *(tape.op("Unsqueeze", [x, batch]) for x in (query, key, value)),
            tape.op("Unsqueeze", [bias, ints(0, 1)]),
        ],
        heads,
    )
    return [tape.op("Squeeze", [attended, batch])]


def build_graphs(checkpoint: Path) -> dict[str, Path]:
    """The vision graph with the op's body inlined, and with the block-diagonal expansion."""
    import dataclasses

    import onnx_ir as ir
    from onnx_ir.passes.common import InlinePass

    from mobius_genai.build import build
    from mobius_genai.components.tier1 import TIER1_OPS

    graphs = {}
    for label in ("block-diagonal", "packed body"):
        model = build(checkpoint, "cuda", "fp32", progress=False)["vision"]
        if label == "block-diagonal":
            spec = dataclasses.replace(TIER1_OPS[PACKED[1]], bodies={"": _block_diagonal})
            model.functions[PACKED] = spec.function("", model.opset_imports[""])
        InlinePass(criteria=lambda function: function.name == PACKED[1])(model)
        folder = WORK / f"vision-{label.replace(' ', '-')}"
        folder.mkdir(parents=True, exist_ok=True)
        ir.save(model, folder / "vision.onnx", external_data="vision.onnx.data")
        graphs[label] = folder / "vision.onnx"
    return graphs


def run_graph(path: str, side: int, out: str) -> None:
    """Child process: one run of the graph on a side x side image; prints the run's seconds."""
    import onnxruntime as ort

    grid = side // PATCH
    rng = np.random.default_rng(0)
    pixel_values = rng.standard_normal((grid * grid, 3 * 2 * PATCH * PATCH), np.float32)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {"pixel_values": pixel_values, "image_grid_thw": np.array([[1, grid, grid]])}
    started = time.perf_counter()
    features = session.run(None, feeds)[0]
    print(json.dumps({"run_s": time.perf_counter() - started}))
    np.save(out, features)


def main() -> None:
    from _measure import run_measured

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", default="504,1008")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--run", nargs=3, metavar=("GRAPH", "SIDE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_graph(args.run[0], int(args.run[1]), args.run[2])
        return
    graphs = build_graphs(make_checkpoint(args.blocks))
    print("| image | patches | graph | run s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for side in (int(s) for s in args.sides.split(",")):
        outputs = {}
        for label, graph in graphs.items():
            out = WORK / f"features-{label.replace(' ', '-')}-{side}.npy"
            command = [sys.executable, __file__, "--run", str(graph), str(side), str(out)]
            measured = run_measured(command)
            if measured.returncode:
                raise SystemExit(measured.output)
            seconds = json.loads(measured.output.strip().splitlines()[-1])["run_s"]
            outputs[label] = np.load(out)
            print(
                f"| {side}x{side} | {(side // PATCH) ** 2} | {label} | {seconds:.1f} | "
                f"{measured.peak_rss_mib:.0f} |"
            )
        difference = np.abs(outputs["packed body"] - outputs["block-diagonal"]).max()
        assert difference < 1e-4, f"the two graphs differ by {difference} at {side}"


if __name__ == "__main__":
    main()
