"""The calibration pass (`quantize.calibrate`) and the `calibrated` recipe that uses it.

The chunked statistics are checked against one onnxruntime run of the whole saved float graph
with the quantized MatMuls' inputs as extra outputs, fed as onnxruntime-genai feeds a decoder
(random ids from numpy's generator with the recorded seed). Memory claim: on a chain of twelve
8 MiB lazy weights with a 16 MiB chunk budget, at most two weights are alive at once and the
peak Python memory stays under three weights (holding all would be 96 MiB).
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from safetensors.numpy import load_file

import mobius_genai
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.ep import get_ep
from mobius_genai.errors import ConfigError
from mobius_genai.quantize import Int4Options, quantize_int4
from mobius_genai.quantize.calibrate import (
    Calibration,
    _chunks,
    _needed_nodes,
    activation_importance,
)
from mobius_genai.quantize.layout import NBitsWeight, dequantize_matmul_nbits
from mobius_genai.quantize.rounding import search_blocks
from mobius_genai.quantize.weight_uses import find_weights
from tests._hf import load_reference_model
from tests.quantize.test_streaming import MIB, Loads, lazy_weight

TOKENS = 48


def _whole_graph_statistics(
    path, names: list[str], tokens: int, seed: int
) -> dict[str, np.ndarray]:
    """Mean square of each feature of the values `names`, from one run of the model at `path`."""
    proto = onnx.load(str(path))
    proto.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(names))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    vocab = next(i for i in proto.graph.initializer if i.name == "model.embed_tokens.weight").dims[
        0
    ]
    ids = np.random.default_rng(seed).integers(0, vocab, size=(1, tokens))
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = ids
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, tokens), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(tokens, dtype=np.int64)[None]
        else:
            feeds[value.name] = np.zeros((1, value.shape[1], 0, value.shape[3]), np.float32)
    outputs = session.run(list(dict.fromkeys(names)), feeds)
    return {
        name: np.mean(array.reshape(-1, array.shape[-1]).astype(np.float64) ** 2, axis=0)
        for name, array in zip(dict.fromkeys(names), outputs, strict=True)
    }


@pytest.mark.parametrize("budget", [1 << 30, 40_000, 1])
def test_chunked_statistics_equal_one_run_of_the_whole_graph(budget, untied_ckpt, tmp_path):
    caps = get_ep("cpu")
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    model = package["model"]
    groups, _ = find_weights(model.graph)
    targets = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    chunks = _chunks(
        model.graph, _needed_nodes(model.graph, {v for t in targets for v in t}, ()), budget
    )
    # the budgets cut: nowhere, inside layers (3 layers of 40 KiB+), at every node
    assert len(chunks) == 1 if budget > 1 << 20 else len(chunks) > 6
    ours = activation_importance(model, targets, Calibration(TOKENS, seed=5), budget)
    names = [value.name for values in targets for value in values]
    package.save(tmp_path, progress=False)
    reference = _whole_graph_statistics(tmp_path / "model.onnx", names, TOKENS, seed=5)
    assert len(ours) == len(groups) and ours[0] is None  # the embedding lookup: no MatMul
    for values, statistics in zip(targets[1:], ours[1:], strict=True):
        expected = np.mean([reference[value.name] for value in values], axis=0)
        np.testing.assert_allclose(statistics, expected, rtol=1e-5)


def test_calibrated_weights_equal_the_search_weighted_by_the_activations(tied_ckpt, tmp_path):
    """Every 4-bit MatMulNBits weight of the `calibrated` recipe is search_blocks' rounding of
    the float weight with the importance of its input features (from the float graph's run),
    and differs from the unweighted search; that importance is transformers' (the mean square
    of each input feature of the Linear, measured by a forward hook)."""
    caps = get_ep("cpu")
    mobius_genai.build(tied_ckpt, caps, "f32").save(tmp_path / "f", progress=False)
    package = mobius_genai.build(tied_ckpt, caps, "f32")
    calibration = Calibration(TOKENS, seed=2)
    options = Int4Options(quality="calibrated", accuracy_level=0)
    report = quantize_int4(package["model"], options, caps, calibration=calibration)
    assert report.summary()["calibration"] == {"tokens": TOKENS, "seed": 2}
    package.save(tmp_path / "q", progress=False)
    checkpoint = load_file(tied_ckpt / "model.safetensors")
    graph = ir.load(tmp_path / "q" / "model.onnx").graph
    nodes = [n for n in graph if n.op_type == "MatMulNBits" and n.attributes.get_int("bits") == 4]
    names = [node.inputs[0].name for node in nodes]
    reference = _whole_graph_statistics(tmp_path / "f" / "model.onnx", names, TOKENS, seed=2)
    assert len(nodes) >= 10
    linear_inputs = _transformers_statistics(tied_ckpt, TOKENS, seed=2)
    for node in nodes:
        k, n = node.attributes.get_int("K"), node.attributes.get_int("N")
        ours = dequantize_matmul_nbits(
            NBitsWeight(*(value.const_value.numpy() for value in node.inputs[1:4])), k
        )
        weight = _float_weight(checkpoint, node.inputs[1].name, k, n)
        importance = reference[node.inputs[0].name].astype(np.float32)
        module = (
            node.inputs[1].name.removesuffix(".weight_Q4").replace("model.embed_tokens", "lm_head")
        )
        module = module.split("+")[0]  # packed q+k: both read the same input
        np.testing.assert_allclose(importance, linear_inputs[module], rtol=1e-4)
        blocks = np.ascontiguousarray(weight.T).reshape(-1, 32)
        for weights, equal in ((np.tile(importance.reshape(-1, 32), (n, 1)), True), (None, False)):
            rounded = search_blocks(blocks, 4, False, weights)
            values = (rounded.q.astype(np.float32) - rounded.zero[:, None]) * rounded.scales[
                :, None
            ]
            expected = values.reshape(n, k).T
            assert np.allclose(ours, expected, rtol=1e-5, atol=1e-6) == equal, node.name


def test_dequantize_linear_weights_are_searched_with_the_activations(untied_ckpt, tmp_path):
    """Portable ONNX takes int4 as DequantizeLinear + MatMul: each uint4 weight there is
    search_blocks' rounding weighted by the importance of its MatMul's input features (the
    float graph's statistics), not the unweighted search's."""
    caps = get_ep("default")
    mobius_genai.build(untied_ckpt, caps, "f32").save(tmp_path / "f", progress=False)
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    options = Int4Options(quality="calibrated")
    report = quantize_int4(package["model"], options, caps, calibration=Calibration(TOKENS, 3))
    assert report.format == "DequantizeLinear" and report.calibration == Calibration(TOKENS, 3)
    package.save(tmp_path / "q", progress=False)
    checkpoint = load_file(untied_ckpt / "model.safetensors")
    graph = ir.load(tmp_path / "q" / "model.onnx").graph
    matmuls = {n.inputs[1]: n for n in graph if n.op_type == "MatMul" and n.inputs[1].producer()}
    names = [node.inputs[0].name for node in matmuls.values()]
    reference = _whole_graph_statistics(tmp_path / "f" / "model.onnx", names, TOKENS, seed=3)
    assert len(matmuls) >= 10
    for dequantized, matmul in matmuls.items():
        q, scales, zero = (
            v.const_value.numpy().astype(np.float32) for v in dequantized.producer().inputs
        )
        k, n = q.shape
        ours = (q.reshape(-1, 32, n) - zero[:, None]) * scales[:, None]
        weight = _float_weight(checkpoint, dequantized.producer().inputs[0].name, k, n)
        blocks = np.ascontiguousarray(weight.reshape(-1, 32, n).transpose(0, 2, 1)).reshape(-1, 32)
        importance = reference[matmul.inputs[0].name].astype(np.float32).reshape(-1, 1, 32)
        weights = np.broadcast_to(importance, (k // 32, n, 32)).reshape(-1, 32)
        for block_weights, equal in ((weights, True), (None, False)):
            rounded = search_blocks(blocks, 4, False, block_weights)
            values = (rounded.q.astype(np.float32) - rounded.zero[:, None]) * rounded.scales[
                :, None
            ]
            expected = values.reshape(k // 32, n, 32).transpose(0, 2, 1)
            assert np.allclose(ours, expected, rtol=1e-5, atol=1e-6) == equal, matmul.name


def _importance_by_weight(package) -> dict[str, np.ndarray]:
    model = package["model"]
    groups, _ = find_weights(model.graph)
    targets = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    statistics = activation_importance(model, targets, Calibration(TOKENS, seed=4))
    return {
        group.source.name: found
        for group, found in zip(groups, statistics, strict=True)
        if found is not None
    }


#: Relative difference of the statistics of a graph in `dtype` from the fp32 graph's: the
#: weights' rounding, grown over 3 random layers (seen: 6% bf16, 0.3% fp16).
NARROW_RTOL = {"bf16": 0.1, "fp16": 0.01}


@pytest.mark.parametrize(("ep", "dtype"), [("cuda", "bf16"), ("cuda", "fp16"), ("dml", "fp16")])
def test_narrow_float_graphs_are_measured_in_float32(ep, dtype, tied_ckpt):
    """onnxruntime's CPU provider has no bfloat16 MatMul: the run computes in float32 (the
    GPU graph's own ops: GroupQueryAttention, SkipSimplifiedLayerNormalization, q/k/v packed
    or not), and measures what the fp32 cpu graph does up to the weights' rounding."""
    reference = _importance_by_weight(mobius_genai.build(tied_ckpt, "cpu", "f32"))
    package = mobius_genai.build(tied_ckpt, ep, dtype)
    assert package["model"].graph.initializers["model.norm.weight"].dtype != ir.DataType.FLOAT
    ours = _importance_by_weight(package)
    assert len(ours) >= 10
    for name, statistics in ours.items():
        packed = re.sub(r"\.[qkv]_proj\.", ".qkv_proj.", name)  # (q, k, v share one input)
        expected = reference[name if name in reference else packed]
        np.testing.assert_allclose(statistics, expected, rtol=NARROW_RTOL[dtype], err_msg=name)


