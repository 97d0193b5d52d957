"""Config sizes are bounded, and checked against the checkpoint before anything is built.

Sizes no real model has (num_hidden_layers 1e9, a context of 1e9 positions) used to hang or
end in multi-GB allocations; config values that contradict the checkpoint's tensor shapes
are found from the safetensors headers before the graph and the rotary tables are built.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import mobius_genai
from mobius_genai import ArchitectureConfig, ConfigError, WeightsError
from mobius_genai.cli import main
from mobius_genai.components import rope
from mobius_genai.config.limits import SIZE_LIMITS
from mobius_genai.models import get_family
from mobius_genai.tasks.causal_lm import CausalLMTask
from tests.config.test_config import BASE
from tests.conftest import TINY_QWEN2

HUGE = 10**9


@pytest.mark.parametrize("field", sorted(set(SIZE_LIMITS) - {"context_length"}))
def test_sizes_no_real_model_has_are_refused_naming_field_value_and_bound(field: str):
    raw = {**BASE, field: HUGE}
    if field == "num_attention_heads":
        raw["num_key_value_heads"] = HUGE
    with pytest.raises(ConfigError) as caught:
        ArchitectureConfig.from_dict(raw)
    message = str(caught.value)
    assert f"'{field}'" in message and str(HUGE) in message
    assert str(SIZE_LIMITS[field]) in message
    assert "\n" not in message


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "smollm3", "olmo3", "vaultgemma"])
def test_families_that_list_something_per_layer_refuse_a_huge_layer_count_first(family: str):
    """These families build a per-layer list from num_hidden_layers while parsing."""
    with pytest.raises(ConfigError, match=r"'num_hidden_layers'.*1000000000"):
        get_family(family).parse_config({**BASE, "model_type": family, "num_hidden_layers": HUGE})


def test_a_sliding_window_config_refuses_a_huge_layer_count_first():
    raw = {**BASE, "num_hidden_layers": HUGE, "sliding_window": 16}
    with pytest.raises(ConfigError, match=r"'num_hidden_layers'.*1000000000"):
        ArchitectureConfig.from_dict(raw)


def test_the_largest_real_sizes_are_accepted():
    """Llama 3.1 405B's sizes, Gemma 3's vocabulary and head size, Llama 4 Scout's context."""
    raw = {
        **BASE,
        "vocab_size": 262_144,
        "hidden_size": 16_384,
        "intermediate_size": 53_248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "max_position_embeddings": 10_485_760,
    }
    config = ArchitectureConfig.from_dict(raw)
    assert config.max_position_embeddings == 10_485_760


def test_a_huge_context_length_is_refused():
    with pytest.raises(ConfigError) as caught:
        mobius_genai.build(TINY_QWEN2, "cpu", "f32", context_length=HUGE)
    message = str(caught.value)
    assert "context_length" in message and str(HUGE) in message
    assert str(SIZE_LIMITS["context_length"]) in message


def test_the_cli_refuses_a_huge_context_length_in_one_line(tmp_path: Path, capsys):
    out = tmp_path / "graph"
    args = ["build", str(TINY_QWEN2), "-o", str(out), "--context-length", str(HUGE)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "context_length" in err and str(HUGE) in err
    assert not out.exists()


def _copy(tmp_path: Path, **config: object) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY_QWEN2, folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


@pytest.fixture
def nothing_large_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph and the rotary tables may not be built (the checks must come first)."""

    def refuse(*args, **kwargs):
        raise AssertionError("built before the config was checked against the checkpoint")

    monkeypatch.setattr(CausalLMTask, "build", refuse)
    monkeypatch.setattr(rope, "inverse_frequencies", refuse)


@pytest.mark.parametrize(
    ("field", "value", "tensor"),
    [
        ("hidden_size", 128, r"model\.embed_tokens\.weight"),
        ("vocab_size", 1 << 20, r"model\.embed_tokens\.weight"),
        ("intermediate_size", 1 << 18, r"model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight"),
        ("head_dim", 1024, r"model\.layers\.0\.self_attn\.q_proj\.weight"),
        ("num_key_value_heads", 4, r"model\.layers\.0\.self_attn\.k_proj\.weight"),
    ],
)
def test_sizes_that_contradict_the_checkpoint_are_refused_before_anything_is_built(
    tmp_path: Path, nothing_large_is_built: None, field: str, value: int, tensor: str
):
    ckpt = _copy(tmp_path, **{field: value}, max_position_embeddings=1 << 24)
    with pytest.raises(WeightsError, match=f"'{tensor}'.* has shape"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_more_layers_than_the_checkpoint_holds_names_the_missing_tensors_first(
    tmp_path: Path, nothing_large_is_built: None
):
    ckpt = _copy(tmp_path, num_hidden_layers=1000)
    with pytest.raises(WeightsError) as caught:
        mobius_genai.build(ckpt, "cpu", "f32")
    message = str(caught.value)
    assert "'model.layers.2.input_layernorm.weight'" in message
    assert "num_hidden_layers" in message


def test_rotary_tables_are_computed_when_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The tables of a long context cost memory only while the model is written."""
    calls = []
    original = rope.inverse_frequencies
    monkeypatch.setattr(
        rope, "inverse_frequencies", lambda *args, **kw: calls.append(1) or original(*args, **kw)
    )
    built = mobius_genai.build(TINY_QWEN2, "cpu", "f32", context_length=1 << 12)
    assert calls == []
    cos = built["model"].graph.initializers["model.rotary_emb.cos_cache"].const_value
    table = rope.RotaryEmbedding(built.config.rope, built.config.rotary_dim, 1 << 12).cos_cache
    expected = table.const_value.numpy()
    assert cos.numpy().shape == (1 << 12, 8) and (cos.numpy() == expected).all()
    assert calls
