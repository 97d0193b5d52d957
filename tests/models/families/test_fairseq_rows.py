"""opt and xglm beyond the parity table (test_parity.py's CASES and MUTANTS): a left-padded
batch against transformers (positions from the mask, read from table row 2 on), onnxruntime-
genai's tokens from opt-350m's layout (norms of the residual sums, a projected token table)
and from xglm's sinusoids, alone and in a batch of prompts of different lengths, and the
config switches these rows read or refuse."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import ConfigError, UnsupportedModelError, packager
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.models import FAMILIES
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import (
    NEW_TOKENS,
    PROMPT,
    bundle_checkpoint,
    check_bundle_generates_like_transformers,
)
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._ort import graph_diffs, left_padded_diffs

TOLERANCE = 1e-4  # f32, max abs diff of logits
#: opt-350m's layout over the tiny opt row: post-LN layers, no final norm, a 32-wide table.
OPT_350M = {"do_layer_norm_before": False, "word_embed_proj_dim": 32}
LAYOUTS = {"opt": ("opt", {}), "opt_350m": ("opt", OPT_350M), "xglm": ("xglm", {})}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_left_padded_batch_matches_transformers(layout, tmp_path):
    family, overrides = LAYOUTS[layout]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=2, **overrides)
    first, rest = left_padded_diffs(ckpt, tmp_path / "onnx")
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


@pytest.mark.parametrize("layout", ["opt_350m", "xglm"])
def test_bundle_generates_like_transformers(layout, tmp_path, capsys):
    family, overrides = LAYOUTS[layout]
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family, **overrides)
    check_bundle_generates_like_transformers(ckpt, tmp_path, capsys)


def test_opt_350m_int4_bundle_quantizes_project_out_before_the_tied_head(tmp_path):
    """Two quantized MatMuls in a row (project_out, then the tied head): quantizing the second
    must not trip over the first one's replaced node."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "opt", **OPT_350M)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    quantized = [node.input[1] for node in graph.node if node.op_type == "MatMulNBits"]
    assert any("project_out" in name for name in quantized), quantized
    tokens = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS


@pytest.mark.parametrize("ep", ["cuda", "dml", "webgpu"])
@pytest.mark.parametrize("layout", ["opt_350m", "xglm"])
def test_gpu_ep_graphs_attend_with_group_query_attention(layout, ep, tmp_path):
    """The positions added before the first layer leave every layer to the GQA fusion, with
    the LayerNorms of the residual sums fused as SkipLayerNormalization (float16)."""
    family, overrides = LAYOUTS[layout]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, **overrides)
    graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 3 and "Attention" not in ops
    norms = 6 if layout == "opt_350m" else 7  # xglm's final norm fuses too
    assert ops.count("SkipLayerNormalization") == norms


def test_checkpoints_saved_from_the_base_model_or_with_fairseq_buffers(tmp_path):
    """OPTModel's tensors lack "model." ("decoder.layers..."), with no lm_head (tied);
    XGLM checkpoints converted from fairseq keep a position buffer transformers recomputes."""
    ids = np.random.default_rng(3).integers(3, 128, size=(1, 12))
    for family, edit in (
        (
            "opt",
            lambda t: {k.removeprefix("model."): v for k, v in t.items() if k != "lm_head.weight"},
        ),
        ("xglm", lambda t: t | {"model.embed_positions._float_tensor": np.zeros(1, np.float32)}),
    ):
        ckpt = write_tiny_checkpoint(tmp_path / family, family, seed=4)
        reference = hf_reference_logits(ckpt, ids, decode_steps=2)
        path = ckpt / "model.safetensors"
        save_file(edit(load_file(path)), path, metadata={"format": "pt"})
        diffs = graph_diffs(ckpt, reference, ("default",), tmp_path / f"{family}_onnx")
        assert diffs["default"] <= TOLERANCE, (family, diffs)


def _parsed(family: str, **overrides) -> ArchitectureConfig:
    raw = tiny_config(family, **overrides).to_dict()
    return FAMILIES[family].parse_config(json.loads(json.dumps(raw)))


def test_opt_switches_read_as_opt_config_reads_them():
    pre_ln = _parsed("opt")
    assert (pre_ln.norm_placement, pre_ln.embedding_layout) == (
        "pre",
        EmbeddingLayout(position_offset=2),
    )
    assert pre_ln.embedding_width == pre_ln.hidden_size == 64
    post_ln = _parsed("opt", **OPT_350M)
    assert post_ln.norm_placement == "post_residual"
    assert post_ln.embedding_layout == EmbeddingLayout(2, width=32, final_norm=False)
    assert post_ln.embedding_width == 32
    removed = _parsed("opt", _remove_final_layer_norm=True, enable_bias=False)
    assert not removed.embedding_layout.final_norm
    assert not (removed.qkv_bias or removed.o_bias or removed.mlp_bias)
    weightless = _parsed("opt", layer_norm_elementwise_affine=False)
    assert weightless.norm_type == "layer_no_affine"


def test_xglm_scales_embeddings_by_sqrt_width_unless_switched_off():
    assert _parsed("xglm").embedding_multiplier == 8.0
    assert _parsed("xglm", scale_embedding=False).embedding_multiplier == 1.0
    assert _parsed("xglm").position_embedding == "sinusoidal"


def test_xglm_with_cross_attention_is_refused():
    raw = tiny_config("xglm").to_dict() | {"add_cross_attention": True}
    with pytest.raises(UnsupportedModelError, match="add_cross_attention"):
        FAMILIES["xglm"].parse_config(raw)


def test_a_position_offset_needs_absolute_positions():
    with pytest.raises(ConfigError, match="position offset needs absolute positions"):
        dataclasses.replace(_parsed("opt"), position_embedding="rope")
