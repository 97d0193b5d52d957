"""Gemma 4's GeGLU experts in 4 bits in an int4 bundle (quantize/qmoe.py's GeGLU overloads).

No onnxruntime kernel takes GeGLU experts, so int4 turns the MoE node into a QMoE node of a
GeGLU overload whose body (components/moe_bodies.py) every EP expands: the picked experts
dequantized by GatherBlockQuantized where the EP table has it, else by standard ops, k at a
time; where the EP's "MatMulNBits.experts" row says so (cpu), into a MatMulNBits per expert
and projection on each expert's own codes, each on the tokens that picked it. Checked here:
the per-expert body equals the k-at-a-time one on the same codes (and a wrong expert's codes
do not), and that body equals the float body run on the dequantized experts (the
per-expert scale folded into the down projection's scales included), decode and prefill, both
dequantizations; a prefill never holds more than k float experts, however long the prompt;
the bundle stores the experts as 4-bit codes and is the size the bits say; og.Generator's
logits stay near transformers', equal them where the checkpoint's weights are the codes'
values (and og's greedy tokens are transformers'), and so do the onnx-standard graph's
logits on onnxruntime; and each
EP's graph has the expanded body with the op its table allows; a block size the experts do not
take leaves them float.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import InlinePass
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import packager
from mobius_genai.checkpoint.experts import ExpertsTensor
from mobius_genai.components.tier1 import MS_DOMAIN, expanded_after_int4, register_functions
from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options
from mobius_genai.quantize.layout import dequantize_matmul_nbits, quantize_matmul_nbits
from mobius_genai.quantize.package_weights import quantize_package
from mobius_genai.quantize.qmoe import QMoEPass
from mobius_genai.runtime.generate import greedy_tokens, load_model
from mobius_genai.target import resolve_target
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import GEMMA4_MOE, hf_greedy_tokens, hf_reference_logits
from tests.components.test_moe_function import _run
from tests.quantize._reference import grid_weights
from tests.quantize.test_qmoe import INT4_RELATIVE_RMS, _relative_rms
from tests.quantize.test_qmoe import _ids as qmoe_ids
from tests.quantize.test_qmoe import _logits as qmoe_logits
from tests.runtime._og import generator

EXPERTS, HIDDEN, INTER, TOP_K, BLOCK = 8, 32, 16, 2, 16
#: The quantized body against the float body on the dequantized experts: the same products,
#: only the dequantization's rounding (the folded scale) and fp32 accumulation order differ
BODY_TOLERANCE = 1e-5
OPTIONS = Int4Options(block_size=BLOCK)  # the tiny model's expert width (32) takes 16


def _moe_model(fc1: np.ndarray, fc2: np.ndarray, factor: np.ndarray | None) -> ir.Model:
    """One MoE node of the "geglu" overload, fed as components/stack_experts.py feeds it: the
    down projections times `factor` [E] reshaped to [E, 1, 1] (no Mul when None)."""
    f32 = ir.DataType.FLOAT
    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([1, "tokens", HIDDEN]))
    router = ir.Value(name="router", type=ir.TensorType(f32), shape=ir.Shape(["tokens", EXPERTS]))
    values = {
        name: ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(f32),
            const_value=ir.tensor(array, name=name),
        )
        for name, array in (("fc1", fc1), ("fc2", fc2))
    }
    nodes = []
    down = values["fc2"]
    if factor is not None:
        values["factor"] = ir.Value(name="factor", const_value=ir.tensor(factor, name="factor"))
        shape = ir.node("Constant", [], {"value_ints": [-1, 1, 1]})
        reshape = ir.node("Reshape", [values["factor"], shape.outputs[0]])
        reshape.outputs[0].shape = ir.Shape([EXPERTS, 1, 1])
        mul = ir.node("Mul", [down, reshape.outputs[0]])
        mul.outputs[0].shape, mul.outputs[0].type = ir.Shape(fc2.shape), ir.TensorType(f32)
        nodes, down = [shape, reshape, mul], mul.outputs[0]
    moe = ir.node(
        "MoE",
        [x, router, values["fc1"], None, down],
        {
            "k": TOP_K,
            "activation_type": "geglu",
            "swiglu_fusion": 1,
            "normalize_routing_weights": 1,
        },
        domain=MS_DOMAIN,
        overload="geglu",
    )
    moe.outputs[0].name, moe.outputs[0].type = "y", ir.TensorType(f32)
    graph = ir.Graph(
        [x, router],
        moe.outputs,
        nodes=[*nodes, moe],
        initializers=list(values.values()),
        opset_imports={"": 23, MS_DOMAIN: 1},
    )
    model = ir.Model(graph, ir_version=10)
    register_functions(model)
    return model


def _dequantized(stacked: np.ndarray, symmetric: bool) -> np.ndarray:
    """The float [E, N, K] experts the 4-bit codes stand for (numpy, expert by expert)."""
    return np.stack(
        [
            dequantize_matmul_nbits(
                quantize_matmul_nbits(matrix.T, BLOCK, symmetric), matrix.shape[1]
            ).T
            for matrix in stacked
        ]
    )


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("gather", [True, False], ids=["GatherBlockQuantized", "standard"])
def test_quantized_body_equals_the_float_body_on_the_dequantized_experts(gather, symmetric):
    """The QMoE GeGLU body (folded per-expert scale, picked experts only) against the float
    MoE body whose experts hold the values of the codes, times the scale: a decode step (2 of
    8 experts) and a 16-token prefill (every expert picked)."""
    rng = np.random.default_rng(1)
    fc1 = rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN), dtype=np.float32)
    fc2 = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32)
    factor = rng.uniform(0.5, 2.0, EXPERTS).astype(np.float32)
    quantized = _moe_model(fc1, fc2, factor)
    experts = QMoEPass(BLOCK, symmetric, False, 0, kernel=False, gather=gather)
    assert experts(quantized).modified and not experts.declined
    register_functions(quantized)
    InlinePass(criteria=expanded_after_int4)(quantized)
    nodes = list(quantized.graph.all_nodes())
    ops = Counter(node.op_type for node in nodes)
    assert not ops["MoE"] and not ops["QMoE"] and not ops["If"]
    assert ops["GatherBlockQuantized"] == (2 if gather else 0)
    if not gather:  # nothing onnx-standard lacks
        assert all(node.domain in ("", "ai.onnx") for node in nodes), ops
    initializers = quantized.graph.initializers.values()
    assert {value.dtype for value in initializers if value.shape[0] == EXPERTS} == {
        ir.DataType.UINT8,
        ir.DataType.FLOAT,
    }
    assert all(value.shape[-1] < HIDDEN for value in initializers if value.shape[0] == EXPERTS)
    fc2_dequantized = _dequantized(fc2, symmetric) * factor[:, None, None]
    reference = _moe_model(_dequantized(fc1, symmetric), fc2_dequantized, None)
    InlinePass()(reference)
    for tokens in (1, 16):
        feeds = {
            "x": rng.standard_normal((1, tokens, HIDDEN), dtype=np.float32),
            "router": rng.standard_normal((tokens, EXPERTS), dtype=np.float32),
        }
        expected = _run(reference, feeds)
        tolerance = BODY_TOLERANCE * np.abs(expected).max()
        np.testing.assert_allclose(_run(quantized, feeds), expected, atol=tolerance)
        if not gather:  # the standard ops' own semantics: onnx's reference evaluator
            (standard,) = ReferenceEvaluator(ir.to_proto(quantized)).run(None, feeds)
            np.testing.assert_allclose(standard, expected, atol=tolerance)


def _per_expert_and_loop(symmetric: bool, accuracy_level: int = 0) -> tuple[ir.Model, ir.Model]:
    """One GeGLU MoE layer (folded per-expert scale) quantized both ways from the same float
    experts: a MatMulNBits per expert (`per_expert`), and QMoE's Loop body expanded."""
    rng = np.random.default_rng(5)
    fc1 = rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN), dtype=np.float32)
    fc2 = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32)
    factor = rng.uniform(0.5, 2.0, EXPERTS).astype(np.float32)
    models = []
    for per_expert in (True, False):
        model = _moe_model(fc1, fc2, factor)
        experts = QMoEPass(
            BLOCK, symmetric, False, accuracy_level, kernel=False, per_expert=per_expert
        )
        assert experts(model).modified and not experts.declined
        register_functions(model)
        InlinePass(criteria=expanded_after_int4)(model)
        models.append(model)
    return models[0], models[1]


