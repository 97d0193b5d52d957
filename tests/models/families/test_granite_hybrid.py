"""Granite-4.0-H (granitemoehybrid: Mamba2 layers between attention layers, MoE beside a shared
MLP) beyond the family parity table: a prefill of several of transformers' scan chunks then
decode steps carrying both states, on the portable, cpu and strict-ONNX graphs; graphs with a
wrong scan or norm fail it; a left-padded batch; the hub's config spellings; the states and
genai_config as onnxruntime-genai 0.18 reads them; refused configs; int4; float16.
(onnxruntime-genai's greedy tokens against transformers': tests/models/families/test_bundles.py.)"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import ConfigError, packager
from mobius_genai.bundle.graph import TensorSpec
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.components import mamba2
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
    run_like_reference,
)

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("granite") / "ckpt", "granitemoehybrid")


@pytest.fixture(scope="module")
def long_run(granite):
    """transformers' chunked scan over 70 tokens, then 4 single-token decode steps."""
    return long_prefill_reference(granite)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_long_prefill_then_decode_matches_transformers(granite, long_run, ep, domains, tmp_path):
    built, diff = built_graph_diff(granite, long_run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def _skip_softplus(model: ir.Model) -> None:
    """dt + dt_bias used as dt, without its softplus."""
    nodes = [node for node in model.graph.all_nodes() if node.op_type == "Softplus"]
    assert len(nodes) == 2
    for node in nodes:
        ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])


def _swap_b_and_c(model: ir.Model) -> None:
    """The scan reads C as its input projection and B as its output one."""
    calls = [node for node in model.graph.all_nodes() if node.op_type == "LinearAttention"]
    assert len(calls) == 2
    for node in calls:
        c, b = node.inputs[0], node.inputs[1]
        node.replace_input_with(0, b)
        node.replace_input_with(1, c)


@pytest.mark.parametrize("mutate", [_skip_softplus, _swap_b_and_c])
def test_a_graph_with_a_wrong_scan_fails_parity(granite, long_run, mutate, tmp_path):
    package = mobius_genai.build(granite, "cpu", "f32")
    mutate(package["model"])
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert not max_abs_diff(ours, long_run.logits) <= 10 * TOLERANCE  # NaN fails it too


def test_a_norm_over_all_groups_at_once_fails_parity(granite, long_run, tmp_path, monkeypatch):
    """Granite's gated norm normalizes each of the 2 groups apart (Bamba's, all channels)."""
    whole = mamba2.GatedGroupRMSNorm
    monkeypatch.setattr(
        mamba2, "GatedGroupRMSNorm", lambda size, _, eps, first: whole(size, 1, eps, first)
    )
    package = mobius_genai.build(granite, "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert not max_abs_diff(ours, long_run.logits) <= 10 * TOLERANCE


def test_left_padded_batch_matches_transformers(granite, tmp_path):
    """Padding stays out of both states: transformers zeroes padded inputs and conv outputs,
    so the scan adds nothing there (and decays a state that is still zero)."""
    first, rest = left_padded_diffs(granite, tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def test_hub_config_spellings_match_transformers(tmp_path):
    """Hub configs say "mamba" / "attention" and position_embedding_type "nope", with no
    time_step_limit; transformers 5 writes "linear_attention" / "full_attention", null and
    (0, Infinity)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "granitemoehybrid", seed=2)
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["layer_types"] == ["linear_attention", "full_attention", "linear_attention"]
    del raw["time_step_limit"]
    raw |= {"layer_types": ["mamba", "attention", "mamba"], "position_embedding_type": "nope"}
    (ckpt / "config.json").write_text(json.dumps(raw))
    ids = np.random.default_rng(3).integers(3, 128, size=(1, 20))
    reference = hf_reference_logits(ckpt, ids, decode_steps=2)
    ours = run_like_reference(
        ort_session(mobius_genai.build(ckpt, "default", "f32"), tmp_path / "onnx"), reference
    )
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"time_step_limit": [0.0, 1.0]}, "time_step_limit"),
        ({"layer_types": ["mamba", "conv", "mamba"]}, "layer_types"),
        ({"mamba_n_heads": 3}, "mamba_n_heads"),
        ({"mamba_n_groups": 3, "mamba_n_heads": 4}, "mamba_n_groups"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_a_config_the_block_cannot_build_is_refused_in_one_line(granite, changes, field):
    raw = {**json.loads((granite / "config.json").read_text()), **changes}
    with pytest.raises(ConfigError, match=field) as error:
        get_family("granitemoehybrid").parse_config(raw)
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granite_bundle")
    return packager.package(
        bundle_checkpoint(folder / "ckpt", "granitemoehybrid"), "cpu", folder / "b", quiet=True
    )


def test_states_and_genai_config_as_onnxruntime_genai_reads_them(cpu_bundle):
    """onnxruntime-genai 0.18 has no Mamba2 model type; its generic decoder derives
    past_key_values.%d.conv_state / .recurrent_state from the KV patterns and finds the Mamba2
    layers by the graph's inputs."""
    config = json.loads((cpu_bundle / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder"
    assert not {"layer_types", "conv_cache_size"} & decoder.keys()
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
        # [batch, x|B|C channels (64 + 2 * 2 * 8), taps - 1]; [batch, heads, state, head_dim]
        assert side[f"{prefix}.0.conv_state"] == TensorSpec(f32, ("batch_size", 96, 3))
        assert side[f"{prefix}.2.recurrent_state"] == TensorSpec(f32, ("batch_size", 4, 8, 16))


def test_int4_bundle_generates(tmp_path):
    """The Mamba2, attention and shared-MLP projections and the routers become MatMulNBits,
    the experts QMoE; both states stay float32."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "granitemoehybrid")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    model = ir.load(folder / "model.onnx")
    ops = [node.op_type for node in model.graph.all_nodes()]
    assert "MatMul" not in ops and "MoE" not in ops
    assert ops.count("QMoE") == 3
    quantized = {
        node.inputs[1].name.rsplit(".weight", 1)[0]
        for node in model.graph.all_nodes()
        if node.op_type == "MatMulNBits"
    }
    assert {f"model.layers.{i}.mamba.{p}_proj" for i in (0, 2) for p in ("in", "out")} <= quantized
    # per layer: the router and the shared MLP's gate, up and down; q + k packed, v and o
    # (attention) or in_proj and out_proj (Mamba2); lm_head
    assert len(quantized) == 3 * 4 + 3 + 2 * 2 + 1
    assert {"LinearAttention", "CausalConvWithState"} <= set(ops)
    states = [value for value in model.graph.inputs if value.name.endswith("_state")]
    assert len(states) == 4 and {value.dtype for value in states} == {ir.DataType.FLOAT}
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


def test_float16_graph_runs_the_scan_and_its_state_in_float32(granite):
    """The scan's inputs, its state and the gated norm's statistics are float32 in a float16
    model, as transformers computes them; the conv state follows the model dtype."""
    model = mobius_genai.build(granite, "cpu", "f16", load_weights=False)["model"]
    calls = [node for node in model.graph if node.op_type == "LinearAttention"]
    assert len(calls) == 2
    for node in calls:
        values = [value for value in (*node.inputs, *node.outputs) if value is not None]
        assert {value.dtype for value in values} == {ir.DataType.FLOAT}
    states = {v.name: v.dtype for v in model.graph.inputs if v.name.endswith("_state")}
    assert states == {
        **{f"past_key_values.{i}.conv_state": ir.DataType.FLOAT16 for i in (0, 2)},
        **{f"past_key_values.{i}.recurrent_state": ir.DataType.FLOAT for i in (0, 2)},
    }
