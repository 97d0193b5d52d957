"""Weights stored interleaved by group (grouped_weights.py): Qwen3-Next's packed projections
read back as the separate ones transformers' fix_query_key_value_ordering derives, and errors
that name the tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.models import get_family
from tests._hf import tiny_config, write_tiny_checkpoint


@pytest.mark.parametrize("value_heads", [4, 2])
def test_rows_unpack_as_transformers_orders_them(value_heads):
    hf_config = tiny_config("qwen3_next", linear_num_value_heads=value_heads)
    block = Qwen3NextGatedDeltaNet(hf_config, layer_idx=0)
    config = get_family("qwen3_next").parse_config(hf_config.to_dict())
    qkvz, ba = (get_family("qwen3_next").grouped_weights[i] for i in (0, 1))
    eye_qkvz = torch.eye(block.in_proj_qkvz.out_features)[None]  # row i of the output: row i
    eye_ba = torch.eye(block.in_proj_ba.out_features)[None]
    q, k, v, z, b, a = block.fix_query_key_value_ordering(eye_qkvz, eye_ba)

    # token i is one-hot at stored row i: each output channel's argmax over the tokens is
    # the stored row it reads
    def stored_rows(*outputs: torch.Tensor) -> list[int]:
        channels = torch.cat([x[0].reshape(x.shape[1], -1) for x in outputs], -1)
        return channels.argmax(0).tolist()

    expected = {"qkv": stored_rows(q, k, v), "z": stored_rows(z), "b": stored_rows(b)}
    expected["a"] = stored_rows(a)
    for weight, part in ((qkvz, "qkv"), (qkvz, "z"), (ba, "b"), (ba, "a")):
        rows = [i for start, stop in weight.rows(part, config) for i in range(start, stop)]
        assert rows == expected[part], part


def test_a_packed_tensor_of_the_wrong_size_is_named(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "qwen3_next")
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.0.linear_attn.in_proj_ba.weight"
    tensors[name] = np.concatenate([tensors[name], tensors[name][:2]])
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=f"tensor '{name}' has shape \\[10, 64\\].*needs"):
        mobius_genai.build(ckpt, "default", "f32")


def test_a_missing_packed_tensor_is_named(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "qwen3_next")
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.2.linear_attn.in_proj_qkvz.weight"
    del tensors[name]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=f"lacks tensor '{name}'"):
        mobius_genai.build(ckpt, "default", "f32")
