"""Llama 4's text decoder vs transformers: chunked local attention, NoPE layers with attention
temperature tuning, the L2 q/k norm of rotating layers, MoE whose router score scales the
expert's input.

The tiny checkpoint (tests/_hf.py) has chunked (5 positions), NoPE and chunked layers, MoE in
the outer two; its 12-token prefills and 4 decode steps cross three chunk boundaries and four
temperature steps (floor_scale 4). f32, <= 1e-4 on the portable, cpu (GroupQueryAttention in
every layer: causal in the NoPE layer, causal=0 with the chunk mask as attention_bias in the
chunked ones) and onnx-standard graphs; mutants: each wrong detail moves the logits well past
the tolerance.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from transformers import Llama4Config, Llama4ForConditionalGeneration

import mobius_genai
from mobius_genai import packager
from mobius_genai.cli import main as cli_main
from mobius_genai.components import decoder, moe, scaled_input
from mobius_genai.config.local_global import CHUNKED
from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import (
    NEW_TOKENS,
    PROMPT,
    assert_engine_continues_each_prompt,
    bundle_checkpoint,
    int4_bundle_ops,
)
from tests._hf import (
    edit_config,
    hf_greedy_tokens,
    hf_reference_logits,
    randomize_weights,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import case_diffs, graph_diffs, left_padded_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
FAMILY = "llama4_text"
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

CASES = {
    "defaults": {},
    # two experts a token: two MoE nodes, each over the token times its own score
    "two_experts_per_token": {"num_experts_per_tok": 2},
    # Maverick's shape: no q/k norm, MoE every second layer (interleave_moe_layer_step)
    "no_qk_norm_interleaved_moe": {
        "use_qk_norm": False,
        "moe_layers": None,
        "interleave_moe_layer_step": 2,
    },
    # no chunk size: every layer attends to the whole context; llama3 rope scaling
    "no_chunks_llama3_rope": {"attention_chunk_size": None, "rope_parameters": _LLAMA3_ROPE},
    "no_temperature_tuning_attention_bias": {
        "attn_temperature_tuning": False,
        "attention_bias": True,
    },
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize("case", sorted(CASES))
def test_llama4_graphs_match_transformers(case, tmp_path):
    diffs = case_diffs(tmp_path, FAMILY, _ids(), EPS, seed=1, **CASES[case])
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_layout_config_matches_transformers(tmp_path):
    """Hub configs carry no layer_types (derived from no_rope_layers and the chunk size),
    rope_theta and rope_scaling, and Scout's attn_temperature_tuning is the number 4."""
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt", FAMILY, seed=1, hub_layout=True, rope_parameters=_LLAMA3_ROPE
    )
    data = json.loads((ckpt / "config.json").read_text())
    assert "layer_types" not in data and data["rope_scaling"]["rope_type"] == "llama3"
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    edit_config(ckpt, attn_temperature_tuning=4)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def test_left_padded_rows_start_their_chunks_at_their_first_token(tmp_path):
    """transformers counts chunks from a row's first real token (its left padding skipped),
    as the mask does in positions. Temperature tuning is off here: transformers scales a
    padded row's queries by their slot, the graph by their position (what og's rows have)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", FAMILY, seed=1, attn_temperature_tuning=False)
    first, rest = left_padded_diffs(ckpt, tmp_path)
    assert max(first, rest) <= TOLERANCE, (first, rest)


def _with_local_global(**changes):
    row = FAMILIES[FAMILY]
    read = row.config_overrides["local_global"]
    overrides = {
        **row.config_overrides,
        "local_global": lambda raw: dataclasses.replace(read(raw), **changes),
    }
    return dataclasses.replace(row, config_overrides=overrides)


def _every_layer_rotates():
    row = FAMILIES[FAMILY]
    return dataclasses.replace(row, config_overrides={**row.config_overrides, "no_rope_layers": ()})


class _ScoreWeightsTheOutput(moe.MoEBlock):
    """Weights each picked expert's output by its score instead of scaling its input."""

    def forward(self, op, x):
        logits = op.Reshape(self.gate(op, x), op.Constant(value_ints=[-1, self.moe.num_experts]))
        (scale, router), *_ = scaled_input.picks(op, x, logits, 1)
        out = op.Mul(self._experts(op, x, router, 1, True), scale)
        return self._with_shared_expert(op, x, out)


