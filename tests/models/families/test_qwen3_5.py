"""Qwen3.5 (qwen3_5_text: gated delta nets between gated attention layers) beyond the family
parity table: a prefill longer than transformers' 64-token chunks then decode steps carrying
both states, on the portable, cpu and strict-ONNX graphs; a graph with a wrong gate fails it;
the portable graph on onnx's reference evaluator; a left-padded batch; the states and genai_config as
onnxruntime-genai 0.18 reads them, and validate's checks of them; int4. (onnxruntime-genai's
greedy tokens against transformers': tests/models/families/test_bundles.py.)"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from transformers import Qwen3_5TextConfig, Qwen3NextConfig

import mobius_genai
from mobius_genai import packager
from mobius_genai.bundle.graph import TensorSpec
from mobius_genai.bundle.validate import check_graph_against_config, validate_bundle
from mobius_genai.models import get_family
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import (
    built_graph_diff,
    left_padded_diffs,
    long_prefill_reference,
    max_abs_diff,
    ort_session,
    reference_evaluator_logits,
    run_like_reference,
)

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "ckpt", "qwen3_5_text")


@pytest.fixture(scope="module")
def long_run(qwen3_5):
    """transformers' chunked prefill of 70 tokens, then 4 per-token decode steps."""
    return long_prefill_reference(qwen3_5)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_long_prefill_then_decode_matches_transformers(qwen3_5, long_run, ep, domains, tmp_path):
    built, diff = built_graph_diff(qwen3_5, long_run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def _drop_gate(model: ir.Model, input_index: int, kept: int) -> str:
    """Feed each LinearAttention's gate `input_index` (masked by the padding: Mul(gate, real))
    from input `kept` of the gate's last op instead; returns that input's op type."""
    calls = [node for node in model.graph.all_nodes() if node.op_type == "LinearAttention"]
    assert len(calls) == 2
    for node in calls:
        masked = node.inputs[input_index].producer()
        gate = masked.inputs[0].producer()
        masked.replace_input_with(0, gate.inputs[kept])
    return gate.inputs[kept].producer().op_type


@pytest.mark.parametrize(
    ("input_index", "kept", "source"),
    [
        (5, 0, "MatMul"),  # beta = b instead of sigmoid(b)
        (4, 1, "Softplus"),  # g = softplus(a + dt_bias): the factor -exp(A_log) lost, g > 0
    ],
)
def test_a_graph_with_a_wrong_gate_fails_parity(
    qwen3_5, long_run, input_index, kept, source, tmp_path
):
    package = mobius_genai.build(qwen3_5, "cpu", "f32")
    assert _drop_gate(package["model"], input_index, kept) == source
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert not max_abs_diff(ours, long_run.logits) <= 10 * TOLERANCE  # NaN fails it too


def test_portable_graph_runs_on_the_reference_evaluator(qwen3_5):
    """A runtime without the kernels (onnx's reference evaluator) runs the Tier-1 bodies of
    CausalConvWithState and LinearAttention and gets transformers' logits."""
    ids = np.random.default_rng(2).integers(3, 128, size=(1, 9))
    reference = hf_reference_logits(qwen3_5, ids, decode_steps=0)
    model = mobius_genai.build(qwen3_5, "default", "f32")["model"]
    logits = reference_evaluator_logits(model, ids)
    assert max_abs_diff([logits], reference.logits) <= TOLERANCE


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_5_bundle")
    return packager.package(
        bundle_checkpoint(folder / "ckpt", "qwen3_5_text"), "cpu", folder / "b", quiet=True
    )


def test_states_and_genai_config_as_onnxruntime_genai_reads_them(cpu_bundle):
    """onnxruntime-genai 0.18's builder writes no recurrent keys for Qwen3.5: its RecurrentState
    derives past_key_values.%d.conv_state / .recurrent_state (present.%d.* on the output side)
    from the KV patterns and finds the layers by the graph's inputs; the KV cache takes the
    attention layers the graph has."""
    config = json.loads((cpu_bundle / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "qwen3_5_text"
    assert not {"layer_types", "conv_cache_size"} & decoder.keys()
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    graph = validate_bundle(cpu_bundle).graph
    f32 = onnx.TensorProto.FLOAT
    for side, prefix in ((graph.inputs, "past_key_values"), (graph.outputs, "present")):
        assert {name for name in side if name.startswith(prefix)} == {
            f"{prefix}.1.key",
            f"{prefix}.1.value",
            *(
                f"{prefix}.{i}.{state}"
                for i in (0, 2)
                for state in ("conv_state", "recurrent_state")
            ),
        }
        # [batch, q|k|v channels, taps - 1] and [batch, value heads, key dim, value dim], float32
        assert side[f"{prefix}.0.conv_state"] == TensorSpec(f32, ("batch_size", 96, 3))
        assert side[f"{prefix}.2.recurrent_state"] == TensorSpec(f32, ("batch_size", 4, 16, 8))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda g: dataclasses.replace(
                g, outputs={k: v for k, v in g.outputs.items() if k != "present.2.recurrent_state"}
            ),
            "graph outputs lack ['present.2.recurrent_state']",
        ),
        (
            lambda g: dataclasses.replace(
                g,
                inputs={
                    **g.inputs,
                    "past_key_values.0.conv_state": TensorSpec(1, ("batch_size", "channels", 3)),
                },
            ),
            "shapes differ between layers",
        ),
        (
            lambda g: dataclasses.replace(
                g,
                inputs={k: v for k, v in g.inputs.items() if not k.endswith(".0.conv_state")},
            ),
            # og finds KV layers by their key inputs and recurrent ones by their conv states:
            # a layer with neither is fed nothing, its recurrent state included
            "'past_key_values.%d.recurrent_state' for layers [0] lack the conv states",
        ),
    ],
)
def test_validate_checks_the_states_against_the_kv_patterns(cpu_bundle, change, problem):
    config = json.loads((cpu_bundle / "genai_config.json").read_text())
    graph = validate_bundle(cpu_bundle).graph
    assert check_graph_against_config(config, graph) == []
    problems = check_graph_against_config(config, change(graph))
    assert any(problem in found for found in problems), problems