def _feeds(tokens: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((1, tokens, HIDDEN), dtype=np.float32),
        "router": rng.standard_normal((tokens, EXPERTS), dtype=np.float32),
    }


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_per_expert_body_equals_the_loop_body_on_the_same_codes(symmetric):
    """The cpu EP's body (two MatMulNBits per expert on that expert's own codes, on the tokens
    that picked it) against QMoE's Loop body (GatherBlockQuantized of the same codes):
    a decode step, a 3-token and a 16-token prefill (every expert picked); its graph has a
    MatMulNBits per expert and projection, each expert's arrays their own initializers, and
    no GatherBlockQuantized or stacked expert tensor."""
    per_expert, loop = _per_expert_and_loop(symmetric)
    ops = Counter(node.op_type for node in per_expert.graph.all_nodes())
    assert not ops["MoE"] and not ops["QMoE"] and not ops["Loop"]
    assert not ops["GatherBlockQuantized"] and not ops["MatMul"]
    assert ops["MatMulNBits"] == 2 * EXPERTS and not ops["If"]
    initializers = per_expert.graph.initializers.values()
    assert not [value.name for value in initializers if value.shape[0] == EXPERTS]
    codes = [value for value in initializers if value.name.endswith("_Q4")]
    assert len(codes) == 2 * EXPERTS and {value.dtype for value in codes} == {ir.DataType.UINT8}
    for tokens in (1, 3, 16):
        feeds = _feeds(tokens, tokens)
        expected = _run(loop, feeds)
        tolerance = BODY_TOLERANCE * np.abs(expected).max()
        np.testing.assert_allclose(_run(per_expert, feeds), expected, atol=tolerance)


