"""Mamba2 (Codestral Mamba: Mamba2 mixers alone, no KV cache at all): a prefill and cached
decode steps on the portable, cpu and strict-ONNX graphs against transformers; variants; a
graph built with a mechanism changed fails; onnxruntime-genai's tokens for a batch of prompts
of different lengths; genai_config; an int4 bundle; Mamba2Config's defaults; refused configs.
(og's greedy tokens against transformers' for one prompt: tests/models/families/test_bundles.py;
the float32 residual stream of 16-bit bundles: test_mamba1_float16.py.)

The tiny checkpoint's prefills (20 and 12 tokens) cross transformers' chunks of 8 tokens.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from transformers import Mamba2Config as HfMamba2Config

import mobius_genai
from mobius_genai import ConfigError, packager
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.components import mamba2
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.models.families.mamba2_rows import mamba2_sizes
from tests._bundles import bundle_checkpoint, int4_bundle_ops
from tests._hf import write_tiny_checkpoint
from tests._ort import built_graph_diff, max_abs_diff, ort_session, run_like_reference
from tests._recurrent import (
    assert_batch_continues_each_prompt,
    assert_variant_matches,
    cached_reference,
)
from tests.models.families.test_mamba1 import last_states

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mamba2") / "ckpt", "mamba2")


@pytest.fixture(scope="module")
def run(checkpoint):
    """A 2 x 20-token prefill and 4 decode steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    return cached_reference(checkpoint, ids, 4)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_prefill_then_decode_matches_transformers(checkpoint, run, ep, domains, tmp_path):
    built, diff = built_graph_diff(checkpoint, run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def test_graph_has_mamba2_states_and_no_kv_cache(checkpoint):
    # [batch, heads, state_size, head_dim]; [batch, x | B | C (128 + 2 x 2 x 8), taps - 1]
    assert last_states(checkpoint) == ([8, 8, 16], [160, 3])


# case → config overrides
VARIANTS = {
    # one group for all heads, no biases, a tied head, a 3-tap conv
    "one_group_tied_no_biases": {
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": False,
        "tie_word_embeddings": True,
        "conv_kernel": 3,
    },
    # a group per head, heads of 32 channels, expand 1 (Codestral's 8 groups of 16 heads,
    # scaled down the other way)
    "group_per_head": {"num_heads": 2, "head_dim": 32, "n_groups": 2, "expand": 1},
}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_match_transformers(case, tmp_path):
    assert_variant_matches("mamba2", VARIANTS[case], tmp_path)


def _norm_then_gate(raw):
    return dataclasses.replace(mamba2_sizes(raw), norm="norm_then_gate")


def _groups_reversed(scan):
    """gated_scan with the groups of B and C reversed: each head reads another head group's
    B and C (the groups broadcast onto the wrong heads)."""

    def mutant(op, c, b, value, past, decay, *heads):
        def reverse(x):
            groups = op.Reshape(x, op.Constant(value_ints=[0, 0, heads[0], -1]))
            flipped = op.Slice(
                groups,
                op.Constant(value_ints=[-1]),
                op.Constant(value_ints=[-(2**31)]),
                op.Constant(value_ints=[2]),
                op.Constant(value_ints=[-1]),
            )
            return op.Reshape(flipped, op.Constant(value_ints=[0, 0, -1]))

        return scan(op, reverse(c), reverse(b), value, past, decay, *heads)

    return mutant


def _norm_over_all_channels(config):
    return mamba2.GatedGroupRMSNorm(config.mamba2.intermediate, 1, config.norm_eps)


@pytest.mark.parametrize("mutant", ["norm_then_gate", "groups_reversed", "norm_over_all"])
def test_a_mechanism_changed_fails_parity(checkpoint, run, mutant, monkeypatch, tmp_path):
    """The gated norm's order flipped (norm, then gate), the B/C groups broadcast onto the
    wrong heads, the gated norm over all channels rather than per group."""
    if mutant == "norm_then_gate":
        row = FAMILIES["mamba2"]
        overrides = {**row.config_overrides, "mamba2": _norm_then_gate}
        monkeypatch.setitem(
            FAMILIES, "mamba2", dataclasses.replace(row, config_overrides=overrides)
        )
    elif mutant == "groups_reversed":
        monkeypatch.setattr(mamba2, "gated_scan", _groups_reversed(mamba2.gated_scan))
    else:
        monkeypatch.setattr(mamba2, "_gated_norm", _norm_over_all_channels)
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert not max_abs_diff(ours, run.logits) <= 10 * TOLERANCE


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba2_bundle")
    ckpt = bundle_checkpoint(folder / "ckpt", "mamba2")
    return ckpt, packager.package(ckpt, "cpu", folder / "bundle", quiet=True)


def test_genai_config_of_mamba2(bundle):
    """model.type decoder with no attention: one head as wide as the hidden size stands in
    (config.json's head_dim is the mixer's), Mamba's length default; the bundle validates."""
    _, folder = bundle
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    decoder = config["decoder"]
    assert config["type"] == "decoder"
    assert (decoder["num_attention_heads"], decoder["head_size"]) == (1, decoder["hidden_size"])
    assert config["context_length"] == 2048
    validate_bundle(folder)


def test_og_generates_a_batch_of_prompts_of_different_lengths(bundle):
    """og pads the shorter prompt; each row continues as transformers continues that prompt
    alone."""
    assert_batch_continues_each_prompt(*bundle)


def test_int4_bundle_quantizes_the_projections_and_generates(tmp_path):
    """int4 for cpu: each layer's in_proj and out_proj and the LM head in MatMulNBits, the
    scan kept; og generates every token asked for with it."""
    ops = int4_bundle_ops("mamba2", tmp_path)
    assert (ops["MatMulNBits"], ops["LinearAttention"]) == (2 * 3 + 1, 3)


def test_absent_keys_are_mamba2_configs_defaults():
    """Only the sizes a config cannot do without: the rest as Mamba2Config fills them in."""
    raw = {"model_type": "mamba2", "hidden_size": 4096, "num_hidden_layers": 2, "vocab_size": 16}
    config = get_family("mamba2").parse_config(raw)
    theirs = HfMamba2Config(hidden_size=4096, num_hidden_layers=2, vocab_size=16)
    sizes = config.mamba2
    assert (sizes.heads, sizes.head_dim, sizes.state_size, sizes.groups) == (
        theirs.num_heads,
        theirs.head_dim,
        theirs.state_size,
        theirs.n_groups,
    )
    assert sizes.conv_kernel_size == theirs.conv_kernel
    assert (sizes.conv_bias, sizes.proj_bias) == (theirs.use_conv_bias, theirs.use_bias)
    assert sizes.norm == "gate_then_norm"
    assert config.norm_eps == theirs.layer_norm_epsilon
    assert config.tie_word_embeddings == theirs.tie_word_embeddings
    assert config.residual_in_float32 == theirs.residual_in_fp32
    assert config.layer_types == ("mamba2", "mamba2")


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"rms_norm": False}, "rms_norm"),
        ({"head_dim": 8}, "head_dim"),  # 8 heads x 8 is not expand 2 x hidden 64
        ({"num_heads": 6, "head_dim": 64, "expand": 6, "n_groups": 4}, "n_groups"),  # 6 over 4
        ({"time_step_limit": [0.001, 0.1]}, "time_step_limit"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"conv_kernel": 1}, "conv_kernel"),
    ],
)
def test_refused_configs_name_the_field(checkpoint, changes, named):
    raw = {**json.loads((checkpoint / "config.json").read_text()), **changes}
    with pytest.raises(ConfigError, match=named):
        get_family("mamba2").parse_config(raw)
