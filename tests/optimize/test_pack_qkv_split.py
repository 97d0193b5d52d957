"""PackQKVSplit: q/k/v projections with per-projection ops (q/k norms) before GQA → one packed
MatMul and a Split, on tiny graphs (ORT CPU before/after) and through the cpu pipeline."""

from __future__ import annotations

import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.optimize.rules import gqa, pack_qkv_split
from tests._hf import write_tiny_checkpoint
from tests.optimize._graphs import (
    apply,
    clone,
    max_diff,
    nodes,
    run_decoder,
    tiny_config,
    tiny_decoder,
)

# config overrides → per-head (qwen3, gemma3) or whole-projection (olmo2) q/k norms, or
# per-head norms after a query split from its output gate (qwen3_5: q_proj yields [q_h | gate_h])
QK_NORMS = {
    "per_head": {"qk_norm": True, "head_dim": 32},
    "whole_projection": {"qk_norm": True, "qk_norm_per_head": False},
    "gated_query": {"qk_norm": True, "head_dim": 32, "attention_output_gate": True},
}


def _projections(model: ir.Model) -> list[ir.Node]:
    """MatMul nodes reading a q/k/v (or packed qkv) projection weight."""
    return [
        node
        for node in nodes(model, "MatMul")
        if any(f"{p}_proj" in (node.inputs[1].name or "") for p in ("q", "k", "v", "qkv"))
    ]


@pytest.mark.parametrize("norms", sorted(QK_NORMS))
def test_projections_become_one_matmul_and_a_split(norms, tmp_path):
    config = tiny_config(**QK_NORMS[norms])
    model, _ = tiny_decoder(config)
    apply(model, gqa.rules())
    assert len(_projections(model)) == 3 * config.num_hidden_layers
    before = run_decoder(model, config, tmp_path / "before")
    packed = clone(model)
    split_pass = pack_qkv_split.PackQKVSplitPass()
    apply(packed, split_pass)
    assert split_pass.matched == config.num_hidden_layers and not split_pass.kept
    projections = _projections(packed)
    assert len(projections) == config.num_hidden_layers
    query_heads = config.num_attention_heads * (2 if config.attention_output_gate else 1)
    width = (query_heads + 2 * config.num_key_value_heads) * config.head_dim
    for layer, node in enumerate(projections):
        weight = node.inputs[1]
        assert weight.name == f"model.layers.{layer}.self_attn.qkv_proj.weight"
        assert list(weight.shape) == [config.hidden_size, width]
        (split,) = [user for user, _ in node.outputs[0].uses()]
        assert split.op_type == "Split" and len(split.outputs) == 3
    for node in nodes(packed, "GroupQueryAttention"):
        assert node.inputs[gqa.KEY] is not None  # the norms still sit between Split and GQA
        assert node.inputs[gqa.QUERY].producer().op_type != "Split"
    after = run_decoder(packed, config, tmp_path / "after")
    assert max_diff(before, after) == 0.0  # the same products, column by column


def test_declines_projections_of_different_inputs():
    config = tiny_config(qk_norm=True, head_dim=32, num_hidden_layers=1)
    model, _ = tiny_decoder(config)
    apply(model, gqa.rules())
    (k_proj,) = [n for n in _projections(model) if "k_proj" in n.inputs[1].name]
    other = ir.node("Neg", [k_proj.inputs[0]], name="other_input")
    other.outputs[0].dtype = k_proj.inputs[0].dtype
    other.outputs[0].shape = k_proj.inputs[0].shape
    model.graph.insert_before(k_proj, other)
    k_proj.replace_input_with(0, other.outputs[0])
    split_pass = pack_qkv_split.PackQKVSplitPass()
    apply(model, split_pass)
    assert split_pass.matched == 0
    assert any("different inputs" in reason for reason in split_pass.kept)
    assert len(_projections(model)) == 3


# qwen3_5_text: its one attention layer, with heads of 64 (not the tiny 16) so that GQA can
# rotate its quarter (cos/sin tables 8 wide) and q/k reach GQA through the norms only
@pytest.mark.parametrize(
    ("family", "layers", "overrides"),
    [
        ("gemma3_text", 3, {}),
        ("qwen3", 3, {}),
        ("olmo2", 3, {}),
        ("qwen3_5_text", 1, {"head_dim": 64}),
    ],
)
def test_cpu_pipeline_packs_projections_behind_qk_norms(family, layers, overrides, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    package = mobius_genai.build(ckpt, "cpu", "f32")
    model = package["model"]
    assert len(_projections(model)) == layers  # one packed projection per layer
    report = package.reports["model"]
    assert report.matches["PackQKVSplit"] == layers
    line = next(line for line in report.trace_lines if line.strip().startswith("PackQKVSplit"))
    assert f"+{layers} Split" in line and "no matches" not in line