def test_the_per_expert_body_with_a_wrong_expert_s_codes_differs():
    """The mutant: expert 0's fc1 codes swapped with expert 1's make the output differ from
    the Loop body's (so the check above compares each expert's own codes)."""
    per_expert, loop = _per_expert_and_loop(symmetric=True)
    values = per_expert.graph.initializers
    first, second = (values[f"fc1_e{e}_Q4"] for e in (0, 1))
    first.const_value, second.const_value = second.const_value, first.const_value
    feeds = _feeds(16, 7)
    expected = _run(loop, feeds)
    assert np.abs(_run(per_expert, feeds) - expected).max() > 0.1 * np.abs(expected).max()


def _float_experts_dequantized(model: ir.Model, tokens: int, tmp_path) -> list[int]:
    """The number of experts of each float [experts, N, K] tensor of a projection's shape
    that onnxruntime's run of a `tokens`-token prefill made (its profile's node outputs)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / f"profile_{tokens}")
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(tokens)
    feeds = {
        "x": rng.standard_normal((1, tokens, HIDDEN), dtype=np.float32),
        "router": rng.standard_normal((tokens, EXPERTS), dtype=np.float32),
    }
    session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    projections = {(2 * INTER, HIDDEN), (HIDDEN, INTER)}
    return [
        shape[0]
        for event in events
        if event.get("cat") == "Node"
        for output in event["args"].get("output_type_shape", [])
        for dtype, shape in output.items()
        if dtype == "float" and len(shape) == 3 and tuple(shape[1:]) in projections
    ]


@pytest.mark.parametrize("gather", [True, False], ids=["GatherBlockQuantized", "standard"])
def test_a_prefill_dequantizes_k_experts_at_a_time_however_long_the_prompt(gather, tmp_path):
    """The bound on the body's memory: a prefill whose tokens pick all 8 experts dequantizes
    them k (2) at a time, for a 16-token and a 64-token prompt alike; onnxruntime's profile
    gives the shape of every tensor its run made, the Loop's body included."""
    rng = np.random.default_rng(3)
    fc1 = rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN), dtype=np.float32)
    fc2 = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32)
    model = _moe_model(fc1, fc2, None)
    QMoEPass(BLOCK, False, False, 0, kernel=False, gather=gather)(model)
    register_functions(model)
    InlinePass(criteria=expanded_after_int4)(model)
    for tokens in (16, 64):
        experts = _float_experts_dequantized(model, tokens, tmp_path)
        assert max(experts) == TOP_K, experts
        assert sum(experts) >= 2 * EXPERTS, experts  # every expert, both projections


