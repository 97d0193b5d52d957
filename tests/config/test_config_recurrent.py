"""Recurrent blocks declare their states in one registry (config/recurrent.py): a block added
there and nowhere else gets its graph inputs and outputs, its genai_config entries and its
validation; the validator rejects a graph that lacks a declared state."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import pytest
from onnxscript import nn
from transformers import Lfm2Config

from mobius_genai.bundle.genai_config import make_genai_config
from mobius_genai.bundle.graph import GraphInfo, TensorSpec, cache_roles
from mobius_genai.bundle.validate import check_graph_against_config
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.recurrent import (
    FROM_KV_NAMES,
    IN_GENAI_CONFIG,
    RECURRENT_BLOCKS,
    RecurrentBlock,
    State,
)
from mobius_genai.config.short_conv import ShortConvConfig, read_short_conv
from mobius_genai.ep import get_ep
from mobius_genai.ep.context import build_context
from mobius_genai.errors import ConfigError
from mobius_genai.models import CausalLMModel
from mobius_genai.tasks.causal_lm import CausalLMTask

F16, F32 = ir.DataType.FLOAT16.value, ir.DataType.FLOAT.value


@dataclasses.dataclass(frozen=True)
class _SsmSizes:
    """The config section a new block's family rows would read (Mamba2-like sizes)."""

    heads: int = 2
    head_dim: int = 8
    state_size: int = 4
    taps: int = 4


@dataclasses.dataclass(frozen=True)
class _Config(ArchitectureConfig):
    """ArchitectureConfig with the new block's section, as adding its field would give."""

    fake_ssm: _SsmSizes | None = None


