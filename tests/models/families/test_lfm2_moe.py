"""LFM2-MoE: LFM2's conv/attention hybrid with sigmoid-routed MoE blocks, vs transformers.

The row's defaults (tests/_hf.py: conv, attention, conv; a dense first layer, 8 experts, 2 per
token, a random expert_bias, renormalized, scaled by 1.5) are compared against float64 in
test_moe.py with every MoE row, and og's greedy tokens in test_bundles.py; here the switches
the row reads, the hub's config.json, mutants (each must move the logits well past the
tolerance), int4 (QMoE) and what og 0.18 refuses. f32, 2 x 12-token prefill + 4 cached decode
steps, on the portable, cpu (GroupQueryAttention, the MoE kernel) and onnx-standard graphs.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
import torch
from onnxscript import GraphBuilder
from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeSparseMoeBlock

import mobius_genai
from mobius_genai import packager
from mobius_genai.components import group_router, moe
from mobius_genai.components.group_router import GroupRouter
from mobius_genai.ep.context import build_context
from mobius_genai.models import FAMILIES
from mobius_genai.runtime.generate import greedy_tokens, load_model
from mobius_genai.tasks.causal_lm import OPSET, finish_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import (
    hf_reference_logits,
    load_reference_model,
    router_picks,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import case_diffs, graph_diffs, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")

CASES = {
    # raw sigmoid weights (no renormalization, no expert_bias), two dense layers, untied head
    "raw_weights_without_bias_two_dense_layers_untied": {
        "norm_topk_prob": False,
        "use_expert_bias": False,
        "num_dense_layers": 2,
        "tie_word_embeddings": False,
    },
    # every layer MoE, 3 of 8 experts per token, attention first, a 4-tap conv without bias
    "no_dense_layer_top3_attention_first": {
        "num_dense_layers": 0,
        "num_experts_per_tok": 3,
        "layer_types": ["full_attention", "conv", "conv"],
        "conv_L_cache": 4,
        "conv_bias": False,
    },
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize("case", sorted(CASES))
def test_lfm2_moe_graphs_match_transformers(case, tmp_path):
    diffs = case_diffs(tmp_path, "lfm2_moe", _ids(), EPS, seed=1, **CASES[case])
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_layout_config_matches_transformers(tmp_path):
    """LFM2-8B-A1B's config.json: top-level rope_theta, `tie_embedding`, no rope_parameters."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "lfm2_moe", seed=1)
    path = ckpt / "config.json"
    data = json.loads(path.read_text())
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"] / 4
    data["tie_embedding"] = data.pop("tie_word_embeddings")
    path.write_text(json.dumps(data))
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def _picks(model, ids: np.ndarray) -> list[tuple[int, ...]]:
    """The experts the first MoE layer (layer 1) picks for each token."""
    return router_picks(model, model.model.layers[1].feed_forward.gate, ids)


def test_prompt_routing_depends_on_the_expert_bias(tmp_path):
    """The parity prompts pick many expert pairs, and the picks change without expert_bias:
    the mutants below are measured where routing matters."""
    model = load_reference_model(write_tiny_checkpoint(tmp_path / "ckpt", "lfm2_moe", seed=1))
    picks = _picks(model, _ids())
    assert len(set(picks)) >= 6, picks
    with torch.no_grad():
        model.model.layers[1].feed_forward.expert_bias.zero_()
    assert _picks(model, _ids()) != picks


def _with_moe(**changes):
    """lfm2_moe's row with its MoE config changed (`routing`: its group routing's fields)."""
    row = FAMILIES["lfm2_moe"]
    read = row.config_overrides["moe"]
    routing_changes = changes.pop("routing", {})

    def mutant(raw):
        config = read(raw)
        routing = dataclasses.replace(config.group_routing, **routing_changes)
        return dataclasses.replace(config, group_routing=routing, **changes)

    return dataclasses.replace(row, config_overrides={**row.config_overrides, "moe": mutant})


class _ExpertBiasIgnored(GroupRouter):
    """Reads expert_bias and chooses by the uncorrected scores."""

    def _choice(self, op, scores):
        return scores