def test_experts_a_block_size_does_not_divide_stay_float_and_expanded():
    """A block size that does not divide the experts' K declines the node (one line why) and
    int4 then expands the float MoE body it was left for."""
    rng = np.random.default_rng(2)
    fc1 = rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN), dtype=np.float32)
    fc2 = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32)
    model = _moe_model(fc1, fc2, None)
    experts = QMoEPass(2 * BLOCK, True, False, 0, kernel=False, gather=True)
    assert not experts(model).modified
    ((_, reason),) = experts.declined
    assert f"input features {INTER} are not a multiple of the int4 block size" in reason
    InlinePass(criteria=expanded_after_int4)(model)
    ops = Counter(node.op_type for node in model.graph.all_nodes())
    assert not ops["MoE"] and ops["If"] == 1
    assert {value.dtype for value in model.graph.initializers.values()} == {ir.DataType.FLOAT}


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    return bundle_checkpoint(
        tmp_path_factory.mktemp("gemma4_moe") / "ckpt", "gemma4_text", **GEMMA4_MOE
    )


@pytest.fixture(scope="module")
def bundles(moe_checkpoint, tmp_path_factory):
    """The cpu bundle in fp32 and in int4 (smoke-tested by package); the int4 one quantizes
    the experts one at a time as it is saved: no float tensor of a layer's experts is built.
    (The tiny model's int4 arrays are small enough to be stored inside model.onnx, whole.)"""
    folder = tmp_path_factory.mktemp("bundles")
    fp32 = packager.package(moe_checkpoint, "cpu", folder / "fp32", precision="fp32", quiet=True)

    def refuse(self):
        raise AssertionError(f"{self.name}: every float expert of a layer read at once")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExpertsTensor, "_load", refuse)
        int4 = packager.package(
            moe_checkpoint, "cpu", folder / "int4", precision="int4", int4=OPTIONS, quiet=True
        )
    return {"fp32": fp32, "int4": int4}