def test_int4_bundle_generates(tmp_path):
    """Projections of both layer kinds become MatMulNBits; both states stay float32."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "qwen3_5_text")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    model = ir.load(folder / "model.onnx")
    ops = [node.op_type for node in model.graph.all_nodes()]
    assert "MatMul" not in ops
    # per layer: q, k, v, o, 3 MLP (attention) or qkv, z, a, b, out, 3 MLP (delta nets); lm_head
    assert ops.count("MatMulNBits") == 7 + 2 * 8 + 1
    assert {"LinearAttention", "CausalConvWithState"} <= set(ops)
    states = [value for value in model.graph.inputs if value.name.endswith("_state")]
    assert len(states) == 4 and {value.dtype for value in states} == {ir.DataType.FLOAT}
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


def test_left_padded_batch_matches_transformers(qwen3_5, tmp_path):
    """Padding must not leak into either state: transformers zeroes padded inputs, so q, k, v
    and beta's input are zero there and the states stay zero. (The portable graph, as for
    lfm2: onnxruntime's GroupQueryAttention reads positions from the mask, not padding.)"""
    first, rest = left_padded_diffs(qwen3_5, tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def test_layer_types_from_full_attention_interval_as_transformers_derives_them():
    raw = {**Qwen3_5TextConfig(num_hidden_layers=6).to_dict(), "full_attention_interval": 3}
    del raw["layer_types"]
    expected = Qwen3_5TextConfig(num_hidden_layers=6, full_attention_interval=3).layer_types
    assert expected != Qwen3_5TextConfig(num_hidden_layers=6).layer_types
    config = get_family("qwen3_5_text").parse_config(raw)
    assert list(config.layer_types) == expected


@pytest.mark.parametrize(
    ("family", "config_class"),
    [("qwen3_5_text", Qwen3_5TextConfig), ("qwen3_next", Qwen3NextConfig)],
)
def test_partial_rotary_defaults_to_a_quarter_as_transformers_fills_it(family, config_class):
    raw = config_class(num_hidden_layers=4).to_dict()
    del raw["rope_parameters"]["partial_rotary_factor"]
    hf = config_class.from_dict(json.loads(json.dumps(raw)))  # it fills dicts in place
    expected = int(hf.head_dim * hf.rope_parameters["partial_rotary_factor"])
    assert expected == hf.head_dim // 4
    assert get_family(family).parse_config(raw).rotary_dim == expected


def test_hub_mrope_section_rotates_as_the_one_dimensional_rope(tmp_path):
    """Qwen3.5's hub configs carry the vision model's `mrope_section`; transformers' text model
    gives its three axes the same positions (the plain rope), and onnxruntime-genai feeds
    qwen3_5_text 1-D position_ids."""
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,  # 4 rotated channel pairs of head_dim 32
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt", "qwen3_5_text", rope_parameters=rope, head_dim=32
    )
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 9))
    reference = hf_reference_logits(ckpt, ids, decode_steps=3)
    package = mobius_genai.build(ckpt, "default", "f32")
    positions = next(v for v in package["model"].graph.inputs if v.name == "position_ids")
    assert len(positions.shape) == 2
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_float16_graph_runs_the_recurrence_and_its_state_in_float32(qwen3_5):
    """transformers computes g, beta, the L2 norms and the delta rule in float32 in a float16
    model; the recurrent state input and output stay float32 too."""
    model = mobius_genai.build(qwen3_5, "cuda", "f16", load_weights=False)["model"]
    calls = [node for node in model.graph if node.op_type == "LinearAttention"]
    assert len(calls) == 2
    for node in calls:
        assert {value.dtype for value in (*node.inputs, *node.outputs)} == {ir.DataType.FLOAT}
    states = {v.name: v.dtype for v in model.graph.inputs if v.name.endswith("_state")}
    assert states == {
        **{f"past_key_values.{i}.conv_state": ir.DataType.FLOAT16 for i in (0, 2)},
        **{f"past_key_values.{i}.recurrent_state": ir.DataType.FLOAT for i in (0, 2)},
    }
