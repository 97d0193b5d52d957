"""Decode step of a `default` EP bundle with and without components/kv_slots.py's placement.

The portable graph writes each new key where og.Engine's mask says (a ScatterElements into the
past and new keys concatenated, cut to the mask's length) before ONNX Attention appends it, so
that og.Engine's batches of different lengths get their own tokens. This measures what that
costs og.Generator's single sequence: the bundle against a twin whose Attention nodes read the
past directly (the graph before kv_slots.py; the placement nodes removed, weights hard-linked),
in benchmarks/_work. One onnxruntime thread, CPU time per step (less disturbed by other load
than wall time), the two sessions taking turns; the minimum over rounds.

    python benchmarks/kv_placement.py BUNDLE [--past 512,2048] [--steps 10] [--rounds 5]

Prints each past length's step time for both graphs and their ratio (placed / appended).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import onnx
import onnxruntime as ort
from _decode import decode_feeds
from make_qwen25_05b_shape import WORK


def _source(producers: dict[str, onnx.NodeProto], name: str) -> str:
    """The past a placement reads (Slice ← ScatterElements ← Concat(past, new)), else `name`."""
    node = producers.get(name)
    if node is None or node.op_type != "Slice":
        return name
    scatter = producers[node.input[0]]
    return producers[scatter.input[0]].input[0]


def appended_twin(bundle: Path) -> Path:
    """`bundle` with each Attention reading the past itself; unread nodes dropped."""
    twin = WORK / f"{bundle.name}-appended"
    shutil.rmtree(twin, ignore_errors=True)
    twin.mkdir(parents=True)
    for path in bundle.iterdir():
        if path.name != "model.onnx":
            os.link(path, twin / path.name)
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    for node in graph.node:
        if node.op_type == "Attention":
            node.input[4] = _source(producers, node.input[4])
            node.input[5] = _source(producers, node.input[5])
    outputs = {value.name for value in graph.output}
    while True:
        read = outputs | {name for node in graph.node for name in node.input}
        kept = [node for node in graph.node if any(name in read for name in node.output)]
        if len(kept) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(kept)
    onnx.save(model, twin / "model.onnx")
    return twin


def _session(folder: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--past", default="512,2048")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folders = {"placed": args.bundle, "appended": appended_twin(args.bundle)}
    sessions = {label: _session(folder) for label, folder in folders.items()}
    for past in map(int, args.past.split(",")):
        feeds = {label: decode_feeds(s, folders[label], past) for label, s in sessions.items()}
        times: dict[str, list[float]] = {label: [] for label in sessions}
        for label, session in sessions.items():
            session.run(None, feeds[label])  # warm-up
        for _ in range(args.rounds):
            for label, session in sessions.items():
                start = time.process_time()
                for _ in range(args.steps):
                    session.run(None, feeds[label])
                times[label].append((time.process_time() - start) / args.steps * 1000)
        placed, appended = min(times["placed"]), min(times["appended"])
        print(
            f"past {past}: placed {placed:.2f} ms, appended {appended:.2f} ms, "
            f"ratio {placed / appended:.3f}"
        )


if __name__ == "__main__":
    main()
