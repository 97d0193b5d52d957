"""Checkpoint tensors the architecture in config.json leaves unused are an error naming them.

A config.json with fewer layers than the checkpoint, or a model_type that drops tensors (a
qwen2 checkpoint read as llama loses its q/k/v biases), would otherwise build a model that
runs and generates garbage. Buffers that are never weights are accepted, per family where
they are family-specific, and so is a tied LM head stored twice, equal.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from tests._hf import edit_config, write_tiny_checkpoint
from tests.conftest import TINY_QWEN2


def _copy(tmp_path: Path, **config: object) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY_QWEN2, folder)
    edit_config(folder, **config)
    return folder


def _add_tensors(folder: Path, extra: dict[str, np.ndarray]) -> None:
    tensors = {**load_file(folder / "model.safetensors"), **extra}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_layers_past_num_hidden_layers_are_refused(tmp_path: Path):
    ckpt = _copy(tmp_path, num_hidden_layers=1)
    with pytest.raises(WeightsError) as caught:
        mobius_genai.build(ckpt, "cpu", "f32")
    message = str(caught.value)
    assert "'model.layers.1.input_layernorm.weight'" in message
    assert "and 7 more" in message  # the 12 tensors of layer 1, 5 of them named
    assert "num_hidden_layers" in message and "model_type" in message
    assert "'model.layers.0." not in message


def test_a_qwen2_checkpoint_read_as_llama_loses_no_bias_silently(tmp_path: Path):
    ckpt = _copy(tmp_path, model_type="llama")
    with pytest.raises(WeightsError, match=re.escape("'model.layers.0.self_attn.k_proj.bias'")):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_known_buffers_are_accepted(tmp_path: Path):
    """Old llama-style checkpoints carry each layer's rotary inverse frequencies."""
    ckpt = _copy(tmp_path)
    inv_freq = np.ones(8, np.float32)
    _add_tensors(
        ckpt, {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": inv_freq for i in (0, 1)}
    )
    built = mobius_genai.build(ckpt, "cpu", "f32")
    built.save(tmp_path / "graph", progress=False)


# GPT-2-style attention buffers that transformers ignores when loading (the causal mask
# `bias` and `masked_bias`), in each family's naming.
_FAMILY_BUFFERS = {
    "gpt2": ("transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"),
    "gptj": ("transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"),
    "gpt_neox": (
        "gpt_neox.layers.0.attention.bias",
        "gpt_neox.layers.0.attention.masked_bias",
        "gpt_neox.layers.0.attention.rotary_emb.inv_freq",
    ),
}


@pytest.mark.parametrize("family", sorted(_FAMILY_BUFFERS))
def test_family_buffers_are_accepted(tmp_path: Path, family: str):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    causal = np.tril(np.ones((1, 1, 64, 64), np.float32)).astype(bool)
    buffers = {"bias": causal, "masked_bias": np.array(-1e4, np.float32)}
    _add_tensors(
        ckpt,
        {
            name: buffers.get(name.rsplit(".", 1)[-1], np.ones(8, np.float32))
            for name in _FAMILY_BUFFERS[family]
        },
    )
    mobius_genai.build(ckpt, "cpu", "f32")


def test_family_buffers_are_accepted_in_their_family_only(tmp_path: Path):
    ckpt = _copy(tmp_path)
    _add_tensors(ckpt, {"model.layers.0.self_attn.masked_bias": np.array(-1e4, np.float32)})
    with pytest.raises(WeightsError, match=re.escape("'model.layers.0.self_attn.masked_bias'")):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_a_tied_lm_head_stored_equal_to_the_embeddings_is_accepted(tmp_path: Path):
    ckpt = _copy(tmp_path)
    embed = load_file(ckpt / "model.safetensors")["model.embed_tokens.weight"]
    _add_tensors(ckpt, {"lm_head.weight": embed.copy()})
    mobius_genai.build(ckpt, "cpu", "f32")


def test_a_tied_lm_head_that_differs_from_the_embeddings_is_refused(tmp_path: Path):
    ckpt = _copy(tmp_path)
    embed = load_file(ckpt / "model.safetensors")["model.embed_tokens.weight"]
    head = embed.copy()
    head[-1, -1] = -head[-1, -1] + 1
    _add_tensors(ckpt, {"lm_head.weight": head})
    with pytest.raises(WeightsError) as caught:
        mobius_genai.build(ckpt, "cpu", "f32")
    message = str(caught.value)
    assert "'lm_head.weight'" in message and "'model.embed_tokens.weight'" in message
    assert "tie_word_embeddings" in message
