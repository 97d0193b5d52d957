"""Mamba's, FalconMamba's and Mamba2's residual stream in float32 (`residual_in_fp32`, their
default): transformers' MambaBlock (and Mamba2Block) reads the stream in the model dtype and adds the mixer's output to it
in float32, so a float16 or bfloat16 bundle carries it between the layers in float32; a float32
bundle is unchanged, and `residual_in_fp32: false` keeps the stream in the model dtype.

The float16 bundle runs on onnxruntime's CPU EP against transformers run in float16 on the CPU.
Its checkpoint makes the residual's rounding the largest error: 32 layers, and embeddings 256
times their drawn size, so that the stream is far larger than each mixer's output (float16
keeps 11 significant bits of the stream at every add; a mixer's own float16 arithmetic, in
which transformers and onnxruntime differ, rounds only its small output).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import pytest
import torch
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai.models import FAMILIES
from tests._hf import write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests._recurrent import cached_reference

FAMILIES_HERE = ("mamba", "falcon_mamba", "mamba2")
LAYERS = 32
EMBEDDING_SCALE = 256.0


def _float16_tolerance(logits: list[np.ndarray]) -> float:
    """1.5 float16 spacings at the largest logit: transformers' float16 logits and ours are
    each rounded to float16 (half a spacing each), and the mixers' float16 arithmetic differs
    by less than the other half. A stream rounded to float16 at each of the 32 adds is more
    than 2 spacings off (measured: 2.25 for both families)."""
    largest = max(float(np.abs(step).max()) for step in logits)
    return 1.5 * float(np.spacing(np.float16(largest)))


def _checkpoint(folder, family: str, **overrides):
    ckpt = write_tiny_checkpoint(
        folder, family, num_hidden_layers=LAYERS, tie_word_embeddings=False, **overrides
    )
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    for name in tensors:
        if "embeddings" in name:
            tensors[name] = tensors[name] * EMBEDDING_SCALE
    save_file(tensors, path, metadata={"format": "pt"})
    return ckpt


def _float16_diff(ckpt, reference, directory) -> float:
    package = mobius_genai.build(ckpt, "cpu", "f16", progress=False)
    ours = run_like_reference(ort_session(package, directory), reference)
    return max_abs_diff(ours, reference.logits)


@pytest.mark.parametrize(
    "family", ["mamba", *(pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES_HERE[1:])]
)
def test_float16_bundle_adds_residuals_in_float32_as_transformers(family, tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "ckpt", family)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    reference = cached_reference(ckpt, ids, 2, dtype=torch.float16)
    tolerance = _float16_tolerance(reference.logits)
    assert _float16_diff(ckpt, reference, tmp_path / "ours") <= tolerance
    # the mutant: the stream in the model dtype, as the bundle added it before
    row = FAMILIES[family]
    mutant = {**row.config_overrides, "residual_in_float32": False}
    monkeypatch.setitem(FAMILIES, family, dataclasses.replace(row, config_overrides=mutant))
    assert _float16_diff(ckpt, reference, tmp_path / "mutant") > tolerance


_MODEL_DTYPES = {"f16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


def _stream_reads(model: ir.Model, dtype: ir.DataType) -> int:
    """The Casts of a float32 residual add's sum to the model dtype: the next layer's read of
    the stream, or the final norm's."""
    return sum(
        node.op_type == "Cast"
        and node.attributes["to"].as_int() == dtype
        and node.inputs[0].producer() is not None
        and node.inputs[0].producer().op_type == "Add"
        and node.inputs[0].dtype == ir.DataType.FLOAT
        for node in model.graph
    )


@pytest.mark.parametrize("family", FAMILIES_HERE)
@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_a_16_bit_bundle_carries_the_stream_in_float32_between_layers(family, precision, tmp_path):
    """Each of the 3 layers' sums is float32 and read back in the model dtype; with
    `residual_in_fp32: false` none is. (cuda's graphs: bfloat16 is not a CPU dtype.)"""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    dtype = _MODEL_DTYPES[precision]
    model = mobius_genai.build(ckpt, "cuda", precision, load_weights=False)["model"]
    assert _stream_reads(model, dtype) == 3
    plain = write_tiny_checkpoint(tmp_path / "plain", family, residual_in_fp32=False)
    model = mobius_genai.build(plain, "cuda", precision, load_weights=False)["model"]
    assert _stream_reads(model, dtype) == 0


@pytest.mark.parametrize("family", FAMILIES_HERE)
def test_a_float32_bundle_gets_no_cast(family, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    plain = write_tiny_checkpoint(tmp_path / "plain", family, residual_in_fp32=False)
    graphs = [
        mobius_genai.build(folder, "cpu", "f32", load_weights=False)["model"].graph
        for folder in (ckpt, plain)
    ]
    assert [node.op_type for node in graphs[0]] == [node.op_type for node in graphs[1]]