MUTANTS = {
    "chunk_size_off_by_one": _with_local_global(chunk_size=6),
    "nope_layer_with_rope": _every_layer_rotates(),
    "no_temperature_tuning": _with_local_global(temperature=None),
    "no_l2_qk_norm": _with_local_global(qk_l2_norm=False),
    "score_weights_the_output": (decoder, "MoEBlock", _ScoreWeightsTheOutput),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_detail_wrong(case, tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", FAMILY, seed=1)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, FAMILY, MUTANTS[case], monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def _attention_ops(graph) -> Counter:
    return Counter(
        node.op_type for node in graph if node.op_type in ("Attention", "GroupQueryAttention")
    )


def _gqa_with_bias(graph) -> int:
    """GroupQueryAttention nodes that take the mask as attention_bias with causal=0."""
    return sum(
        1
        for node in graph
        if node.op_type == "GroupQueryAttention"
        and node.attributes.get_int("causal", 1) == 0
        and len(node.inputs) > 10
    )


def test_chunked_layers_run_gqa_with_their_mask_as_bias(tmp_path):
    """cpu's and cuda's GroupQueryAttention take attention_bias: the chunked layers run it with
    causal=0 and the chunk mask as bias, the NoPE layer as plain causal GQA. A chunk of the
    whole context (64 positions) holds every position: those layers are full-attention layers,
    plain causal GQA too."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", FAMILY)
    for ep, dtype in (("cpu", "f32"), ("cuda", "f16")):
        graph = mobius_genai.build(ckpt, ep, dtype, load_weights=False)["model"].graph
        assert _attention_ops(graph) == {"GroupQueryAttention": 3}, ep
        assert _gqa_with_bias(graph) == 2, ep
    edit_config(ckpt, attention_chunk_size=64)
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    assert _attention_ops(graph) == {"GroupQueryAttention": 3}
    assert _gqa_with_bias(graph) == 0


def test_trace_says_why_gqa_declined_the_chunked_layers(tmp_path, recwarn):
    """Every layer chunked (no NoPE layer), on webgpu, whose GQA kernel takes no attention_bias:
    standard Attention is meant to stay, so no warning says GQA was expected, and the trace
    gives the reason for each layer."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", FAMILY, no_rope_layers=[1, 1, 1])
    package = mobius_genai.build(ckpt, "webgpu", "f32", load_weights=False, progress=False)
    assert _attention_ops(package["model"].graph) == {"Attention": 3}
    reasons = [d.reason for d in package.reports["model"].rules["GQAFusion"].declines]
    expected = "keys of the query's own 5-position chunk only; GroupQueryAttention's window"
    assert len(reasons) == 3 and all(reason.startswith(expected) for reason in reasons), reasons
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


def test_cpu_bundle_generates_like_transformers(tmp_path):
    """og runs the GQA graph with a shared KV buffer through og.Generator and og.Engine (a
    batch of prompts of different lengths: each row's chunks and temperatures counted from its
    own first token)."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", FAMILY)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    assert_engine_continues_each_prompt(ckpt, folder)


def test_webgpu_bundle_neither_shares_the_buffer_nor_captures_the_graph(tmp_path, capsys):
    """Where GQA takes no attention_bias (webgpu) the chunked layers keep standard Attention,
    whose presents a shared KV buffer cannot hold: genai_config shares none, so graph capture
    is off (it needs the shared buffer), and validate refuses sharing."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", FAMILY)
    folder = packager.package(ckpt, "webgpu", tmp_path / "bundle", quiet=True)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    assert config["search"]["past_present_share_buffer"] is False
    options = config["model"]["decoder"]["session_options"]["provider_options"]
    assert options == [{"webgpu": {"enableGraphCapture": "0"}}]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    assert _attention_ops(graph.node) == {"Attention": 2, "GroupQueryAttention": 1}
    assert cli_main(["validate", str(folder)]) == 0
    config["search"]["past_present_share_buffer"] = True
    path.write_text(json.dumps(config))
    capsys.readouterr()
    assert cli_main(["validate", str(folder)]) != 0
    assert "some layers attend with standard Attention" in capsys.readouterr().err


def test_cpu_int4_bundle_runs_its_experts_as_qmoe(tmp_path):
    ops = int4_bundle_ops(FAMILY, tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0


# One tiny vision block and projector; their tensors are in the checkpoint and no graph reads them.
_VISION = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "image_size": 28,
    "patch_size": 14,
    "vision_output_dim": 16,
    "projector_input_dim": 16,
    "projector_output_dim": 16,
}


def test_hub_checkpoint_is_built_text_only(tmp_path):
    """Llama 4's hub layout (Llama4ForConditionalGeneration: text_config, language_model.*
    weights, a vision tower) builds the decoder alone: its logits equal transformers' language
    model's, whose logits the multimodal model gives for text; an empty no_rope_layers (as hub
    configs write it) means a NoPE layer every no_rope_layer_interval layers."""
    text = tiny_config(FAMILY, no_rope_layers=[], no_rope_layer_interval=2).to_dict()
    model = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=_VISION))
    randomize_weights(model, seed=1)
    model.save_pretrained(tmp_path / "hub")
    model.language_model.save_pretrained(tmp_path / "text")
    path = tmp_path / "hub" / "config.json"
    data = json.loads(path.read_text())
    assert data["text_config"].pop("layer_types") == [CHUNKED, "full_attention", CHUNKED]
    data["text_config"]["no_rope_layers"] = []
    path.write_text(json.dumps(data))
    with torch.no_grad():
        ids = torch.tensor(_ids())
        assert torch.equal(model(input_ids=ids).logits, model.language_model(ids).logits)
    reference = hf_reference_logits(tmp_path / "text", _ids(), decode_steps=2)
    config = mobius_genai.build(tmp_path / "hub", "cpu", "f32", load_weights=False).config
    assert config.no_rope_layers == (1,) and config.layer_types[1] == "full_attention"
    diffs = graph_diffs(tmp_path / "hub", reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


REFUSALS = {
    "chunk_size_zero": ({"attention_chunk_size": 0}, "attention_chunk_size"),
    "moe_layer_outside": ({"moe_layers": [3]}, "'moe_layers' holds \\[3\\]"),
    "rope_flags_short": ({"no_rope_layers": [1, 0]}, "'no_rope_layers' must be a list"),
    "tuning_not_a_flag": ({"attn_temperature_tuning": "yes"}, "attn_temperature_tuning"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_the_row_cannot_build_is_refused_in_one_line(case, tmp_path):
    changes, match = REFUSALS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", FAMILY)
    edit_config(ckpt, **changes)
    with pytest.raises(ConfigError, match=match):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)
