"""MXFP4 experts (gpt_oss checkpoints as published): blocks and scales written from the format's
definition, dequantized as transformers' own code does, one expert at a time, and the model
built from them matching transformers run on the same weights dequantized by transformers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

import mobius_genai
from mobius_genai.checkpoint.prequantized import mxfp4
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.errors import ConfigError, UnsupportedModelError, WeightsError
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
PROJECTIONS = ("gate_up_proj", "down_proj")
QUANTIZATION = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def _random_mxfp4(rng, experts, rows, columns):
    """Every FP4 code, exponents 2^-5 .. 2^-2 (weights of the tiny model's size)."""
    blocks = rng.integers(0, 256, size=(experts, rows, columns // 32, 16), dtype=np.uint8)
    scales = rng.integers(122, 126, size=(experts, rows, columns // 32), dtype=np.uint8)
    return blocks, scales


def _transformers_dequantized(blocks, scales) -> np.ndarray:
    """transformers' dequantization: [E, columns, rows], the float checkpoint's layout."""
    out = convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )
    return out.numpy()


def _mxfp4_pair(tmp_path, seed=1):
    """A float gpt_oss checkpoint whose experts transformers dequantized from random MXFP4
    blocks, and the same checkpoint storing those blocks and scales (quant_method mxfp4)."""
    dense = write_tiny_checkpoint(tmp_path / "dense", "gpt_oss", seed=seed)
    packed = write_tiny_checkpoint(tmp_path / "mxfp4", "gpt_oss", seed=seed)
    tensors = load_file(dense / "model.safetensors")
    stored = {}
    rng = np.random.default_rng(seed)
    for name in sorted(tensors):
        if not name.endswith(PROJECTIONS):
            stored[name] = tensors[name]
            continue
        experts, columns, rows = tensors[name].shape  # stored [E, in, out]
        blocks, scales = _random_mxfp4(rng, experts, rows, columns)
        tensors[name] = _transformers_dequantized(blocks, scales)
        stored[f"{name}_blocks"], stored[f"{name}_scales"] = blocks, scales
    save_file(tensors, dense / "model.safetensors", metadata={"format": "pt"})
    save_file(stored, packed / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((packed / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION
    (packed / "config.json").write_text(json.dumps(config))
    return dense, packed


def test_fp4_table_and_dequantization_match_transformers():
    assert mxfp4.FP4_VALUES.tolist() == FP4_VALUES
    rng = np.random.default_rng(0)
    blocks, scales = _random_mxfp4(rng, 3, 8, 64)
    scales[0, 0, 0], scales[1, 2, 1] = 0, 252  # 2^-127, and 6 * 2^125 near the float32 max
    ours = mxfp4.dequantize(blocks, scales)  # [E, rows, columns]
    reference = _transformers_dequantized(blocks, scales).transpose(0, 2, 1)
    np.testing.assert_array_equal(ours, reference)


def test_mxfp4_experts_build_the_model_transformers_runs(tmp_path, monkeypatch):
    dense, packed = _mxfp4_pair(tmp_path)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(dense, ids, decode_steps=3)
    reads = []
    original = Checkpoint.read

    def recording_read(self, name, index=None):
        reads.append((name, index))
        return original(self, name, index)

    monkeypatch.setattr(Checkpoint, "read", recording_read)
    for ep in ("cpu", "onnx-standard"):
        package = mobius_genai.build(packed, ep, "f32", progress=False)
        ours = run_like_reference(ort_session(package, tmp_path / ep), reference)
        assert max_abs_diff(ours, reference.logits) <= TOLERANCE, ep
    stored = [(name, index) for name, index in reads if name.endswith(("_blocks", "_scales"))]
    assert stored and all(index is not None for _, index in stored)  # never a whole tensor
    assert {index[0].stop - index[0].start for _, index in stored} == {1}  # one expert a read


def _rewrite(ckpt, change) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_misshapen_scales_are_named(tmp_path):
    _, packed = _mxfp4_pair(tmp_path)
    name = "model.layers.1.mlp.experts.down_proj_scales"
    _rewrite(packed, lambda tensors: tensors.update({name: tensors[name][:, :, :2].copy()}))
    with pytest.raises(WeightsError, match=f"'{name}' has shape \\[4, 64, 2\\].*\\[4, 64, 3\\]"):
        mobius_genai.build(packed, "cpu", "f32")


def test_missing_scales_are_named(tmp_path):
    _, packed = _mxfp4_pair(tmp_path)
    name = "model.layers.0.mlp.experts.gate_up_proj_scales"
    _rewrite(packed, lambda tensors: tensors.pop(name))
    with pytest.raises(WeightsError, match=f"lacks tensor '{name}'"):
        mobius_genai.build(packed, "cpu", "f32")


def test_nan_exponent_is_refused(tmp_path):
    _, packed = _mxfp4_pair(tmp_path)
    name = "model.layers.2.mlp.experts.gate_up_proj_scales"

    def nan_scale(tensors):
        tensors[name][3, 0, 0] = 255

    _rewrite(packed, nan_scale)
    with pytest.raises(WeightsError, match=f"'{name}' \\(expert 3\\)"):
        mobius_genai.build(packed, "cpu", "f32", progress=False).save(tmp_path / "out")


def _with_quantization(ckpt, quantization) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"] = quantization
    (ckpt / "config.json").write_text(json.dumps(config))


def test_unknown_quant_method_is_a_config_error(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    _with_quantization(ckpt, {"quant_method": "bitsandbytes"})
    with pytest.raises(ConfigError, match="quant_method is 'bitsandbytes'; accepted: .*mxfp4.*fp8"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_mxfp4_outside_moe_experts_is_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "llama")
    _with_quantization(ckpt, QUANTIZATION)
    with pytest.raises(UnsupportedModelError, match="'mxfp4' for model_type 'llama'"):
        mobius_genai.build(ckpt, "cpu", "f32")
