"""gpt_oss: attention sinks, alternating sliding / full layers, clamped SwiGLU experts with
biases, yarn rope; parity with transformers is in test_moe.py (every MoE family on default,
cpu and onnx-standard). Here: that each gpt_oss detail matters (a mutant of it fails parity),
which ops each EP's graph holds, and bad input.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import mobius_genai
from mobius_genai.components import attention
from mobius_genai.config.moe import ExpertActivation
from mobius_genai.config.rope import parse_rope
from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES
from tests._hf import edit_config, hf_reference_logits, load_reference_model, write_tiny_checkpoint
from tests._mutants import with_moe
from tests._ort import max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


def _without_sinks(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(attention, "apply_sinks", lambda op, output, *args: output)


def _unclamped(patch: pytest.MonkeyPatch) -> None:
    activation = ExpertActivation(alpha=1.702, beta=1.0)
    patch.setitem(FAMILIES, "gpt_oss", with_moe(FAMILIES["gpt_oss"], activation=activation))


def _plain_swiglu(patch: pytest.MonkeyPatch) -> None:
    activation = ExpertActivation(limit=1.0)  # alpha 1 and no "+ 1" on up
    patch.setitem(FAMILIES, "gpt_oss", with_moe(FAMILIES["gpt_oss"], activation=activation))


def _every_layer_full(patch: pytest.MonkeyPatch) -> None:
    family = FAMILIES["gpt_oss"]
    overrides = {
        **family.config_overrides,
        "sliding_window": None,
        "layer_types": lambda raw: ("full_attention",) * raw["num_hidden_layers"],
    }
    patch.setitem(FAMILIES, "gpt_oss", dataclasses.replace(family, config_overrides=overrides))


def _yarn_truncated(patch: pytest.MonkeyPatch) -> None:
    """gpt_oss's yarn keeps the correction range unrounded (truncate false); rounded, the
    tiny config's range ends at 2 instead of 1.09."""
    family = FAMILIES["gpt_oss"]
    truncated = {
        **family.config_overrides,
        "rope": lambda raw: dataclasses.replace(parse_rope(raw)[0], truncate=True),
    }
    patch.setitem(FAMILIES, "gpt_oss", dataclasses.replace(family, config_overrides=truncated))


MUTANTS = {
    "yarn_truncated": _yarn_truncated,
    "sinks_dropped": _without_sinks,
    "swiglu_not_clamped": _unclamped,
    "swiglu_without_alpha_and_beta": _plain_swiglu,
    "sliding_window_ignored": _every_layer_full,
}


# the sinks_dropped mutant's Attention keeps its scores output, which GQA cannot fuse
@pytest.mark.filterwarnings("ignore:GQA fusion expected")
@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_gpt_oss_detail_wrong(case, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    for ep in ("cpu", "onnx-standard"):
        package = mobius_genai.build(ckpt, ep, "f32", progress=False)
        ours = run_like_reference(ort_session(package, tmp_path / ep), reference)
        assert max_abs_diff(ours, reference.logits) <= TOLERANCE, ep
    with pytest.MonkeyPatch.context() as patch:
        MUTANTS[case](patch)
        for ep in ("cpu", "onnx-standard"):
            package = mobius_genai.build(ckpt, ep, "f32", progress=False)
            ours = run_like_reference(ort_session(package, tmp_path / f"mutant-{ep}"), reference)
            assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE, ep


def test_tiny_checkpoint_exercises_routing_clamp_and_window(tmp_path):
    """The parity prompts route tokens to different experts, cross the SwiGLU limit, and are
    longer than the sliding window of the sliding layers."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss", seed=1)
    model = load_reference_model(ckpt)
    config = model.config
    assert config.layer_types[:2] == ["sliding_attention", "full_attention"]
    assert config.sliding_window < _ids().shape[1]
    seen = {}
    mlp = model.model.layers[0].mlp

    def keep(key, value) -> None:
        seen.setdefault(key, value)

    hooks = [
        mlp.router.register_forward_hook(lambda m, a, out: keep("picks", out[2])),
        mlp.experts.register_forward_hook(lambda m, a, out: keep("x", a[0])),
    ]
    with torch.no_grad():
        model(torch.tensor(_ids()))
    for hook in hooks:
        hook.remove()
    assert len({tuple(sorted(row)) for row in seen["picks"].tolist()}) >= 3
    gate_up = seen["x"] @ mlp.experts.gate_up_proj[0] + mlp.experts.gate_up_proj_bias[0]
    assert (gate_up.abs() > config.swiglu_limit).float().mean() > 0.1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 5}, "'num_experts_per_tok' is 5, more than the 4 experts"),
        ({"swiglu_limit": -1.0}, "swiglu_limit"),
        ({"swiglu_alpha": "fast"}, "swiglu_alpha"),
    ],
)
def test_bad_gpt_oss_config_is_a_config_error_naming_the_field(changes, message, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    edit_config(ckpt, **changes)
    with pytest.raises(ConfigError, match=message):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_hub_config_without_rope_or_layer_types_gets_gpt_oss_defaults(tmp_path):
    """GptOssConfig's defaults: yarn rope (factor 32, no truncation), sliding layers first."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    data = json.loads((ckpt / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "sliding_window", "swiglu_limit"):
        data.pop(key)
    config = FAMILIES["gpt_oss"].parse_config(data)
    assert (config.rope.type, config.rope.factor, config.rope.truncate) == ("yarn", 32.0, False)
    assert config.rope.theta == 150000.0 and config.sliding_window == 128
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.moe.activation == ExpertActivation(alpha=1.702, beta=1.0, limit=7.0)


@pytest.mark.parametrize(("ep", "fused"), [("default", True), ("cpu", True), ("cuda", False)])
def test_experts_are_one_biased_clamped_moe_node_where_the_capability_says(ep, fused, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    graph = mobius_genai.build(ckpt, ep, load_weights=False)["model"].graph
    moe = [node for node in graph if node.op_type == "MoE"]
    assert len(moe) == (3 if fused else 0)
    for node in moe:
        attrs = node.attributes
        assert node.domain == "com.microsoft" and node.overload == "bias"
        assert [value.name.rsplit(".", 1)[-1] for value in node.inputs[2:]] == [
            "gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"
        ]  # fmt: skip
        assert attrs.get_string("activation_type") == "swiglu"
        assert attrs.get_int("swiglu_fusion") == 1 and attrs.get_int("k") == 2
        assert attrs.get_int("normalize_routing_weights") == 1
        assert attrs.get_float("activation_alpha") == pytest.approx(1.702)
        assert attrs.get_float("activation_beta") == 1.0
        assert attrs.get_float("swiglu_limit") == 1.0


def test_onnx_standard_graph_has_only_standard_ops(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    package = mobius_genai.build(ckpt, "onnx-standard", load_weights=False)
    graph = package["model"].graph
    assert {node.domain for node in graph} == {""} and not package["model"].functions
    assert sum(node.op_type == "Attention" for node in graph) == 3  # the sinks stay standard


def test_hub_layout_config_matches_transformers(tmp_path):
    """config.json as the hub has it (rope_theta + rope_scaling yarn with truncate false)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss", seed=1, hub_layout=True)
    assert json.loads((ckpt / "config.json").read_text())["rope_scaling"]["truncate"] is False
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