def _transformers_statistics(ckpt, tokens: int, seed: int) -> dict[str, np.ndarray]:
    """Linear module name -> mean square of each input feature, over transformers' forward of
    the same random ids."""
    model = load_reference_model(ckpt)
    statistics = {}

    def record(name):
        def hook(module, args, output) -> None:
            rows = args[0].reshape(-1, args[0].shape[-1]).double()
            statistics[name] = (rows * rows).mean(0).numpy()

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(record(name))
    vocab = model.config.vocab_size
    ids = np.random.default_rng(seed).integers(0, vocab, size=(1, tokens))
    with torch.no_grad():
        model(torch.tensor(ids))
    return statistics


def _float_weight(checkpoint: dict, quantized_name: str, k: int, n: int) -> np.ndarray:
    """The [K, N] checkpoint weight (stored [N, K]) whose int4 copy is `quantized_name`: one
    tensor, or the packed projections `a.q_proj+k_proj.weight` (format_split's run names)."""
    name = quantized_name.removesuffix("_Q4")
    head, _, rest = name.rpartition(".")[0].rpartition(".")
    parts = [f"{head}.{part}.weight" for part in rest.split("+")] if "+" in rest else [name]
    array = np.concatenate([checkpoint[part] for part in parts]).T
    assert array.shape == (k, n), name
    return array


