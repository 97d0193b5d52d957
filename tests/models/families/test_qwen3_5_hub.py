"""The hub layouts of Qwen3.5 and Qwen3.5-MoE (model_type qwen3_5 / qwen3_5_moe:
Qwen3_5(Moe)ForConditionalGeneration, the decoder's keys in `text_config`, its weights under
model.language_model., a vision tower under model.visual.) packaged as onnxruntime-genai's
builder packages them: a text-only qwen3_5_text / qwen3_5_moe_text bundle. Its logits and
onnxruntime-genai's greedy tokens equal transformers' text-only forward of the multimodal
model; package, the manifest and the card say the vision tower was not built; any other tensor
the decoder does not read is still refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

import mobius_genai
from mobius_genai import packager
from mobius_genai.errors import WeightsError
from mobius_genai.models import get_family
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, TOKENIZER_FILES
from tests._hf import (
    ReferenceRun,
    ReferenceStep,
    hf_forward,
    hf_greedy_tokens,
    load_reference_model,
    positions_from_mask,
    randomize_weights,
    tiny_config,
)
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.conftest import TINY_QWEN2

TOLERANCE = 1e-4  # f32, a 9-token prefill (test_qwen3_5.py: 70 tokens within the same bound)
NEW_TOKENS = 16
# One tiny vision block; its tensors are in the checkpoint and no graph reads them.
VISION = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "patch_size": 2,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
}


NOT_BUILT = "the vision tower (model.visual.*): a text-only bundle"
# model_type → (its config class, its model class, the text family of its decoder, its bundle's
# model.type)
LAYOUTS = {
    "qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration, "qwen3_5_text"),
    "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, "qwen3_5_moe_text"),
}


def _hub_checkpoint(folder: Path, layout: str, **top_level: object) -> Path:
    """A tiny random model of the hub `layout` saved by transformers (the decoder: tests/_hf.py's
    tiny text family), with the tiny qwen2 tokenizer (vocab 384); `top_level` goes to the
    config class."""
    config_class, model_class, text_family = LAYOUTS[layout]
    text = tiny_config(
        text_family, vocab_size=384, bos_token_id=381, eos_token_id=383, pad_token_id=0
    )
    config = config_class(text_config=text.to_dict(), vision_config=VISION, **top_level)
    config.architectures = [model_class.__name__]
    model = model_class(config).to(torch.float32)
    randomize_weights(model, seed=1)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, folder / name)
    return folder


@pytest.fixture(scope="module", params=list(LAYOUTS))
def hub_checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    layout = request.param
    return layout, _hub_checkpoint(tmp_path_factory.mktemp(layout) / "ckpt", layout)


def _reference(ckpt: Path, ids: np.ndarray, decode_steps: int, layout: str) -> ReferenceRun:
    """transformers' text-only forward of the multimodal model (its own positions): a
    prefill, then greedy decode steps through its cache."""
    model = load_reference_model(ckpt, LAYOUTS[layout][1])
    steps, cache, mask = [], None, np.ones_like(ids)
    with torch.no_grad():
        for _ in range(decode_steps + 1):
            logits_t, cache = hf_forward(
                model, cache, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            )
            logits = logits_t.numpy()
            steps.append(ReferenceStep(ids, mask, positions_from_mask(mask, ids.shape[1]), logits))
            ids = logits[:, -1:].argmax(-1).astype(np.int64)
            mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
    return ReferenceRun(steps)


@pytest.mark.parametrize(
    ("layout", "tied"), [("qwen3_5", False), ("qwen3_5", True), ("qwen3_5_moe", False)]
)
def test_logits_equal_the_multimodal_models_text_forward(layout, tied, tmp_path):
    """Tied: the top-level tie_word_embeddings ties the LM head (transformers ignores the
    saved `text_config`'s false); the checkpoint then has no lm_head.weight."""
    top_level = {"tie_word_embeddings": True} if tied else {}
    ckpt = _hub_checkpoint(tmp_path / "ckpt", layout, **top_level)
    assert ("lm_head.weight" in load_file(ckpt / "model.safetensors")) is not tied
    ids = np.random.default_rng(0).integers(3, 380, size=(1, 9))
    reference = _reference(ckpt, ids, 3, layout)
    package = mobius_genai.build(ckpt, "cpu", "f32")
    assert package.config.model_type == layout
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_text_only_bundle_generates_and_says_so(hub_checkpoint, tmp_path, capsys):
    layout, ckpt = hub_checkpoint
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle")
    notice = [line for line in capsys.readouterr().err.splitlines() if "not built" in line]
    assert notice == [f"mobius-genai: note: {layout} checkpoint; not built: {NOT_BUILT}"]
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["type"] == LAYOUTS[layout][2] and "vision" not in config["model"]
    build = json.loads((folder / "mobius_manifest.json").read_text())["build"]
    assert build["not_built"] == NOT_BUILT
    assert f"not built: {NOT_BUILT}" in (folder / "README.md").read_text()
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    model_class = LAYOUTS[layout][1]
    expected = hf_greedy_tokens(
        ckpt, PROMPT, NEW_TOKENS, stop_at_eos=False, model_class=model_class
    )
    assert ours == expected


def test_quiet_package_prints_no_notice(hub_checkpoint, tmp_path, capsys):
    packager.package(hub_checkpoint[1], "cpu", tmp_path / "bundle", quiet=True)
    assert "not built" not in capsys.readouterr().err


def _with_tensor(checkpoint: Path, folder: Path, name: str) -> Path:
    shutil.copytree(checkpoint, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = np.ones([4, 4], np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_an_unrelated_extra_tensor_is_still_refused(hub_checkpoint, tmp_path):
    ckpt = _with_tensor(hub_checkpoint[1], tmp_path / "ckpt", "model.language_model.extra.weight")
    with pytest.raises(WeightsError, match=r"reads no tensor.*model\.language_model\.extra"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_the_multi_token_prediction_head_is_not_built(hub_checkpoint, tmp_path):
    """Hub checkpoints hold an mtp.* head transformers does not load either."""
    layout, checkpoint = hub_checkpoint
    ckpt = _with_tensor(checkpoint, tmp_path / "ckpt", "mtp.fc.weight")
    assert mobius_genai.build(ckpt, "cpu", "f32").config.model_type == layout


def test_text_config_read_as_transformers_reads_it():
    """Keys `text_config` omits take Qwen3_5TextConfig's defaults."""
    text = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}
    raw = {"model_type": "qwen3_5", "text_config": text}
    ours = get_family("qwen3_5").parse_config(raw)
    theirs = Qwen3_5Config(**raw).text_config
    for key in (
        "vocab_size",
        "intermediate_size",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.norm_eps == theirs.rms_norm_eps
    linear = ours.linear_attention
    assert (linear.key_heads, linear.value_heads) == (
        theirs.linear_num_key_heads,
        theirs.linear_num_value_heads,
    )
    assert (linear.key_head_dim, linear.value_head_dim, linear.conv_kernel_size) == (
        theirs.linear_key_head_dim,
        theirs.linear_value_head_dim,
        theirs.linear_conv_kernel_dim,
    )
    assert ours.layer_types == tuple(theirs.layer_types)


def test_moe_text_config_read_as_transformers_reads_it():
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


@pytest.mark.parametrize(
    ("text_tie", "top_level"),
    [(True, {}), (True, {"tie_word_embeddings": False}), (False, {"tie_word_embeddings": True})],
)
def test_tie_word_embeddings_is_the_top_level_ones(text_tie, top_level):
    """Qwen3_5ForConditionalGeneration ties its LM head by the top-level key (default false),
    whatever `text_config` says."""
    text = tiny_config("qwen3_5_text", vocab_size=384, tie_word_embeddings=text_tie).to_dict()
    raw = {"model_type": "qwen3_5", "text_config": text, **top_level}
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**raw, vision_config=VISION))
    tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
    assert get_family("qwen3_5").parse_config(raw).tie_word_embeddings is tied
