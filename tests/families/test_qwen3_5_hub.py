"""Qwen3.5's hub layout (model_type qwen3_5: Qwen3_5ForConditionalGeneration, its decoder's
keys in `text_config`, its weights under model.language_model., a vision tower under
model.visual.) packaged as onnxruntime-genai's builder packages it: a text-only qwen3_5_text
bundle. Its logits and onnxruntime-genai's greedy tokens equal transformers' text-only forward
of the multimodal model; package, the manifest and the card say the vision tower was not
built; any other tensor the decoder does not read is still refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

import mobius_genai
from mobius_genai.bundle import packager
from mobius_genai.bundle.generate import greedy_tokens, load_model
from mobius_genai.errors import WeightsError
from mobius_genai.models import get_family
from tests._hf import (
    ReferenceRun,
    ReferenceStep,
    _forward,
    positions_from_mask,
    randomize_weights,
    tiny_config,
)
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.families.test_bundles import PROMPT, TOKENIZER, TOKENIZER_FILES

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


def _hub_checkpoint(folder: Path, **top_level: object) -> Path:
    """A tiny random Qwen3_5ForConditionalGeneration saved by transformers, with the tiny
    qwen2 tokenizer (vocab 384); `top_level` goes to Qwen3_5Config."""
    text = tiny_config(
        "qwen3_5_text", vocab_size=384, bos_token_id=381, eos_token_id=383, pad_token_id=0
    )
    config = Qwen3_5Config(text_config=text.to_dict(), vision_config=VISION, **top_level)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32)
    randomize_weights(model, seed=1)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def hub_checkpoint(tmp_path_factory) -> Path:
    return _hub_checkpoint(tmp_path_factory.mktemp("qwen3_5_hub") / "ckpt")


def _reference(
    ckpt: Path, ids: np.ndarray, decode_steps: int, model_class=Qwen3_5ForConditionalGeneration
) -> ReferenceRun:
    """transformers' text-only forward of the multimodal model (its own positions): a
    prefill, then greedy decode steps through its cache."""
    model = model_class.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    steps, cache, mask = [], None, np.ones_like(ids)
    with torch.no_grad():
        for _ in range(decode_steps + 1):
            logits_t, cache = _forward(
                model, cache, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            )
            logits = logits_t.numpy()
            steps.append(ReferenceStep(ids, mask, positions_from_mask(mask, ids.shape[1]), logits))
            ids = logits[:, -1:].argmax(-1).astype(np.int64)
            mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
    return ReferenceRun(steps)


def _hf_greedy(
    ckpt: Path, prompt: list[int], new_tokens: int, model_class=Qwen3_5ForConditionalGeneration
) -> list[int]:
    model = model_class.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("tied", [False, True])
def test_logits_equal_the_multimodal_models_text_forward(hub_checkpoint, tied, tmp_path):
    """Tied: the top-level tie_word_embeddings ties the LM head (transformers ignores the
    saved `text_config`'s false); the checkpoint then has no lm_head.weight."""
    ckpt = _hub_checkpoint(tmp_path / "tied", tie_word_embeddings=True) if tied else hub_checkpoint
    assert ("lm_head.weight" in load_file(ckpt / "model.safetensors")) is not tied
    ids = np.random.default_rng(0).integers(3, 380, size=(1, 9))
    reference = _reference(ckpt, ids, decode_steps=3)
    package = mobius_genai.build(ckpt, "cpu", "f32")
    assert package.config.model_type == "qwen3_5"
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_text_only_bundle_generates_and_says_so(hub_checkpoint, tmp_path, capsys):
    folder = packager.package(hub_checkpoint, "cpu", tmp_path / "bundle")
    notice = [line for line in capsys.readouterr().err.splitlines() if "not built" in line]
    assert notice == [
        "mobius-genai: note: qwen3_5 checkpoint; not built: the vision tower (model.visual.*): "
        "a text-only bundle"
    ]
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["type"] == "qwen3_5_text" and "vision" not in config["model"]
    build = json.loads((folder / "mobius_manifest.json").read_text())["build"]
    assert build["not_built"] == "the vision tower (model.visual.*): a text-only bundle"
    assert "not built: the vision tower (model.visual.*): a text-only bundle" in (
        (folder / "README.md").read_text()
    )
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    assert ours == _hf_greedy(hub_checkpoint, PROMPT, NEW_TOKENS)


def test_quiet_package_prints_no_notice(hub_checkpoint, tmp_path, capsys):
    packager.package(hub_checkpoint, "cpu", tmp_path / "bundle", quiet=True)
    assert "not built" not in capsys.readouterr().err


def _with_tensor(hub_checkpoint: Path, folder: Path, name: str) -> Path:
    shutil.copytree(hub_checkpoint, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = np.ones([4, 4], np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_an_unrelated_extra_tensor_is_still_refused(hub_checkpoint, tmp_path):
    ckpt = _with_tensor(hub_checkpoint, tmp_path / "ckpt", "model.language_model.extra.weight")
    with pytest.raises(WeightsError, match=r"reads no tensor.*model\.language_model\.extra"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_the_multi_token_prediction_head_is_not_built(hub_checkpoint, tmp_path):
    """Hub checkpoints hold an mtp.* head transformers does not load either."""
    ckpt = _with_tensor(hub_checkpoint, tmp_path / "ckpt", "mtp.fc.weight")
    assert mobius_genai.build(ckpt, "cpu", "f32").config.model_type == "qwen3_5"


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
