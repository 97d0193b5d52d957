"""Qwen3-Next (qwen3_next: qwen3_5_text's hybrid with q|k|v|z and b|a packed per key head, and
MoE blocks with a shared expert) beyond the family tables: a prefill longer than transformers'
64-token chunks then decode steps carrying both states, on the portable, cpu and strict-ONNX
graphs; the packed projections unpacked in the wrong order fail it; the ops each graph holds;
int4. (onnxruntime-genai's greedy tokens against transformers': tests/models/families/test_bundles.py.)
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import onnx_ir as ir
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3NextConfig

import mobius_genai
from mobius_genai import WeightsError, packager
from mobius_genai.models import FAMILIES
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import (
    hf_float64_logits,
    load_reference_model,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import long_prefill_reference, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3_next") / "ckpt", "qwen3_next")


@pytest.fixture(scope="module")
def long_run(qwen3_next):
    """transformers' chunked prefill of 70 tokens, then 4 per-token decode steps."""
    return long_prefill_reference(qwen3_next)


@pytest.fixture(scope="module")
def exact(qwen3_next, long_run):
    """The same calls in float64, and how far transformers' float32 run lies from them."""
    logits = hf_float64_logits(qwen3_next, long_run)
    return logits, max_abs_diff(long_run.logits, logits)


def _bound(exact) -> float:
    """The error allowed against the float64 logits: 1e-4, or transformers' own float32 error
    where that is larger (on this fixture 3e-4: 70 steps of the gated delta recurrence, the
    (1 + w) norms at w ~ 1 and the experts amplify float32 rounding)."""
    return max(TOLERANCE, exact[1])


@pytest.mark.parametrize(
    ("ep", "fused"),
    [
        # Tier-1 calls whose function bodies runtimes without the kernels run
        ("default", {"LinearAttention", "CausalConvWithState", "MoE"}),
        ("cpu", {"LinearAttention", "CausalConvWithState", "MoE", "GroupQueryAttention"}),
        ("onnx-standard", set()),  # the bodies inlined: a Scan carries the state
    ],
)
def test_long_prefill_then_decode_matches_transformers(
    qwen3_next, long_run, exact, ep, fused, tmp_path
):
    """Within 1e-4 of transformers' float64 logits or at least as close as its float32 run."""
    package = mobius_genai.build(qwen3_next, ep, "f32")
    model = package["model"]
    custom = {node.op_type for node in model.graph.all_nodes() if node.domain == "com.microsoft"}
    assert fused <= custom and (fused or not custom)
    assert {op_type for _, op_type, _ in model.functions} >= fused - {"GroupQueryAttention"}
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert max_abs_diff(ours, exact[0]) <= _bound(exact)
    assert max_abs_diff(ours, long_run.logits) <= 2 * _bound(exact)


def test_the_prompt_routes_tokens_to_every_expert(qwen3_next, long_run):
    """The parity above covers each expert's weights: transformers' router sends some of the
    prompt's tokens to every expert of both MoE layers."""
    model = load_reference_model(qwen3_next)
    chosen = []
    for layer in (0, 1):
        block = model.model.layers[layer].mlp
        block.gate.register_forward_hook(lambda m, i, out: chosen.append(out[2]))
    model(input_ids=torch.tensor(long_run.prefill.input_ids))
    assert len(chosen) == 2
    for picks in chosen:
        assert set(picks.flatten().tolist()) == set(range(4))


def _swapped(part_a: str, part_b: str):
    """The qwen3_next row with two segments of its packed projections exchanged."""
    family = FAMILIES["qwen3_next"]
    grouped = []
    for weight in family.grouped_weights:
        segments = tuple(
            {part_a: part_b, part_b: part_a}.get(segment, segment) for segment in weight.segments
        )
        grouped.append(dataclasses.replace(weight, segments=segments))
    return dataclasses.replace(family, grouped_weights=tuple(grouped))


@pytest.mark.parametrize(("part_a", "part_b"), [("q", "k"), ("v", "z"), ("b", "a")])
def test_packed_projections_unpacked_in_the_wrong_order_fail_parity(
    qwen3_next, long_run, exact, part_a, part_b, tmp_path, monkeypatch
):
    monkeypatch.setitem(FAMILIES, "qwen3_next", _swapped(part_a, part_b))
    package = mobius_genai.build(qwen3_next, "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert not max_abs_diff(ours, exact[0]) <= 10 * _bound(exact)  # NaN fails it too


def test_genai_config_runs_it_as_qwen3_5_moe_text(tmp_path):
    """onnxruntime-genai 0.18 lists no qwen3_next; qwen3_5_moe_text is its type for the same
    hybrid with MoE blocks (its RecurrentState finds the states by the graph's inputs)."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "qwen3_next")
    folder = packager.package(ckpt, "cpu", tmp_path / "b", quiet=True)
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["type"] == "qwen3_5_moe_text"


def test_int4_bundle_generates(tmp_path):
    """Projections of both layer kinds, the shared expert and the dense MLP become MatMulNBits,
    the experts QMoE; both states stay float32."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "qwen3_next")
    int4 = Int4Options(block_size=16)  # the shared expert's 48 inputs
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=int4, quiet=True
    )
    model = ir.load(folder / "model.onnx")
    ops = [node.op_type for node in model.graph.all_nodes()]
    assert "MatMul" not in ops
    # delta nets: qkv, z, a, b, out; attention: q, k, v, o; MoE blocks: router, the shared
    # expert's 3 and its gate; the dense MLP's 3; lm_head
    assert ops.count("MatMulNBits") == (5 + 5) + (4 + 5) + (5 + 3) + 1
    assert {"LinearAttention", "CausalConvWithState", "QMoE"} <= set(ops)
    states = [value for value in model.graph.inputs if value.name.endswith("_state")]
    assert len(states) == 4 and {value.dtype for value in states} == {ir.DataType.FLOAT}
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


def test_the_multi_token_prediction_head_is_left_unread(qwen3_next, tmp_path):
    """Hub checkpoints carry an `mtp.*` head that transformers ignores on load; so does the
    build (any other unread tensor is an error)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(qwen3_next, ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    tensors["mtp.fc.weight"] = np.ones((64, 128), np.float32)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    mobius_genai.build(ckpt, "default", "f32")  # no error: the mtp head is left unread
    tensors["model.stray.weight"] = np.ones((2, 2), np.float32)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match="model.stray.weight"):
        mobius_genai.build(ckpt, "default", "f32")


def test_defaults_of_absent_keys_as_qwen3_next_config_fills_them():
    """A config.json without norm_topk_prob, partial_rotary_factor or layer_types reads as
    Qwen3NextConfig fills them: renormalized top-k, rotary on a quarter of head_dim, every
    fourth layer attention."""
    raw = tiny_config("qwen3_next", num_hidden_layers=8, layer_types=None).to_dict()
    for key in ("norm_topk_prob", "layer_types", "rope_parameters"):
        del raw[key]
    raw["rope_theta"] = 10000.0
    expected = Qwen3NextConfig(**raw)
    assert expected.norm_topk_prob and expected.rope_parameters["partial_rotary_factor"] == 0.25
    config = FAMILIES["qwen3_next"].parse_config(raw)
    assert config.moe.normalize_top_k is True
    assert config.rope.partial_rotary_factor == 0.25
    assert list(config.layer_types) == expected.layer_types
