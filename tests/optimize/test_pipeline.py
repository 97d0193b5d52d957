"""optimize_model: stages, capability gating, weights left unread, inputs, functions, warnings."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from mobius_genai.components.attention import SLIDING_WINDOW_KEY
from mobius_genai.components.tier1 import MS_DOMAIN, is_standard_domain
from mobius_genai.ep import ep_registry, get_ep
from mobius_genai.errors import ExecutionProviderError
from mobius_genai.optimize import optimize_model
from tests.optimize._graphs import (
    clone,
    max_diff,
    op_counts,
    parse,
    run_decoder,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-4  # f32 logits, optimized vs portable graph, prefill + 4 decode steps
F32, F16 = ir.DataType.FLOAT, ir.DataType.FLOAT16


def _decoder(layers: int = 3, weights: str = "memory", dtype: str = "f32", **overrides) -> ir.Model:
    """A tiny decoder (tied embeddings unless overridden)."""
    overrides.setdefault("tie_word_embeddings", True)
    config = tiny_config(num_hidden_layers=layers, **overrides)
    return tiny_decoder(config, dtype=dtype, weights=weights)[0]


def _custom_nodes(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph.all_nodes() if not is_standard_domain(n.domain)]


# ------------------------------------------------------------------ arguments


def test_unknown_ep_raises_the_registrys_value_error_with_the_supported_names():
    with pytest.raises(ValueError) as caught:
        optimize_model(_decoder(1, "none"), ep="rocm")
    assert (
        str(caught.value) == f"Unknown execution provider 'rocm'. Supported: {sorted(ep_registry)}"
    )
    assert isinstance(caught.value, ExecutionProviderError)


def test_role_and_dtype_are_checked():
    with pytest.raises(ValueError, match="Unknown model_role 'decodr'"):
        optimize_model(_decoder(1, "none"), model_role="decodr")
    with pytest.raises(TypeError, match="ir.DataType"):
        optimize_model(_decoder(1, "none"), dtype="f16")


# ------------------------------------------------------------------ Stage 1


def test_cleanup_removes_identities_duplicates_and_folds_small_constants():
    model = parse(
        """agraph (float[2,4] x) => (float[2,4] y) {
            a = Identity(x)
            one = Constant<value = float[4] {1, 1, 1, 1}>()
            two = Add(one, one)
            p = Mul(a, two)
            q = Mul(a, two)
            y = Add(p, q)
        }"""
    )
    node = next(iter(model.graph))
    node.metadata_props["pkg.onnxscript.class_hierarchy"] = "['Model']"
    node.metadata_props[SLIDING_WINDOW_KEY] = "5"
    optimize_model(model, "default")
    assert op_counts(model) == {"Mul": 1, "Add": 1}
    (mul,) = [n for n in model.graph if n.op_type == "Mul"]
    assert mul.inputs[0].name == "x"
    np.testing.assert_array_equal(mul.inputs[1].const_value.numpy(), [2, 2, 2, 2])


def test_tool_metadata_is_stripped_and_mobius_facts_kept():
    model = _decoder(2, "none", sliding_window=8, layer_types=("sliding_attention",) * 2)
    optimize_model(model, "default")
    keys = {key for node in model.graph for key in node.metadata_props}
    assert not any(key.startswith("pkg.onnxscript.") for key in keys)
    attention = [n for n in model.graph if n.op_type == "Attention"]
    assert [n.metadata_props[SLIDING_WINDOW_KEY] for n in attention] == ["8", "8"]


def _recording_weights(model: ir.Model) -> list[tuple[str, int]]:
    """Give every parameter a lazy tensor that records (name, size) when it is read."""
    reads: list[tuple[str, int]] = []
    rng = np.random.default_rng(0)
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            continue
        dtype, shape = value.dtype, ir.Shape(value.shape.numpy())
        array = (0.1 * rng.standard_normal(shape.numpy())).astype(dtype.numpy())

        def load(name=value.name, array=array) -> ir.TensorProtocol:
            reads.append((name, array.size))
            return ir.Tensor(array, name=name)

        value.const_value = ir.LazyTensor(load, dtype=dtype, shape=shape, name=value.name)
    return reads


@pytest.mark.parametrize(
    ("ep", "dtype"),
    [("default", "f32"), ("cpu", "f32"), ("onnx-standard", "f32"), ("cuda", "f16"), ("dml", "f16")],
)
def test_lazily_loaded_weights_are_never_read(ep, dtype):
    config = tiny_config(num_hidden_layers=2, tie_word_embeddings=True)
    model, _ = tiny_decoder(config, dtype=dtype, weights="none")
    reads = _recording_weights(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        optimize_model(model, ep, ir.DataType.FLOAT16 if dtype == "f16" else F32)
    assert reads == []


def test_a_large_initializer_read_only_by_a_transpose_is_not_folded_into_a_copy():
    model = parse(
        """agraph (float[2,96] h) => (float[2,128] y) {
            t = Transpose<perm=[1, 0]>(w)
            y = MatMul(h, t)
        }"""
    )
    weight = ir.Value(name="w", shape=ir.Shape([128, 96]), type=ir.TensorType(F32))
    weight.const_value = ir.tensor(np.zeros((128, 96), np.float32), name="w")
    model.graph.register_initializer(weight)
    model.graph.node(0).replace_input_with(0, weight)
    optimize_model(model, "onnx-standard")  # no FusedMatMul: the Transpose must stay
    assert op_counts(model) == {"Transpose": 1, "MatMul": 1}
    assert list(model.graph.initializers) == ["w"]


def test_the_tied_head_shares_the_embedding_table_on_every_ep():
    for ep in ("default", "onnx-standard"):
        model = _decoder(2, "none")
        optimize_model(model, ep)
        table = model.graph.initializers["model.embed_tokens.weight"]
        readers = sorted(node.op_type for node, _ in table.uses())
        assert readers == (
            ["FusedMatMul", "Gather"] if ep == "default" else ["Gather", "Transpose"]
        )
        shapes = [tuple(v.shape) for v in model.graph.initializers.values()]
        assert shapes.count(tuple(table.shape)) == 1


# ------------------------------------------------------------------ EP graphs run in ORT


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """A 3-layer tied decoder with random weights and its portable logits."""
    config = tiny_config(num_hidden_layers=3, tie_word_embeddings=True)
    model, _ = tiny_decoder(config, seed=3)
    return config, model, run_decoder(clone(model), config, tmp_path_factory.mktemp("portable"))


def test_default_keeps_function_bodies_and_runs_like_the_portable_graph(portable, tmp_path):
    config, source, expected = portable
    model = clone(source)
    optimize_model(model, "default")
    assert set(model.functions) == {
        (MS_DOMAIN, "SkipSimplifiedLayerNormalization", ""),
        (MS_DOMAIN, "FusedMatMul", "transB"),
    }
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    assert max_diff(run_decoder(model, config, tmp_path), expected) <= TOLERANCE


def test_onnx_standard_has_only_standard_ops_and_runs_like_the_portable_graph(portable, tmp_path):
    config, source, expected = portable
    model = clone(source)
    optimize_model(model, "onnx-standard")
    assert _custom_nodes(model) == []
    assert not model.functions
    assert set(model.opset_imports) == {""}
    assert max_diff(run_decoder(model, config, tmp_path), expected) <= TOLERANCE


def test_retargeting_a_default_graph_expands_what_the_new_ep_cannot_run(portable, tmp_path):
    config, source, expected = portable
    model = clone(source)
    optimize_model(model, "default")
    trt = clone(model)
    report = optimize_model(trt, "trt-rtx")
    # trt-rtx has no SkipLayerNorm kernels but runs FusedMatMul: only the former is expanded.
    assert report.matches["InlinePass"] == 6
    assert _custom_nodes(trt) == ["FusedMatMul"]
    assert set(trt.functions) == {(MS_DOMAIN, "FusedMatMul", "transB")}

    report = optimize_model(model, "onnx-standard")
    assert report.matches["InlinePass"] == 7
    assert _custom_nodes(model) == [] and not model.functions
    assert max_diff(run_decoder(model, config, tmp_path), expected) <= TOLERANCE


def test_a_custom_op_without_a_body_on_a_standard_only_ep_is_an_error():
    model = parse(
        """agraph (float[1,2,8] q) => (float[1,2,8] y) {
            y = com.microsoft.GroupQueryAttention<num_heads=1, kv_num_heads=1>(q)
        }""",
        header='<ir_version: 10, opset_import: ["" : 24, "com.microsoft" : 1]>',
    )
    with pytest.raises(ExecutionProviderError, match="com.microsoft::GroupQueryAttention"):
        optimize_model(model, "onnx-standard")


# ------------------------------------------------------------------ gating and roles


def test_decisions_follow_capability_fields_not_names():
    renamed = dataclasses.replace(get_ep("trt-rtx"), name="my-rtx")
    graphs = []
    for ep in (get_ep("trt-rtx"), renamed):
        model = _decoder(2, "none", dtype="f16")
        optimize_model(model, ep, F16)
        graphs.append([(n.domain, n.op_type) for n in model.graph])
    assert graphs[0] == graphs[1]
    no_skip = dataclasses.replace(get_ep("default"), name="no-skip", supports_skip_layer_norm=False)
    report = optimize_model(_decoder(2, "none"), no_skip)
    assert "SkipNorm" not in report.matches
    assert report.skipped["SkipNorm"] == "supports_skip_layer_norm=False"


def test_only_decoders_get_gqa():
    decoder = optimize_model(_decoder(2, "none"), "cpu", F32)
    assert decoder.matches["GQAFusion"] == 2
    vision = optimize_model(_decoder(2, "none"), "cpu", F32, model_role="vision")
    assert "GQAFusion" not in vision.matches
    assert vision.skipped["GQAFusion"].startswith("role 'vision'")


LONE_ATTENTION = """
agraph (float[1,4,8] q, float[1,4,8] k, float[1,4,8] v) => (float[1,4,8] y) {
    y = Attention<q_num_heads=2, kv_num_heads=2>(q, k, v)
}
"""


def test_warns_when_gqa_was_expected_but_none_formed():
    with pytest.warns(UserWarning) as caught:
        report = optimize_model(parse(LONE_ATTENTION), "cpu", F32)
    expected = (
        "GQA fusion expected for ep='cpu'/dtype=FLOAT but found 0 GroupQueryAttention and 1 "
        "Attention nodes. The model may run slower than expected on this EP. Check that the "
        "attention pattern matches the GQA rewrite rule."
    )
    assert [str(w.message) for w in caught] == [expected]
    assert report.warnings == [expected]


@pytest.mark.parametrize(
    ("ep", "role"), [("default", "decoder"), ("cpu", "vision"), ("cuda", "decoder")]
)
def test_no_gqa_warning_where_gqa_is_not_expected(ep, role):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = optimize_model(parse(LONE_ATTENTION), ep, F32, model_role=role)
    assert report.warnings == []


# ------------------------------------------------------------------ Stage 4


def test_unread_inputs_go_but_those_genai_always_feeds_stay():
    model = parse(
        """agraph (int64[1,3] input_ids, int64[1,3] attention_mask, int64[1,3] position_ids,
                   float[1,2,0,4] past_key, float[1,8] unused) => (int64[1,3] y) {
            y = Identity(input_ids)
        }"""
    )
    model.graph.inputs[3].name = "past_key_values.0.key"  # the text syntax has no dotted names
    optimize_model(model, "default")
    assert [v.name for v in model.graph.inputs] == [
        "input_ids",
        "attention_mask",
        "past_key_values.0.key",
    ]


def test_position_ids_leave_once_gqa_computes_positions_and_stay_otherwise():
    fused = _decoder(2, "none")
    optimize_model(fused, "cpu", F32)
    portable = _decoder(2, "none")
    optimize_model(portable, "default")
    assert "position_ids" not in [v.name for v in fused.graph.inputs]
    assert "position_ids" in [v.name for v in portable.graph.inputs]


def test_graphs_built_without_weights_get_the_same_rewrites():
    graphs = []
    for weights in ("none", "memory"):
        model = _decoder(2, weights)
        optimize_model(model, "cpu", F32)
        graphs.append([(n.domain, n.op_type) for n in model.graph])
    assert graphs[0] == graphs[1]