def _expert_bytes(folder) -> dict[str, int]:
    """Bytes of each initializer of the stacked experts, by name, read from the graph."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    sizes = {}
    for tensor in graph.initializer:
        if ".experts." in tensor.name:
            stored = {entry.key: entry.value for entry in tensor.external_data}
            sizes[tensor.name] = int(stored.get("length", len(tensor.raw_data)))
    return sizes


def test_int4_bundle_stores_the_experts_in_four_bits(bundles):
    """The expert initializers are uint8 codes, scales and zero points of each expert (the cpu
    EP's MatMulNBits per expert), no float stack; their bytes against the fp32 bundle's are
    what the bits say: 4 bits a weight plus a float32 scale and a 4-bit zero point per block
    of 16, 6.25 of 32 bits."""
    graph = onnx.load(str(bundles["int4"] / "model.onnx"), load_external_data=False).graph
    nodes = ir.load(bundles["int4"] / "model.onnx").graph.all_nodes()
    ops = Counter(node.op_type for node in nodes)  # the Ifs' branches included
    experts = GEMMA4_MOE["num_experts"]
    assert not ops["MoE"] and not ops["QMoE"] and not ops["Loop"] and not ops["MatMul"]
    assert not ops["If"]
    assert ops["GatherBlockQuantized"] == 1  # the embedding; no expert is gathered
    dense = 6 * 7 + 1  # a layer's q, k, v, o, gate, up, down; the lm_head
    assert ops["MatMulNBits"] == dense + 6 * experts * 2
    experts = {t.name: t for t in graph.initializer if ".experts." in t.name}
    assert experts and {tensor.data_type for tensor in experts.values()} == {
        onnx.TensorProto.UINT8,
        onnx.TensorProto.FLOAT,
    }
    manifest = json.loads((bundles["int4"] / "mobius_manifest.json").read_text())
    assert manifest["build"]["quantization"]["op_counts"]["GatherBlockQuantized"] == 1
    floats = [t for t in experts.values() if t.data_type == onnx.TensorProto.FLOAT]
    assert all(name.endswith("_scales") for name in (t.name for t in floats))
    int4, fp32 = _expert_bytes(bundles["int4"]), _expert_bytes(bundles["fp32"])
    ratio = sum(int4.values()) / sum(fp32.values())
    bits = 4 + (32 + 4) / BLOCK
    assert 4 / 32 < ratio <= bits / 32 * 1.01, ratio
    total = {key: (folder / "model.onnx.data").stat().st_size for key, folder in bundles.items()}
    assert total["int4"] / total["fp32"] <= bits / 32 * 1.25, total


def test_og_generator_on_the_int4_bundle_stays_near_transformers(bundles, moe_checkpoint):
    """og.Generator's prefill logits of the int4 bundle against transformers' fp32 ones, within
    test_qmoe.py's bound for tiny random checkpoints in int4 (relative rms 0.7), and greedy
    decoding runs."""
    model = load_model(bundles["int4"])
    made = generator(model, PROMPT, 1)
    logits = np.asarray(made.get_output("logits"))[0]
    reference = hf_reference_logits(moe_checkpoint, np.asarray([PROMPT]), 0).prefill.logits[0]
    assert _relative_rms(logits, reference) <= INT4_RELATIVE_RMS
    assert len(greedy_tokens(model, PROMPT, len(PROMPT) + 8)) == 8


def test_the_cpu_fp16_int4_bundle_runs_the_per_expert_body_near_transformers(
    moe_checkpoint, tmp_path
):
    """In fp16 too the cpu EP takes the per-expert body (its pieces added in float32:
    onnxruntime's CPU ScatterND adds no float16), and og.Generator's prefill logits stay
    within the int4 bound of transformers' fp32 ones."""
    folder = tmp_path / "fp16"
    bundle = packager.package(
        moe_checkpoint, "cpu", folder, precision="int4", dtype="f16", int4=OPTIONS, quiet=True
    )
    ops = Counter(node.op_type for node in ir.load(bundle / "model.onnx").graph.all_nodes())
    assert ops["MatMulNBits"] >= 6 * GEMMA4_MOE["num_experts"] * 2 and not ops["Loop"]
    logits = np.asarray(generator(load_model(bundle), PROMPT, 1).get_output("logits"))[0]
    reference = hf_reference_logits(moe_checkpoint, np.asarray([PROMPT]), 0).prefill.logits[0]
    assert _relative_rms(logits.astype(np.float32), reference) <= INT4_RELATIVE_RMS


@pytest.fixture(scope="module")
def grid_moe_bundle(moe_checkpoint, tmp_path_factory):
    """(checkpoint, cpu int4 bundle): the MoE checkpoint with every matrix and expert on an
    int4 grid (quantize/_reference.py's `grid_weights` along the input features), so its 4-bit
    codes hold the checkpoint's values exactly; accuracy level 0 (float32 products)."""
    ckpt = tmp_path_factory.mktemp("grid_moe") / "ckpt"
    shutil.copytree(moe_checkpoint, ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    rng = np.random.default_rng(4)
    for name, array in tensors.items():
        if array.ndim in (2, 3):  # [out, in] and the experts' [E, out, in]
            rows = int(np.prod(array.shape[:-1]))
            tensors[name] = grid_weights(rows, array.shape[-1], rng).reshape(array.shape)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    options = Int4Options(block_size=BLOCK, accuracy_level=0)
    folder = tmp_path_factory.mktemp("grid_bundle") / "int4"
    return ckpt, packager.package(ckpt, "cpu", folder, precision="int4", int4=options, quiet=True)


def test_og_on_the_int4_bundle_equals_transformers_on_the_values_of_its_codes(grid_moe_bundle):
    """Weights the 4-bit codes hold exactly: og.Generator's prefill logits of the cpu int4
    bundle (its experts a MatMulNBits each) equal transformers' within float32
    rounding (1e-4 of the largest logit), and og's greedy tokens are transformers'."""
    ckpt, bundle = grid_moe_bundle
    model = load_model(bundle)
    logits = np.asarray(generator(model, PROMPT, 1).get_output("logits"))[0]
    reference = hf_reference_logits(ckpt, np.asarray([PROMPT]), 0).prefill.logits[0]
    np.testing.assert_allclose(logits, reference, atol=1e-4 * np.abs(reference).max())
    ours = greedy_tokens(model, PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)


def _int4_package(ckpt, ep: str, dtype: str | None = "f32"):
    """An int4 build in `dtype` (None: the EP's default) quantized as `package` does."""
    target = resolve_target(ep, dtype=dtype, precision="int4", int4=OPTIONS)
    built = mobius_genai.build(ckpt, target=target, progress=False)
    quantize_package(built, target)
    return built


@pytest.mark.parametrize("dtype", ["f32", None], ids=["fp32", "ep-default"])
@pytest.mark.parametrize("ep", ["cuda", "dml", "webgpu", "onnx-standard", "default"])
def test_every_ep_expands_the_quantized_body_with_the_op_its_table_allows(
    ep, dtype, moe_checkpoint
):
    """No EP keeps a MoE or QMoE node or a float expert stack; GatherBlockQuantized reads the
    codes where the EP's table has it for the dtype, else standard ops unpack the nibbles; in
    fp32 and in the EP's default dtype (fp16 scales for cuda, dml and webgpu)."""
    built = _int4_package(moe_checkpoint, ep, dtype)
    model = built[built.decoder_key]
    nodes = list(model.graph.all_nodes())
    ops = Counter(node.op_type for node in nodes)
    assert not ops["MoE"] and not ops["QMoE"] and not ops["If"]
    stacked = [v for v in model.graph.initializers.values() if ".experts." in (v.name or "")]
    scales = {v.dtype for v in stacked} - {ir.DataType.UINT8}
    assert stacked and scales == {built.dtype}
    gathers = built.dtype in get_ep(ep).kernel_dtypes("GatherBlockQuantized")
    unpacked = ops["BitShift"]
    assert (ops["GatherBlockQuantized"] >= 12, unpacked) == (gathers, 0 if gathers else 12 * 2)
    if ep == "onnx-standard":
        assert all(node.domain in ("", "ai.onnx") for node in nodes)


def test_onnx_standard_graph_runs_on_cpu_near_transformers(moe_checkpoint, tmp_path):
    """The onnx-standard int4 graph (its experts unpacked by standard ops; its body's standard
    semantics: the body test above) runs on onnxruntime's CPU EP, its logits within the int4
    bound of transformers'."""
    package = _int4_package(moe_checkpoint, "onnx-standard")
    ids = qmoe_ids()
    logits = qmoe_logits(package, tmp_path)
    reference = hf_reference_logits(moe_checkpoint, ids, 0).prefill.logits
    assert _relative_rms(logits, reference) <= INT4_RELATIVE_RMS


def test_a_graph_built_for_int4_and_saved_without_it_has_float_experts_expanded(
    moe_checkpoint, tmp_path
):
    """build() with an int4 target leaves the GeGLU MoE nodes for quantize_package; saving the
    package without it expands their float body (no MoE node, which no kernel would run)."""
    target = resolve_target("cpu", dtype="f32", precision="int4", int4=OPTIONS)
    built = mobius_genai.build(moe_checkpoint, target=target, progress=False)
    assert any(node.op_type == "MoE" for node in built[built.decoder_key].graph)
    logits = qmoe_logits(built, tmp_path)
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert not ops["MoE"] and ops["If"] == 6
    reference = hf_reference_logits(moe_checkpoint, qmoe_ids(), 0).prefill.logits
    np.testing.assert_allclose(logits, reference, atol=1e-4)
