"""Bundle tier per family: package for cpu, `mobius-genai validate`, and onnxruntime-genai's
greedy tokens equal transformers'.

The tiny checkpoints borrow the committed tiny-qwen2 tokenizer (vocab 384), so packaging copies
real tokenizer files; prompts are fed as token ids. gpt2 (model.type "decoder", learned
positions), gemma3_text (two rope tables, sliding layers, q/k norm), lfm2 (conv layers with a
recurrent state between attention layers), gpt_oss (attention sinks, model.type gptoss),
qwen3_5_text (gated delta nets with two states), qwen3_next and qwen3_5_moe_text (the same
with MoE blocks, as model.type qwen3_5_moe_text), deepseek_v3 and deepseek_v2 (multi-head
latent attention with a latent cache, group-limited MoE routing), granitemoehybrid (Mamba2
layers with two states, as model.type decoder), nemotron_h and falcon_h1 (the same Mamba2
states beside MLP-only layers, or beside a KV cache in one layer), gemma3n_text (AltUp,
per-layer inputs, sparse MLPs, layers attending over an earlier layer's cache) run by default;
the other families are marked slow (`pytest -m slow tests/models/families/test_bundles.py`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest

from mobius_genai import packager
from mobius_genai.cli import main as cli_main
from mobius_genai.ep import get_ep
from mobius_genai.models import FAMILIES
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import (
    EXTRA,
    NEW_TOKENS,
    PROMPT,
    batch_greedy_tokens,
    bundle_checkpoint,
)
from tests._hf import hf_greedy_tokens
from tests.models.families._bitnet import ternary_checkpoint

# qwen2_moe: MoE with a shared expert; phimoe: sparsemixer routing as two k=1 MoE nodes;
# lfm2, qwen3_5_text: recurrent states
DEFAULT_RUN = {"gpt2", "gemma3_text", "qwen2_moe", "lfm2", "phimoe", "qwen3_5_text"}
DEFAULT_RUN |= {"gpt_oss"}  # model.type gptoss, attention sinks in GQA
DEFAULT_RUN |= {"qwen3_next"}  # model.type qwen3_5_moe_text: delta nets and MoE (7 s)
DEFAULT_RUN |= {"qwen3_5_moe_text"}  # the same, projections separate, every layer MoE
DEFAULT_RUN |= {"deepseek_v3", "deepseek_v2"}  # latent attention, group-limited routing
DEFAULT_RUN |= {"granitemoehybrid"}  # model.type decoder: Mamba2 states found by their names
# model.type decoder: MLP layers with no cache (nemotron_h), layers with a KV cache and Mamba2
# states (falcon_h1)
DEFAULT_RUN |= {"nemotron_h", "falcon_h1"}
DEFAULT_RUN |= {"lfm2_moe"}  # model.type lfm2_moe: conv states, sigmoid-routed MoE
# routers choosing with a correction bias; xIELU (llama4_text: tests/.../test_llama4.py)
DEFAULT_RUN |= {"glm4_moe", "ernie4_5_moe", "minimax_m2", "apertus"}
DEFAULT_RUN |= {"gemma3n_text"}  # AltUp streams, per-layer inputs, layers sharing a cache
# per-layer cache shapes (full layers' own head size and kv heads), K = V, shared caches
DEFAULT_RUN |= {"gemma4_text"}
# sandwich norms (glm4); NoPE full layers between windowed rotary ones, past the window (cohere2)
DEFAULT_RUN |= {"glm4", "cohere2"}
# a shared MLP beside the experts (granitemoeshared, hunyuan_v1_moe: its float32 softmax
# router), V3 routing with qwen3 attention (dots1), Mamba2 beside rotary attention (bamba)
DEFAULT_RUN |= {"granitemoeshared", "hunyuan_v1_moe", "dots1", "bamba"}
# latent attention, and EXAONE 4's attention, with V3 routing where mlp_layer_types says;
# V3 routing in every layer beside llama attention (solar_open)
DEFAULT_RUN |= {"glm4_moe_lite", "exaone_moe", "solar_open"}
DEFAULT_RUN |= {"flex_olmo"}  # olmo2's post-norm layers with olmoe's experts
# Mamba1 states with no KV cache at all (mamba), beside attention and MoE (jamba)
DEFAULT_RUN |= {"mamba", "jamba"}
DEFAULT_RUN |= {"bloom"}  # ALiBi: each head's linear biases as GQA's attention_bias
# Every family added after the first four (llama, mistral, qwen2, qwen3), in table order;
# rows of multimodal checkpoints built text-only have their own tests (test_qwen3_5_hub.py).
NEW_FAMILIES = tuple(
    family
    for family, row in FAMILIES.items()
    if family not in ("llama", "mistral", "qwen2", "qwen3") and row.text_only is None
)


def _marks(family: str) -> list[pytest.MarkDecorator]:
    return [] if family in DEFAULT_RUN else [pytest.mark.slow]


@pytest.mark.parametrize("family", [pytest.param(f, marks=_marks(f)) for f in NEW_FAMILIES])
def test_bundle_validates_and_generates_like_transformers(family, tmp_path, capsys):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    assert cli_main(["validate", str(folder)]) == 0
    assert f"valid ({FAMILIES[family].genai_type}," in capsys.readouterr().out
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS  # no early eos: the comparison covers every step


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text"])
def test_a_bundle_ignores_softcaps_its_transformers_class_never_reads(
    family, tmp_path, monkeypatch
):
    """config.json's softcaps (and llama's partial rotary factor) change nothing in these
    families, in og as in transformers."""
    keys = {"final_logit_softcapping": 2.0, "attn_logit_softcapping": 2.0}
    if family == "llama":
        keys["partial_rotary_factor"] = 0.5
    monkeypatch.setitem(EXTRA, family, keys)
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS


def test_a_bundle_windows_decoding_where_transformers_cache_does(tmp_path):
    """A llama config.json whose window is switched off by use_sliding_window, a key LlamaConfig
    never reads: transformers' cache still keeps only the last 12 tokens, so the greedy tokens
    past the window are og's from a bundle whose layers slide."""
    ckpt = bundle_checkpoint(
        tmp_path / "ckpt", "llama", sliding_window=12, use_sliding_window=False
    )
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS > 12 - len(PROMPT)