def _lookup_chain(loads: Loads) -> ir.Model:
    """logits = Gather(table, input_ids) @ W0 @ W1 @ ... (12 lazily generated 8 MiB weights)."""
    ids = ir.val("input_ids", ir.DataType.INT64, ir.Shape(["batch", "sequence"]))
    table = ir.Value(
        name="table",
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape([1024, 1024]),
        const_value=ir.tensor(np.random.default_rng(0).standard_normal((1024, 1024), np.float32)),
    )
    nodes = [ir.node("Gather", [table, ids])]
    initializers = [table]
    for i, shape in enumerate([(1024, 2048), (2048, 1024)] * 6):
        weight = lazy_weight(loads, i, shape)
        initializers.append(weight)
        nodes.append(ir.node("MatMul", [nodes[-1].outputs[0], weight]))
    for index, node in enumerate(nodes):
        node.outputs[0].name = f"h{index}"
    logits = nodes[-1].outputs[0]  # (its last dimension is the vocabulary size)
    logits.name, logits.shape = "logits", ir.Shape(["batch", "sequence", 1024])
    graph = ir.Graph(
        [ids],
        [nodes[-1].outputs[0]],
        nodes=nodes,
        initializers=initializers,
        opset_imports={"": 21},
    )
    return ir.Model(graph, ir_version=10)