MUTANTS = {
    "not_renormalized": _with_moe(normalize_top_k=False),
    "expert_bias_ignored": (moe, "GroupRouter", _ExpertBiasIgnored),
    "routed_scaling_ignored": _with_moe(routing={"scaling": 1.0}),
    "softmax_scores": _with_moe(routing={"scoring": "softmax"}),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_routing_detail_wrong(case, tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "lfm2_moe", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=1)
    package = mobius_genai.build(ckpt, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "ours"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
    mutant = MUTANTS[case]
    if isinstance(mutant, tuple):
        monkeypatch.setattr(*mutant)
    else:
        monkeypatch.setitem(FAMILIES, "lfm2_moe", mutant)
    package = mobius_genai.build(ckpt, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "mutant"), reference)
    assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE


def test_cpu_int4_bundle_runs_its_experts_as_qmoe(tmp_path):
    """int4 for cpu: the experts of both MoE layers in QMoE (behind the sigmoid router's
    standard ops), the dense MLP and projections in MatMulNBits; og generates every token."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "lfm2_moe")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0
    tokens = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS


def test_og_engine_refusal_is_said_before_og_says_it(tmp_path):
    """og 0.18 runs lfm2_moe with its LFM2 model class, which og.Engine refuses: the bundle's
    engine_support says so, and og agrees."""
    folder = packager.package(
        bundle_checkpoint(tmp_path / "ckpt", "lfm2_moe"), "cpu", tmp_path / "bundle", quiet=True
    )
    assert json.loads((folder / "genai_config.json").read_text())["model"]["type"] == "lfm2_moe"
    assert mobius_genai.engine_support(folder).startswith(
        "og.Engine does not run this bundle: og 0.18 runs model.type lfm2_moe"
    )
    with pytest.raises(RuntimeError, match="not supported for decoding"):
        og.Engine(og.Model(str(folder)))


def _small_score_block() -> tuple[Lfm2MoeSparseMoeBlock, torch.Tensor]:
    """transformers' MoE block whose router logits lie near -13 for positive inputs: picked
    sigmoid scores of 1e-6, whose sum the 1e-6 of the renormalization changes by 7%."""
    block = Lfm2MoeSparseMoeBlock(tiny_config("lfm2_moe")).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(0.2 * torch.randn(param.shape, generator=generator))
        block.gate.weight.copy_(-0.25 - 0.05 * block.gate.weight.abs())
        block.expert_bias.copy_(torch.randn(block.expert_bias.shape, generator=generator))
    x = torch.rand(1, 5, 64, generator=generator) + 0.2
    return block, x


def _block_output(block: Lfm2MoeSparseMoeBlock, x: torch.Tensor) -> np.ndarray:
    """The MoE block lfm2_moe's row builds, with `block`'s weights, on onnxruntime's CPU EP."""
    config = FAMILIES["lfm2_moe"].parse_config(tiny_config("lfm2_moe").to_dict())
    with build_context("cpu", ir.DataType.FLOAT):
        graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="moe")
        builder = GraphBuilder(graph)
        hidden = builder.input("x", ir.DataType.FLOAT, list(x.shape))
        builder.add_output(moe.MoEBlock(config)(builder.op, hidden), "y")
        model = finish_model(graph, builder)
    inter = config.moe.intermediate_size
    fused = block.experts.gate_up_proj.detach().numpy()
    interleaved = np.empty_like(fused)  # the MoE op's gate/up rows: gate j at 2j, up at 2j + 1
    interleaved[:, 0::2], interleaved[:, 1::2] = fused[:, :inter], fused[:, inter:]
    values = {
        "gate.weight": block.gate.weight.detach().numpy().T,
        "gate.e_score_correction_bias": block.expert_bias.numpy(),
        "experts.gate_up_proj": interleaved,
        "experts.down_proj": block.experts.down_proj.detach().numpy(),
    }
    for name, value in values.items():
        array = np.ascontiguousarray(value, dtype=np.float32)
        model.graph.initializers[name].const_value = ir.tensor(array, name=name)
    proto = ir.serde.serialize_model(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.numpy()})[0]


def test_small_router_scores_keep_their_weights(monkeypatch):
    """Experts picked with sigmoid scores near 1e-6: the renormalization's 1e-6 and the
    scores' precision (onnxruntime's Sigmoid is 1% off at -13) both count; each undone moves
    the block's output well past the tolerance."""
    block, x = _small_score_block()
    with torch.no_grad():
        expected = block(x).numpy()
    assert np.abs(_block_output(block, x) - expected).max() <= TOLERANCE
    monkeypatch.setattr(group_router, "_sigmoid", lambda op, logits: op.Sigmoid(logits))
    assert np.abs(_block_output(block, x) - expected).max() > 10 * TOLERANCE
    monkeypatch.undo()
    row = _with_moe(routing={"epsilon": 0.0})
    monkeypatch.setitem(FAMILIES, "lfm2_moe", row)
    assert np.abs(_block_output(block, x) - expected).max() > 10 * TOLERANCE