@pytest.mark.parametrize(
    "family",
    ["lfm2", "qwen3_5_text", "qwen3_next", "granitemoehybrid", "nemotron_h", "falcon_h1", "bamba"],
)
def test_recurrent_bundle_generates_a_batch_of_prompts_of_different_lengths(family, tmp_path):
    """The padding after the shorter prompt stays out of its recurrent states: each row
    continues as transformers continues that prompt alone."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in prompts]


def _projection_weights(folder: Path) -> list[str]:
    """The B input names of the bundle's MatMulNBits nodes that read a q/k/v projection."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    return [
        node.input[1]
        for node in graph.node
        if node.op_type == "MatMulNBits" and "_proj" in node.input[1] and "attn" in node.input[1]
    ]


def test_gemma3_int4_bundle_packs_q_k_v_behind_the_qk_norms(tmp_path):
    """One MatMulNBits per layer for q/k/v (split before gemma3's q/k norms), and the same
    tokens as the bundle with three projections per layer."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma3_text")
    int4 = {"precision": "int4", "int4": Int4Options(quality="builder"), "quiet": True}  # all 4-bit
    packed = packager.package(ckpt, "cpu", tmp_path / "packed", **int4)
    names = [name for name in _projection_weights(packed) if "o_proj" not in name]
    layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    assert len(names) == layers and all("qkv_proj" in name for name in names)
    caps = dataclasses.replace(get_ep("cpu"), name="cpu-separate", qkv_pack_dtypes=frozenset())
    separate = packager.package(ckpt, caps, tmp_path / "separate", **int4)
    assert len([n for n in _projection_weights(separate) if "o_proj" not in n]) == 3 * layers
    ours = greedy_tokens(load_model(packed), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    assert ours == greedy_tokens(load_model(separate), PROMPT, len(PROMPT) + NEW_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["bitlinear", "bf16_online"])
def test_bitnet_ternary_bundle_generates_like_transformers(form, tmp_path):
    """BitNet's other ternary forms (the packed autobitlinear one: test_bitnet.py, default
    run) through og, MatMulNBits at accuracy level 0 (the activations as the model rounds them)."""
    ckpt = ternary_checkpoint(
        bundle_checkpoint(tmp_path / "float", "bitnet"), tmp_path / form, form
    )
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", int4=Int4Options(accuracy_level=0), quiet=True
    )
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