def test_calibration_holds_one_chunk_of_weights_at_a_time():
    loads = Loads()
    model = _lookup_chain(loads)
    matmuls = [node for node in model.graph if node.op_type == "MatMul"]
    tracemalloc.start()
    try:
        ours = activation_importance(
            model, [[node.inputs[0]] for node in matmuls], Calibration(8), chunk_bytes=16 * MIB
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\npeak {peak / MIB:.1f} MiB, at most {loads.max_live} weights alive (12 of 8 MiB)")
    assert loads.count == 11  # every weight read once, but the last (its output is not needed)
    assert loads.max_live <= 2
    assert peak < 3 * 8 * MIB
    ids = np.random.default_rng(0).integers(0, 1024, size=8)
    h = model.graph.initializers["table"].const_value.numpy()[ids].astype(np.float64)
    for index, statistics in enumerate(ours):
        np.testing.assert_allclose(statistics, np.mean(h**2, axis=0), rtol=1e-4)
        h = h @ matmuls[index].inputs[1].const_value.numpy()


def test_a_graph_without_token_ids_is_refused_in_one_line():
    model = _lookup_chain(Loads())
    model.graph.inputs[0].name = "inputs_embeds"
    with pytest.raises(
        ConfigError, match="takes 'inputs_embeds' rather than looking up 'input_ids'"
    ):
        activation_importance(model, [], Calibration(8))


def test_a_decoder_taking_embeddings_gets_the_unweighted_search():
    """A vision-language decoder (`inputs_embeds` beside `input_ids`) cannot be fed random ids
    alone: the calibrated recipe quantizes it unweighted, and the report says so."""
    model = _lookup_chain(Loads())
    embeddings = ir.val("inputs_embeds", ir.DataType.FLOAT, ir.Shape(["batch", "sequence", 1024]))
    model.graph.inputs.append(embeddings)
    options = Int4Options(quality="calibrated")
    report = quantize_int4(model, options, get_ep("cpu"), calibration=Calibration(8))
    assert report.calibration is None and "calibration" not in report.summary()
    assert "'inputs_embeds'" in report.summary()["calibration_skipped"]
    assert len(report.weights) == 13


def test_the_embedding_table_is_read_only_at_the_rows_of_the_ids(untied_ckpt, monkeypatch):
    """A 7B's table is ~1 GiB: the lookup of the random ids reads one stored row per id."""
    caps = get_ep("cpu")
    model = mobius_genai.build(untied_ckpt, caps, "f32")["model"]
    groups, _ = find_weights(model.graph)
    reads = []
    original = Checkpoint.read

    def recording_read(self, name, index=None):
        if name == "model.embed_tokens.weight":
            reads.append(None if index is None else index[0].stop - index[0].start)
        return original(self, name, index)

    monkeypatch.setattr(Checkpoint, "read", recording_read)
    targets = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    activation_importance(model, targets, Calibration(TOKENS, seed=5))
    unique = np.unique(np.random.default_rng(5).integers(0, 128, size=TOKENS))
    assert reads == [1] * len(unique)


def test_a_weight_every_layer_reads_is_read_once(untied_ckpt, monkeypatch):
    """The rope tables are lazy (computed on each read) and read by every layer: cut into a
    chunk per node, the run reads each table once, not once per chunk."""
    import mobius_genai.components.rope as rope

    model = mobius_genai.build(untied_ckpt, get_ep("cpu"), "f32")["model"]
    groups, _ = find_weights(model.graph)
    targets = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    tables = []
    original = rope._table
    monkeypatch.setattr(rope, "_table", lambda *args: tables.append(args[3]) or original(*args))
    activation_importance(model, targets, Calibration(TOKENS, seed=5), chunk_bytes=1)
    assert sorted(function.__name__ for function in tables) == ["cos", "sin"]
