"""Qwen3.5-MoE's hub layout (model_type qwen3_5_moe: Qwen3_5MoeForConditionalGeneration, its
decoder's keys in `text_config`, its weights under model.language_model., a vision tower under
model.visual.) packaged as a text-only qwen3_5_moe_text bundle, as qwen3_5's are
(test_qwen3_5_hub.py): logits and onnxruntime-genai's greedy tokens equal transformers'
text-only forward of the multimodal model; package, the manifest and the card say the vision
tower was not built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

import mobius_genai
from mobius_genai.bundle import packager
from mobius_genai.bundle.generate import greedy_tokens, load_model
from mobius_genai.models import get_family
from tests._hf import randomize_weights, tiny_config
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.families.test_bundles import PROMPT, TOKENIZER, TOKENIZER_FILES
from tests.families.test_qwen3_5_hub import (
    NEW_TOKENS,
    TOLERANCE,
    VISION,
    _hf_greedy,
    _reference,
    _with_tensor,
)

NOT_BUILT = "the vision tower (model.visual.*): a text-only bundle"


@pytest.fixture(scope="module")
def hub_checkpoint(tmp_path_factory) -> Path:
    """A tiny random Qwen3_5MoeForConditionalGeneration saved by transformers (tests/_hf.py's
    qwen3_5_moe_text decoder), with the tiny qwen2 tokenizer (vocab 384)."""
    folder = tmp_path_factory.mktemp("qwen3_5_moe_hub") / "ckpt"
    text = tiny_config(
        "qwen3_5_moe_text", vocab_size=384, bos_token_id=381, eos_token_id=383, pad_token_id=0
    )
    config = Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=VISION)
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    model = Qwen3_5MoeForConditionalGeneration(config).to(torch.float32)
    randomize_weights(model, seed=1)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, folder / name)
    return folder


def test_logits_equal_the_multimodal_models_text_forward(hub_checkpoint, tmp_path):
    ids = np.random.default_rng(0).integers(3, 380, size=(1, 9))
    reference = _reference(hub_checkpoint, ids, 3, Qwen3_5MoeForConditionalGeneration)
    package = mobius_genai.build(hub_checkpoint, "cpu", "f32")
    assert package.config.model_type == "qwen3_5_moe"
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_text_only_bundle_generates_and_says_so(hub_checkpoint, tmp_path, capsys):
    folder = packager.package(hub_checkpoint, "cpu", tmp_path / "bundle")
    notice = [line for line in capsys.readouterr().err.splitlines() if "not built" in line]
    assert notice == [f"mobius-genai: note: qwen3_5_moe checkpoint; not built: {NOT_BUILT}"]
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["type"] == "qwen3_5_moe_text" and "vision" not in config["model"]
    build = json.loads((folder / "mobius_manifest.json").read_text())["build"]
    assert build["not_built"] == NOT_BUILT
    assert f"not built: {NOT_BUILT}" in (folder / "README.md").read_text()
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    expected = _hf_greedy(hub_checkpoint, PROMPT, NEW_TOKENS, Qwen3_5MoeForConditionalGeneration)
    assert ours == expected


def test_the_multi_token_prediction_head_is_not_built(hub_checkpoint, tmp_path):
    ckpt = _with_tensor(hub_checkpoint, tmp_path / "ckpt", "mtp.fc.weight")
    assert mobius_genai.build(ckpt, "cpu", "f32").config.model_type == "qwen3_5_moe"


def test_text_config_read_as_transformers_reads_it():
    """Keys `text_config` omits take Qwen3_5MoeTextConfig's defaults."""
    text = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}
    raw = {"model_type": "qwen3_5_moe", "text_config": text}
    ours = get_family("qwen3_5_moe").parse_config(raw)
    theirs = Qwen3_5MoeConfig(**raw).text_config
    for key in ("vocab_size", "num_key_value_heads", "head_dim", "max_position_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    moe = ours.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size) == (
        theirs.num_experts,
        theirs.num_experts_per_tok,
        theirs.moe_intermediate_size,
        theirs.shared_expert_intermediate_size,
    )
    assert moe.normalize_top_k and moe.shared_expert_gate
    assert ours.layer_types == tuple(theirs.layer_types)
