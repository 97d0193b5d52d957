"""INT4 tensors are computed while saving, one weight at a time.

Memory claim: peak Python memory while saving a model of twelve 8 MiB float32 weights (96 MiB)
stays under twice the largest weight (measured ~13 MiB: the weight, one 4 MiB slice copy and
its int4 parts). Holding every weight (96 MiB) or every weight's int4 parts (+15 MiB) fails it.
"""

from __future__ import annotations

import collections
import tracemalloc
import weakref

import numpy as np
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options, quantize_int4, search_pool
from mobius_genai.quantize.calibrate import Calibration
from mobius_genai.quantize.layout import DEFAULT_CHUNK_ELEMENTS
from mobius_genai.quantize.streaming import OneWeightCache, PartSpec, lazy_parts

MIB = 1 << 20
SHAPES = [(1024, 2048), (2048, 1024)] * 6  # 12 float32 weights of 8 MiB


class Loads:
    """Counts weight loads and how many loaded arrays are alive at once."""

    def __init__(self) -> None:
        self.count = 0
        self.live = 0
        self.max_live = 0

    def loader(self, seed: int, shape: tuple[int, int]):
        def load() -> ir.TensorProtocol:
            self.count += 1
            array = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
            self.live += 1
            self.max_live = max(self.max_live, self.live)
            weakref.finalize(array, self._release)
            return ir.Tensor(array)

        return load

    def _release(self) -> None:
        self.live -= 1


def lazy_weight(loads: Loads, index: int, shape: tuple[int, int]) -> ir.Value:
    """An initializer `w<index>` whose float32 values `loads` generates when read."""
    tensor = ir.LazyTensor(
        loads.loader(index, shape), dtype=ir.DataType.FLOAT, shape=ir.Shape(shape), name=f"w{index}"
    )
    return ir.Value(
        name=f"w{index}",
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape(shape),
        const_value=tensor,
    )


def _chain(loads: Loads) -> ir.Model:
    """y = x @ W0 @ W1 @ ... with lazily generated weights."""
    x = ir.val("x", ir.DataType.FLOAT, ir.Shape([1, SHAPES[0][0]]))
    h, nodes, weights = x, [], []
    for i, shape in enumerate(SHAPES):
        weight = lazy_weight(loads, i, shape)
        weights.append(weight)
        nodes.append(ir.node("MatMul", [h, weight]))
        h = nodes[-1].outputs[0]
    h.name = "y"
    graph = ir.Graph([x], [h], nodes=nodes, initializers=weights, opset_imports={"": 21})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_saving_quantizes_one_weight_at_a_time(ep, tmp_path):
    loads = Loads()
    model = _chain(loads)
    report = quantize_int4(model, Int4Options(symmetric=False, quality="balanced"), get_ep(ep))
    assert len(report.weights) == len(SHAPES)
    assert loads.count == 0  # the rewrite reads nothing

    largest = max(k * n for k, n in SHAPES) * 4
    tracemalloc.start()
    try:
        ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = len(SHAPES) * largest
    print(f"\npeak {peak / MIB:.1f} MiB saving {total / MIB:.0f} MiB (largest {largest / MIB:.0f})")
    assert loads.count == len(SHAPES)  # each weight read (and quantized) exactly once
    assert loads.max_live == 1
    # one weight and its outputs; the search's workers (quantize/search_pool.py) each add a
    # chunk in flight (its request, then its result)
    chunk = DEFAULT_CHUNK_ELEMENTS * 4
    assert peak < 2 * largest + 2 * chunk * search_pool.search_workers()


@pytest.mark.parametrize("quality", ["builder", "calibrated"])
def test_checkpoint_tensors_are_read_once_when_saving(quality, untied_ckpt, tmp_path, monkeypatch):
    """Quantizing reads nothing, except a calibrated recipe's one run of the float graph: every
    matrix it needs once (the lm_head's input is the last value it needs, so not the lm_head)
    and the embedding table one row per distinct id. Saving reads each matrix once more."""
    reads = collections.Counter()
    original = Checkpoint.read

    def counting_read(self, name, index=None):
        reads[name] += 1  # (the tiny weights are read in one block each)
        return original(self, name, index)

    monkeypatch.setattr(Checkpoint, "read", counting_read)
    caps = get_ep("cpu")
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    checkpoint = Checkpoint(untied_ckpt)
    matrices = {name for name in checkpoint if len(checkpoint.shape(name)) == 2}
    assert "model.layers.0.self_attn.q_proj.weight" in matrices  # (read for the packed q/k/v)
    layers = matrices - {"lm_head.weight", "model.embed_tokens.weight"}
    reads.clear()  # (the optimizer may read small tensors such as norms while building)
    calibration = Calibration(tokens=24, seed=3)
    options = Int4Options(quality=quality)
    report = quantize_int4(package["model"], options, caps, calibration=calibration)
    if quality == "builder":
        assert not reads
    else:
        assert report.calibration == calibration
        ids = np.random.default_rng(3).integers(0, checkpoint.shape("lm_head.weight")[0], 24)
        assert reads.pop("model.embed_tokens.weight") == len(set(ids.tolist()))
        assert {name: reads[name] for name in matrices & reads.keys()} == dict.fromkeys(layers, 1)
    reads.clear()
    package.save(tmp_path, progress=False)
    quantized = {weight.name for weight in report.weights}
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= quantized
    assert {name: reads[name] for name in matrices} == dict.fromkeys(matrices, 1)


@pytest.mark.parametrize("keep_bytes", [0, 1024])
def test_cache_computes_once_for_parts_read_in_order(keep_bytes):
    """Reading another weight frees the current one; its unread small parts are set aside
    (up to keep_bytes each), larger ones are recomputed when asked for later."""
    cache = OneWeightCache(keep_bytes=keep_bytes)
    specs = [PartSpec(f"p{i}", ir.DataType.FLOAT, (2,)) for i in range(3)]
    runs = []

    def compute(tag):
        def run():
            runs.append(tag)
            return [ir.tensor(np.full(2, 10 * tag + i, np.float32)) for i in range(3)]

        return run

    a = lazy_parts(cache, specs, compute(1))
    b = lazy_parts(cache, specs, compute(2))
    assert [t.numpy()[0] for t in a] == [10, 11, 12]
    assert runs == [1]  # one computation for three parts, then released
    assert b[0].numpy()[0] == 20 and a[1].numpy()[0] == 11  # a was released: recomputed
    assert runs == [1, 2, 1]
    assert b[1].numpy()[0] == 21  # b's unread 8-byte parts were set aside, or recomputed
    assert runs == ([1, 2, 1] if keep_bytes else [1, 2, 1, 2])
    assert cache.computations == len(runs)