class _FakeSsm(nn.Module):
    """A stand-in token mixer: its output is its input, its new states its old ones."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()

    def forward(self, op, hidden_states, attention_mask, *past):
        return (hidden_states, *(op.Identity(state) for state in past))


def _conv_dims(config) -> tuple[int, ...]:
    sizes = config.fake_ssm
    return sizes.heads * sizes.head_dim + 2 * sizes.state_size, sizes.taps - 1


def _ssm_dims(config) -> tuple[int, ...]:
    return config.fake_ssm.heads, config.fake_ssm.head_dim, config.fake_ssm.state_size


def _block(states: tuple[State, ...], naming) -> RecurrentBlock:
    return RecurrentBlock("fake_ssm", "fake_ssm", "mixer", f"{__name__}:_FakeSsm", states, naming)


#: A Mamba2-like block as og 0.18's generic decoder would run it (states named from the KV
#: names), and one whose states genai_config declares, as LFM2's are.
_FROM_KV = _block(
    (
        State("conv_state", ("conv_dim", "conv_cache_size"), _conv_dims),
        State("recurrent_state", ("heads", "head_dim", "state_size"), _ssm_dims, float32=True),
    ),
    FROM_KV_NAMES,
)
_DECLARED = _block(
    (State("ssm", ("hidden_size", "ssm_size"), lambda c: (c.hidden_size, c.fake_ssm.head_dim)),),
    IN_GENAI_CONFIG,
)

# row → (past input, present output, shape, element type) of layer 2's states, and the
# genai_config decoder entries the block brings
_EXPECTED = {
    "from_kv_names": (
        _FROM_KV,
        [
            ("past_key_values.2.conv_state", "present.2.conv_state", (24, 3), F16),
            ("past_key_values.2.recurrent_state", "present.2.recurrent_state", (2, 8, 4), F32),
        ],
        {},
    ),
    "declared": (
        _DECLARED,
        [("past.2.ssm", "present.2.ssm", (64, 8), F16)],
        {
            "layer_types": ["fake_ssm", "full_attention", "fake_ssm"],
            "hidden_size": 64,
            "ssm_size": 8,
            "inputs": {"past_ssm_names": "past.%d.ssm"},
            "outputs": {"present_ssm_names": "present.%d.ssm"},
        },
    ),
}


def _config(**overrides) -> _Config:
    fields = {
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "layer_types": ("fake_ssm", "full_attention", "fake_ssm"),
        "fake_ssm": _SsmSizes(),
    }
    return _Config(**{**fields, **overrides})


def _graph(config: ArchitectureConfig) -> GraphInfo:
    with build_context("cpu", ir.DataType.FLOAT16):
        model = CausalLMTask().build(CausalLMModel(config), config)
    return GraphInfo.from_proto(ir.to_proto(model))


@pytest.mark.parametrize("kind", sorted(_EXPECTED))
def test_a_block_declared_only_in_the_registry_is_wired_and_validated(kind, monkeypatch):
    block, states, entries = _EXPECTED[kind]
    monkeypatch.setitem(RECURRENT_BLOCKS, "fake_ssm", block)
    config = _config()
    assert isinstance(CausalLMModel(config).model.layers[0].mixer, _FakeSsm)
    graph = _graph(config)
    for past, present, dims, elem in states:
        assert graph.inputs[past] == TensorSpec(elem, ("batch_size", *dims))
        assert graph.outputs[present] == TensorSpec(elem, ("batch_size", *dims))
    assert "past_key_values.1.key" in graph.inputs
    assert "past_key_values.0.key" not in graph.inputs
    assert {state.suffix for state in block.states} <= set(cache_roles())

    document = make_genai_config(config, get_ep("cpu"), graph)
    decoder = document["model"]["decoder"]
    for key, value in entries.items():
        found = decoder[key]
        assert (found.items() >= value.items()) if isinstance(value, dict) else found == value
    if not entries:
        assert "layer_types" not in decoder
        assert set(decoder["inputs"]) == {
            "input_ids",
            "attention_mask",
            "position_ids",
            "past_key_names",
            "past_value_names",
        }
    assert check_graph_against_config(document, graph) == []

    past, present, _, _ = states[-1]
    lacking = dataclasses.replace(
        graph, outputs={k: v for k, v in graph.outputs.items() if k != present}
    )
    assert any(present in problem for problem in check_graph_against_config(document, lacking))
    lacking = dataclasses.replace(
        graph, inputs={k: v for k, v in graph.inputs.items() if k != past.replace(".2.", ".0.")}
    )
    assert check_graph_against_config(document, lacking)


def test_a_declared_state_of_another_size_than_genai_config_says_is_rejected(monkeypatch):
    monkeypatch.setitem(RECURRENT_BLOCKS, "fake_ssm", _DECLARED)
    config = _config()
    graph = _graph(config)
    document = make_genai_config(config, get_ep("cpu"), graph)
    document["model"]["decoder"]["ssm_size"] = 5
    assert check_graph_against_config(document, graph) == [
        f"model.decoder.ssm_size: 5 but graph '{name}' has 8 at dim 2"
        for name in ("past.0.ssm", "present.0.ssm")
    ]


def test_states_named_from_the_kv_names_are_those_og_derives():
    with pytest.raises(ValueError, match="accepted: \\['conv_state', 'recurrent_state'\\]"):
        _block((State("ssm_state", ("heads",), lambda c: (2,)),), FROM_KV_NAMES)


def test_a_registered_kind_needs_its_config_section_and_an_unknown_kind_is_refused(monkeypatch):
    with pytest.raises(ConfigError, match=r"layer_types holds \['fake_ssm', 'fake_ssm'\]"):
        _config()
    monkeypatch.setitem(RECURRENT_BLOCKS, "fake_ssm", _FROM_KV)
    with pytest.raises(ConfigError, match="has fake_ssm layers, which only the families that"):
        _config(fake_ssm=None)


def test_short_conv_settings_are_read_as_lfm2config_fills_them():
    default = Lfm2Config()
    assert read_short_conv({}) == ShortConvConfig(default.conv_L_cache, default.conv_bias)
    set_ = Lfm2Config(conv_L_cache=5, conv_bias=True)
    raw = {"conv_L_cache": set_.conv_L_cache, "conv_bias": set_.conv_bias}
    assert read_short_conv(raw) == ShortConvConfig(5, True)
    assert read_short_conv(raw).cache_size == 4
    with pytest.raises(ConfigError, match="at least 2 taps"):
        read_short_conv({"conv_L_cache": 1})
