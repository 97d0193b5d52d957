"""Shared tiny checkpoints for the INT4 tests (written once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from tests._hf import write_tiny_checkpoint
from tests.quantize._reference import write_grid_checkpoint

#: Tied checkpoints written here use vocab 256: the optimizer constant-folds a Transpose of a
#: table of at most 8192 elements (vocab 128 x hidden 64), which unties the lm_head.
TIED = {"tie_word_embeddings": True, "vocab_size": 256}


@pytest.fixture(scope="session")
def untied_ckpt(tmp_path_factory) -> Path:
    """Random qwen2 (biases), untied, hidden 64, intermediate 96, 3 layers, vocab 128."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("untied"), "qwen2", seed=1)


@pytest.fixture(scope="session")
def tied_ckpt(tmp_path_factory) -> Path:
    """Random qwen2, tied embeddings, vocab 256."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tied"), "qwen2", seed=1, **TIED)


@pytest.fixture(scope="session")
def grid_ckpts(tmp_path_factory) -> dict[bool, Path]:
    """tied → qwen2 checkpoint whose 2-D weights lie on an int4 grid (see grid_weights)."""
    return {
        False: write_grid_checkpoint(tmp_path_factory.mktemp("grid_untied"), "qwen2", seed=2),
        True: write_grid_checkpoint(tmp_path_factory.mktemp("grid_tied"), "qwen2", seed=2, **TIED),
    }


@pytest.fixture(scope="session")
def mild_ckpt(tmp_path_factory) -> Path:
    """Random qwen2, tied (vocab 256), projection weights scaled to std 0.05.

    With tests._hf's std 0.2 the tiny models are chaotic (a 1% weight change moves the logits
    by tens of percent), which hides what int4 rounding itself costs; at std 0.05 they are not.
    """
    dest = write_tiny_checkpoint(tmp_path_factory.mktemp("mild"), "qwen2", seed=3, **TIED)
    tensors = load_file(dest / "model.safetensors")
    for name, array in tensors.items():
        if array.ndim == 2 and "embed_tokens" not in name:
            tensors[name] = array * 0.25
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    return dest
