"""Mixture-of-experts families vs transformers, and what each EP's graph holds.

f32, 2 x 12-token prefill + 4 cached decode steps, measured against transformers' float64 logits
(the exact math) on the portable graph (MoE kept as com.microsoft::MoE, run by onnxruntime's
kernel), the cpu graph (the fused kernel beside GQA) and onnx-standard (the MoE body inlined into
standard ONNX). Tiny checkpoints have 4 experts, 2 per token, so the prompt's tokens pick different
pairs (checked below).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import mobius_genai
from mobius_genai.errors import ConfigError, UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.alias_rows import ALIASES
from tests._hf import (
    ReferenceRun,
    edit_config,
    hf_float64_logits,
    hf_reference_logits,
    load_reference_model,
    write_tiny_checkpoint,
)
from tests._mutants import with_moe
from tests._ort import graph_diffs, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
# rows of multimodal checkpoints built text-only have their own tests (test_qwen3_5_hub.py)
MOE_FAMILIES = tuple(
    name
    for name, family in FAMILIES.items()
    if family.experts is not None and family.text_only is None
)

CASES = {
    **{family: (family, {}) for family in MOE_FAMILIES},
    "qwen3_moe_not_renormalized": ("qwen3_moe", {"norm_topk_prob": False}),
    "qwen2_moe_every_second_layer_sparse": ("qwen2_moe", {"decoder_sparse_step": 2}),
    "mixtral_top1": ("mixtral", {"num_experts_per_tok": 1}),
    # windows shorter than the prompt in the hub's layout (no layer_types): Qwen2MoeConfig
    # slides in every other layer below max_window_layers, Qwen3MoeConfig in every layer
    **{
        f"{family}_sliding_hub_layout": (
            family,
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}
            | {"hub_layout": True},
        )
        for family in ("qwen2_moe", "qwen3_moe")
    },
    "olmoe_attention_bias_tied": ("olmoe", {"attention_bias": True, "tie_word_embeddings": True}),
    "granitemoe_attention_bias": ("granitemoe", {"attention_bias": True}),
    # mlp_bias read by none of these classes, attention_bias by olmoe and qwen3_moe only
    **{
        f"{family}_attention_bias_mlp_bias": (
            family,
            {"attention_bias": True, "mlp_bias": True},
        )
        for family in ("mixtral", "ernie4_5_moe", "minimax_m2", "olmoe", "qwen3_moe")
    },
}


def _ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 128, size=(2, 12))


def _float32_bound(reference: ReferenceRun, exact: list[np.ndarray]) -> float:
    """The error allowed against the float64 logits: 1e-4, or twice transformers' own float32
    error where that is larger. Float32 runs of the same math in another order (onnxruntime's
    kernels, the inlined standard bodies) carry rounding errors of the same size as
    transformers' own but not the same values, so two of them lie up to the sum of both apart.
    On qwen3_5_moe_text (the gated delta recurrence, (1 + w) norms and a shared expert in every
    layer amplify rounding) transformers' float32 logits lie 4e-5 to 1.2e-4 from the float64
    ones over checkpoint seeds 1-8, and our three graphs 0.8 to 1.7 times as far."""
    return max(TOLERANCE, 2 * max_abs_diff(reference.logits, exact))


def _marks(case: str) -> list[pytest.MarkDecorator]:
    """Alias rows (alias_rows.py: a MoE row under another config class) run slow here; their
    default-run parity is test_alias_rows.py's."""
    return [pytest.mark.slow] if CASES[case][0] in _ALIAS_ROWS else []


_ALIAS_ROWS = {alias.model_type for alias in ALIASES}


@pytest.mark.parametrize("case", [pytest.param(c, marks=_marks(c)) for c in sorted(CASES)])
def test_moe_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=4)
    exact = hf_float64_logits(ckpt, reference)
    steps = [dataclasses.replace(s, logits=x) for s, x in zip(reference.steps, exact, strict=True)]
    diffs = graph_diffs(ckpt, ReferenceRun(steps), EPS, tmp_path, progress=False)
    assert max(diffs.values()) <= _float32_bound(reference, exact), diffs


