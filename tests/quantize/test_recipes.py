"""Quality recipes as data: which weights each recipe keeps in 8 bits, in the graph and report."""

from __future__ import annotations

import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options, quantize_int4
from mobius_genai.quantize.recipes import layer_index, more_bits_layer
from tests.conftest import TINY_QWEN2


def test_more_bits_layers_are_llama_cpps():
    """llama.cpp's use_more_bits for 32 layers (its Q4_K_M v/down layers): the first and last
    four, and 6, 9, ..., 27."""
    chosen = [index for index in range(32) if more_bits_layer(index, 32)]
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("model.layers.11.mlp.down_proj.weight", 11),
        ("layers.0.attn.qkv.weight", 0),
        ("model.embed_tokens.weight", None),
        ("model.mylayers.3.w", None),
    ],
)
def test_layer_index_from_the_weight_name(name, index):
    assert layer_index(name) == index


def _graph_bits(model: ir.Model) -> dict[str, tuple[int, int]]:
    """Weight name (without the _Q suffix) -> (bits, block_size) of its MatMulNBits."""
    found = {}
    for node in model.graph:
        if node.op_type == "MatMulNBits":
            name = node.inputs[1].name.rsplit("_Q", 1)[0]
            found[name] = (node.attributes.get_int("bits"), node.attributes.get_int("block_size"))
    return found


@pytest.mark.parametrize(
    ("ep", "wide"),
    [
        # cpu f32 packs q/k/v into one projection: it is split into q (4-bit) and k/v (8-bit)
        (
            "cpu",
            {
                "model.layers.0.self_attn.k_proj+v_proj.weight": 64,
                "model.layers.1.self_attn.k_proj+v_proj.weight": 64,
                "model.layers.1.mlp.down_proj.weight": 128,
            },
        ),
        # webgpu keeps them apart: k and v are 8-bit, q stays 4-bit
        (
            "webgpu",
            {
                "model.layers.0.self_attn.k_proj.weight": 64,
                "model.layers.0.self_attn.v_proj.weight": 64,
                "model.layers.1.self_attn.k_proj.weight": 64,
                "model.layers.1.self_attn.v_proj.weight": 64,
                "model.layers.1.mlp.down_proj.weight": 128,
            },
        ),
    ],
)
def test_mixed_recipe_widens_attention_kv_and_more_bits_down_proj(ep, wide):
    """Two layers: llama.cpp's rule picks layer 1 (the last eighth) for down_proj. The graph's
    MatMulNBits and the report (the manifest's quantization section) agree on every format."""
    caps = get_ep(ep)
    package = mobius_genai.build(TINY_QWEN2, caps, "f32")
    report = quantize_int4(package["model"], Int4Options(quality="mixed"), caps)
    graph = _graph_bits(package["model"])
    assert {name for name, (bits, _) in graph.items() if bits == 8} == set(wide)
    for name, (_, block_size) in graph.items():
        assert block_size == wide.get(name, 32)
    assert {weight.name: (weight.bits, weight.block_size) for weight in report.weights} == graph
    assert report.to_dict()["weights_8bit"] == wide
    assert report.embedding == "int4-shared"
