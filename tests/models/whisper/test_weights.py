"""Whisper checkpoints read through the project's weight checks: a config.json that disagrees
with the tensors, and a stored output projection that is not the token table, are one-line
WeightsErrors naming the tensors."""

from __future__ import annotations

import shutil

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import load_file, save_file

from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.ep.context import build_context
from mobius_genai.errors import WeightsError
from mobius_genai.models.whisper import whisper_graphs
from tests._hf import edit_config
from tests.models.whisper._whisper import read_config


def _graphs(folder):
    with build_context("default", ir.DataType.FLOAT):
        return whisper_graphs(read_config(folder), Checkpoint(folder))


def test_more_decoder_layers_than_stored_names_the_missing_tensors(
    multilingual_checkpoint, tmp_path
):
    _, folder = multilingual_checkpoint
    copy = shutil.copytree(folder, tmp_path / "ckpt")
    edit_config(copy, decoder_layers=3)
    with pytest.raises(WeightsError, match=r"model\.decoder\.layers\.2\.") as error:
        _graphs(copy)
    assert "\n" not in str(error.value)


def test_stored_output_projection_must_equal_the_token_table(multilingual_checkpoint, tmp_path):
    _, folder = multilingual_checkpoint
    copy = shutil.copytree(folder, tmp_path / "ckpt")
    tensors = load_file(copy / "model.safetensors")
    table = tensors["model.decoder.embed_tokens.weight"]
    save_file({**tensors, "proj_out.weight": table.copy()}, copy / "model.safetensors")
    assert set(_graphs(copy)) == {"encoder", "decoder"}  # an equal copy is accepted
    save_file({**tensors, "proj_out.weight": table + np.float32(1)}, copy / "model.safetensors")
    with pytest.raises(WeightsError, match="proj_out.weight"):
        _graphs(copy)
