"""Weights of the new layouts: fused tensors split lazily, [in, out] matrices, norm offsets."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.checkpoint.weights import Checkpoint
from tests._hf import write_tiny_checkpoint


def _values(package) -> dict[str, np.ndarray]:
    return {
        name: value.const_value.numpy()
        for name, value in package["model"].graph.initializers.items()
        if value.const_value is not None
    }


def test_phi3_fused_qkv_and_gate_up_split_into_projections(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phi3")
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    layer = "model.layers.1"
    qkv = stored[f"{layer}.self_attn.qkv_proj.weight"]  # [q 64 | k 32 | v 32, hidden]
    np.testing.assert_array_equal(ours[f"{layer}.self_attn.q_proj.weight"], qkv[:64].T)
    np.testing.assert_array_equal(ours[f"{layer}.self_attn.k_proj.weight"], qkv[64:96].T)
    np.testing.assert_array_equal(ours[f"{layer}.self_attn.v_proj.weight"], qkv[96:].T)
    gate_up = stored[f"{layer}.mlp.gate_up_proj.weight"]  # [gate 96 | up 96, hidden]
    np.testing.assert_array_equal(ours[f"{layer}.mlp.gate_proj.weight"], gate_up[:96].T)
    np.testing.assert_array_equal(ours[f"{layer}.mlp.up_proj.weight"], gate_up[96:].T)


def test_gpt2_conv1d_weights_are_read_as_stored(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt2")
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    c_attn = stored["transformer.h.0.attn.c_attn.weight"]  # Conv1D: [in, 3 * hidden]
    bias = stored["transformer.h.0.attn.c_attn.bias"]
    for i, part in enumerate("qkv"):
        columns = slice(64 * i, 64 * (i + 1))
        name = f"model.layers.0.self_attn.{part}_proj"
        np.testing.assert_array_equal(ours[f"{name}.weight"], c_attn[:, columns])
        np.testing.assert_array_equal(ours[f"{name}.bias"], bias[columns])
    np.testing.assert_array_equal(
        ours["model.layers.0.mlp.fc1.weight"], stored["transformer.h.0.mlp.c_fc.weight"]
    )
    np.testing.assert_array_equal(
        ours["model.embed_positions.weight"], stored["transformer.wpe.weight"]
    )


def test_parts_are_read_as_slices(tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phi3", num_hidden_layers=1)
    reads = []
    original = Checkpoint.read

    def read(self, name, index=None):
        array = original(self, name, index)
        reads.append((name, array.shape))
        return array

    monkeypatch.setattr(Checkpoint, "read", read)
    _values(mobius_genai.build(ckpt, "default"))
    fused = sorted(shape for name, shape in reads if name.endswith("qkv_proj.weight"))
    assert fused == [(32, 64), (32, 64), (64, 64)]  # never the whole [128, 64] tensor


def test_fused_tensor_of_the_wrong_size_names_its_parts(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phi3", num_hidden_layers=1)
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.0.self_attn.qkv_proj.weight"
    tensors[name] = tensors[name][:-8]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"qkv_proj.weight.*120 entries.*q_proj.*need 128"):
        mobius_genai.build(ckpt, "default")


def test_glm_gate_up_split_and_cohere_stacked_qk_norm_weights(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "glm", "glm")
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    gate_up = stored["model.layers.2.mlp.gate_up_proj.weight"]  # [gate 96 | up 96, hidden]
    np.testing.assert_array_equal(ours["model.layers.2.mlp.gate_proj.weight"], gate_up[:96].T)
    np.testing.assert_array_equal(ours["model.layers.2.mlp.up_proj.weight"], gate_up[96:].T)
    ckpt = write_tiny_checkpoint(tmp_path / "cohere", "cohere", use_qk_norm=True)
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    for part, heads in (("q", 4), ("k", 2)):
        name = f"model.layers.0.self_attn.{part}_norm.weight"
        assert stored[name].shape == (heads, 16)
        np.testing.assert_array_equal(ours[name], stored[name])
    assert not any(name.endswith("layernorm.bias") for name in ours)  # LayerNorms without bias


def test_gemma_norm_weights_are_stored_plus_one(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gemma3_text", num_hidden_layers=2)
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    norms = [name for name in stored if name.endswith("norm.weight")]
    assert len(norms) == 1 + 2 * 6  # final norm; 4 sandwich norms + q/k norms per layer
    for name in norms:
        np.testing.assert_allclose(ours[name], stored[name] + 1.0, rtol=0, atol=1e-7)
    proj = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(ours[proj], stored[proj].T)


def test_gpt_neox_per_head_qkv_rows_become_q_k_v_blocks(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_neox")
    stored = load_file(ckpt / "model.safetensors")
    ours = _values(mobius_genai.build(ckpt, "default"))
    fused = "gpt_neox.layers.2.attention.query_key_value"
    packed = "model.layers.2.self_attn.qkv_proj"
    # GPTNeoXAttention views the projection as [..., heads, 3 * head_dim] and chunks it in 3
    by_head = stored[f"{fused}.weight"].reshape(4, 3, 16, 64)  # [head, q/k/v, d, hidden]
    for part in range(3):
        rows = by_head[:, part].reshape(64, 64)
        np.testing.assert_array_equal(
            ours[f"{packed}.weight"][:, 64 * part : 64 * (part + 1)], rows.T
        )
        bias = stored[f"{fused}.bias"].reshape(4, 3, 16)[:, part].reshape(64)
        np.testing.assert_array_equal(ours[f"{packed}.bias"][64 * part : 64 * (part + 1)], bias)
    np.testing.assert_array_equal(ours["lm_head.weight"], stored["embed_out.weight"].T)
