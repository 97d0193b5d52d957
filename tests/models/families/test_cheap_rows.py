"""biogpt, ctrl, openai-gpt, hyperclovax and gpt-sw3 beyond the parity table (test_parity.py's CASES and
MUTANTS): a left-padded batch against transformers (openai-gpt's, which keeps no cache,
recomputed: tests/_hf.py), onnxruntime-genai's tokens from ctrl's bundle alone and in a batch
(the others': test_bundles.py, slow), the GPU EPs' graphs, and the config switches these rows
read or refuse."""

from __future__ import annotations

import dataclasses
import json

import pytest

import mobius_genai
from mobius_genai import ConfigError, UnsupportedModelError
from mobius_genai.cli import main as cli_main
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.models import FAMILIES
from tests._bundles import bundle_checkpoint, check_bundle_generates_like_transformers
from tests._hf import edit_config, tiny_config, write_tiny_checkpoint
from tests._ort import left_padded_diffs

TOLERANCE = 1e-4  # f32, max abs diff of logits


@pytest.mark.parametrize("family", ["biogpt", "ctrl", "gpt-sw3", "openai-gpt"])
def test_left_padded_batch_matches_transformers(family, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=2)
    first, rest = left_padded_diffs(ckpt, tmp_path / "onnx")
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def test_ctrl_bundle_generates_like_transformers(tmp_path, capsys):
    """og runs CTRL's graph (sinusoids from the positions og feeds, a biased tied head) as
    transformers does, alone and in a batch of prompts of different lengths."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "ctrl")
    check_bundle_generates_like_transformers(ckpt, tmp_path, capsys)


@pytest.mark.parametrize("ep", ["cuda", "dml", "webgpu"])
@pytest.mark.parametrize("family", ["biogpt", "ctrl", "openai-gpt"])
def test_gpu_ep_graphs_attend_with_group_query_attention(family, ep, tmp_path):
    """The positions added before the first layer leave every layer to the GQA fusion, and
    each norm with the residual add before it to SkipLayerNormalization (float16)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 3 and "Attention" not in ops
    # pre-LN: each layer's two and the final norm; post-LN (openai-gpt): each layer's two
    assert ops.count("SkipLayerNormalization") == (6 if family == "openai-gpt" else 7)


def _parsed(family: str, **overrides) -> ArchitectureConfig:
    raw = tiny_config(family, **overrides).to_dict()
    return FAMILIES[family].parse_config(json.loads(json.dumps(raw)))


def test_biogpt_reads_its_layout_and_not_its_layer_norm_eps():
    config = _parsed("biogpt", layer_norm_eps=1e-12)
    assert config.norm_eps == 1e-5  # nn.LayerNorm's default, which BioGPT's norms keep
    assert config.embedding_layout == EmbeddingLayout(position_offset=2)
    assert (config.position_embedding, config.embedding_multiplier) == ("learned", 8.0)
    assert _parsed("biogpt", scale_embedding=False).embedding_multiplier == 1.0


def test_ctrl_reads_its_sinusoids_scale_and_biased_head():
    config = _parsed("ctrl")
    assert config.embedding_layout == EmbeddingLayout(sinusoids="vaswani")
    assert (config.position_embedding, config.embedding_multiplier) == ("sinusoidal", 8.0)
    assert (config.hidden_act, config.lm_head_bias, config.norm_eps) == ("relu", True, 1e-6)


def test_ctrl_with_another_layer_norm_epsilon_is_refused(tmp_path, capsys):
    """CTRL's layers keep 1e-6 and only its final norm reads the key: refused in one line."""
    with pytest.raises(UnsupportedModelError, match="layer_norm_epsilon is 1e-05; ctrl models"):
        _parsed("ctrl", layer_norm_epsilon=1e-5)
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "ctrl")
    edit_config(ckpt, layer_norm_epsilon=1e-5)
    assert cli_main(["package", str(ckpt), "--ep", "cpu", "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("mobius-genai: error:")]
    assert len(errors) == 1 and "layer_norm_epsilon" in errors[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_ctrl_with_an_odd_width_is_refused():
    with pytest.raises(ConfigError, match="'n_embd' must be even for ctrl, found 63"):
        _parsed("ctrl", hidden_size=63, num_attention_heads=3)


def test_an_unknown_sinusoid_layout_is_refused():
    with pytest.raises(ConfigError, match="sinusoid layout 'rotary' is unknown; accepted"):
        dataclasses.replace(_parsed("ctrl"), embedding_layout=EmbeddingLayout(sinusoids="rotary"))


def test_gpt_sw3_reads_as_gpt2():
    """GPT-SW3's model_type is transformers' GPT2Config: the same config.json, the same model."""
    raw = tiny_config("gpt2").to_dict()
    gpt2 = FAMILIES["gpt2"].parse_config(dict(raw))
    sw3 = FAMILIES["gpt-sw3"].parse_config(raw | {"model_type": "gpt-sw3"})
    assert dataclasses.replace(sw3, model_type="gpt2") == gpt2


def test_openai_gpt_reads_afn_from_its_own_table_and_a_4x_mlp():
    config = _parsed("openai-gpt")
    assert (config.hidden_act, config.intermediate_size) == ("gelu_new", 256)  # "gelu": tanh
    assert (config.norm_placement, config.embedding_layout.final_norm) == ("post_residual", False)
    assert _parsed("openai-gpt", afn="swish").hidden_act == "silu"
    with pytest.raises(ConfigError, match="'afn' must be one of .*found 'gelu_fast'"):
        _parsed("openai-gpt", afn="gelu_fast")


def test_hyperclovax_reads_its_multipliers_and_refuses_a_layer_without_post_norms():
    config = _parsed("hyperclovax", attention_multiplier=None)
    assert config.attention_scale == 16**-0.5  # HyperCLOVAXConfig's fill: 1/sqrt(head_dim)
    assert (config.norm_placement, config.logits_scaling) == ("sandwich", 0.25)  # logits * 4
    with pytest.raises(UnsupportedModelError, match="use_post_norm is false; hyperclovax"):
        _parsed("hyperclovax", use_post_norm=False)