def test_prompt_routes_tokens_to_different_experts(tmp_path):
    """The parity prompts exercise routing: the first layer's picks differ between tokens."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral", seed=1)
    model = load_reference_model(ckpt)
    picks = []
    router = model.model.layers[0].mlp.gate
    hook = router.register_forward_hook(lambda module, args, out: picks.append(out[2]))
    with torch.no_grad():
        model(torch.tensor(_ids()))
    hook.remove()
    pairs = {tuple(sorted(row)) for row in picks[0].tolist()}
    assert len(pairs) >= 3, pairs


def _mutant_parity(tmp_path, family, mutant, **overrides) -> float:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=1)
    package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(FAMILIES, family, mutant(FAMILIES[family]))
        package = mobius_genai.build(ckpt, "onnx-standard", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "mutant"), reference)
    return max_abs_diff(ours, reference.logits)


MUTANTS = {
    "mixtral_not_renormalized": ("mixtral", lambda f: with_moe(f, normalize_top_k=False)),
    "qwen2_moe_renormalized": ("qwen2_moe", lambda f: with_moe(f, normalize_top_k=True)),
    # the softmax over all experts' logits, not over the two picked
    "aria_text_not_renormalized": ("aria_text", lambda f: with_moe(f, normalize_top_k=False)),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_routing_detail_wrong(case, tmp_path):
    family, mutant = MUTANTS[case]
    assert _mutant_parity(tmp_path, family, mutant) > 10 * TOLERANCE


def test_aria_shared_experts_are_moe_num_shared_experts_wide(tmp_path, monkeypatch):
    """One expert's width (32) where moe_num_shared_experts (2) widen the shared MLP: its
    tensors do not fit."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "aria_text")
    monkeypatch.setitem(
        FAMILIES, "aria_text", with_moe(FAMILIES["aria_text"], shared_expert_size=32)
    )
    with pytest.raises(WeightsError, match="shared_experts.gate_proj.weight' has shape"):
        mobius_genai.build(ckpt, "default", "f32")


def test_a_shared_expert_read_without_its_gate_is_refused(tmp_path):
    """An ungated shared expert would drop the checkpoint's gate: named before anything runs."""
    with pytest.raises(WeightsError, match="shared_expert_gate.weight"):
        _mutant_parity(tmp_path, "qwen2_moe", lambda f: with_moe(f, shared_expert_gate=False))


@pytest.mark.parametrize(
    ("ep", "fused"), [("default", True), ("cpu", True), ("cuda", False), ("onnx-standard", False)]
)
def test_moe_op_where_the_capability_says(ep, fused, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "qwen3_moe")
    graph = mobius_genai.build(ckpt, ep, "f32", load_weights=False)["model"].graph
    ops = [(node.domain, node.op_type) for node in graph]
    # mlp_only_layers [1]: layers 0 and 2 run experts
    assert ops.count(("com.microsoft", "MoE")) == (2 if fused else 0)
    if ep == "onnx-standard":
        assert {domain for domain, _ in ops} == {""}


def test_more_experts_per_token_than_experts_is_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral")
    edit_config(ckpt, num_experts_per_tok=5)
    with pytest.raises(ConfigError, match="'num_experts_per_tok' is 5, more than the 4 experts"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_unknown_dense_layer_index_is_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "qwen3_moe")
    edit_config(ckpt, mlp_only_layers=[7])
    with pytest.raises(ConfigError, match="'mlp_only_layers' holds \\[7\\]"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_olmoe_clip_qkv_is_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "olmoe")
    edit_config(ckpt, clip_qkv=1.0)
    with pytest.raises(UnsupportedModelError, match="clip_qkv"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_moe_experts_need_silu(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral")
    edit_config(ckpt, hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not supported in MoE experts"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def _rewrite_checkpoint(ckpt, change) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(ckpt / "model.safetensors")
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_missing_expert_tensor_is_named(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral")
    name = "model.layers.1.block_sparse_moe.experts.3.w3.weight"
    _rewrite_checkpoint(ckpt, lambda tensors: tensors.pop(name))
    with pytest.raises(WeightsError, match=f"lacks tensor '{name}'"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_misshapen_fused_expert_tensor_is_named(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "granitemoe")
    name = "model.layers.0.block_sparse_moe.output_linear.weight"

    def change(tensors):
        tensors[name] = tensors[name][:, :, :50].copy()

    _rewrite_checkpoint(ckpt, change)
    with pytest.raises(WeightsError, match=f"'{name}' has shape \\[4, 64, 50\\].*\\[4, 64, 96\\]"):
        mobius_genai.build(ckpt, "cpu", "f32")
