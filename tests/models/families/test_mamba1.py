"""Mamba and FalconMamba (Mamba1 mixers alone, no KV cache at all) and Jamba (Mamba1 mixers,
attention without rotary, MoE): a prefill and cached decode steps on the portable, cpu and
strict-ONNX graphs against transformers; variants; a graph built with a mechanism changed
fails; onnxruntime-genai's tokens for a batch of prompts of different lengths; genai_config as
og 0.18 reads a decoder without attention, and the og APIs that refuse its states; refused
configs; int4 (Jamba's experts in QMoE). (og's greedy tokens against transformers' for one
prompt: tests/models/families/test_bundles.py.)

transformers' Mamba mixers multiply a call's hidden states by the whole attention mask, which
breaks on a decode step's longer mask; its generate() feeds the mask with the prefill only, and
so does the reference here (`cached_reference`).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import onnx
import pytest
from transformers import JambaConfig

import mobius_genai
from mobius_genai import ConfigError, packager
from mobius_genai.bundle.og_support import BEAM, ENGINE, NGRAM, REWIND, bundle_og_limits
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.components.mamba1 import Mamba1Mixer
from mobius_genai.config.mamba1 import MAMBA_KEYS, mamba1_reader
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.models.families.mamba1_rows import jamba_moe
from tests._bundles import bundle_checkpoint, int4_bundle_ops
from tests._hf import (
    write_tiny_checkpoint,
)
from tests._ort import built_graph_diff, max_abs_diff, ort_session, run_like_reference
from tests._recurrent import (
    assert_batch_continues_each_prompt,
    assert_variant_matches,
    cached_reference,
    without_past,
)

TOLERANCE = 1e-4  # f32
FAMILIES_HERE = ("mamba", "falcon_mamba", "jamba")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba1")
    return {family: write_tiny_checkpoint(folder / family, family) for family in FAMILIES_HERE}


@pytest.fixture(scope="module")
def runs(checkpoints):
    """A 2 x 20-token prefill and 4 decode steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    return {family: cached_reference(ckpt, ids, 4) for family, ckpt in checkpoints.items()}


@pytest.mark.parametrize("family", FAMILIES_HERE)
@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_prefill_then_decode_matches_transformers(checkpoints, runs, family, ep, domains, tmp_path):
    built, diff = built_graph_diff(checkpoints[family], runs[family], ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def last_states(ckpt) -> tuple[list, list]:
    """The third (last) layer's scan and conv state shapes past the batch, in a cpu graph of
    three layers that has no KV cache at all."""
    package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    inputs = {value.name: value for value in package["model"].graph.inputs}
    assert not [name for name in inputs if name.endswith((".key", ".value"))]
    assert "past_key_values.3.conv_state" not in inputs
    states = (inputs[f"past_key_values.2.{name}"] for name in ("recurrent_state", "conv_state"))
    return tuple(list(state.shape)[1:] for state in states)


def test_mamba_graph_has_states_and_no_kv_cache(checkpoints):
    assert last_states(checkpoints["mamba"]) == ([128, 8, 1], [128, 3])


# case → (family, config overrides)
VARIANTS = {
    # a tied head, no conv bias, a 3-tap conv, an explicit dt rank, intermediate = hidden
    "mamba_tied_no_conv_bias": (
        "mamba",
        {
            "tie_word_embeddings": True,
            "use_conv_bias": False,
            "conv_kernel": 3,
            "time_step_rank": 6,
            "expand": 1,
        },
    ),
    # biased projections, a tied head
    "falcon_mamba_biases_tied": ("falcon_mamba", {"use_bias": True, "tie_word_embeddings": True}),
    # one expert (JambaMLP in every layer), attention first, no conv bias, dt rank 6
    "jamba_dense_attention_first": (
        "jamba",
        {
            "num_experts": 1,
            "num_experts_per_tok": 1,
            "attn_layer_offset": 0,
            "mamba_conv_bias": False,
            "mamba_dt_rank": 6,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_match_transformers(case, tmp_path):
    family, overrides = VARIANTS[case]
    assert_variant_matches(family, overrides, tmp_path)


def _row(family: str, **changes) -> object:
    row = FAMILIES[family]
    overrides = changes.pop("config_overrides", {})
    return dataclasses.replace(
        row, config_overrides={**row.config_overrides, **overrides}, **changes
    )


def _zero_d(name: str, array: np.ndarray, config) -> np.ndarray:
    """D read as zeros: the skip D * x gone."""
    return np.zeros_like(array) if name.endswith(".mamba.D") else array


def _renormalized_jamba(raw):
    return dataclasses.replace(jamba_moe(raw), normalize_top_k=True)


#: mutant → (family, the row with the mechanism changed)
ROW_MUTANTS = {
    "mamba_no_d_skip": ("mamba", lambda: _row("mamba", preprocess_weight=_zero_d)),
    "falcon_mamba_no_bc_norm": (
        "falcon_mamba",
        lambda: _row("falcon_mamba", config_overrides={"mamba1": mamba1_reader(MAMBA_KEYS)}),
    ),
    "jamba_attention_rotated": (
        "jamba",
        lambda: _row("jamba", config_overrides={"no_rope_layers": ()}),
    ),
    "jamba_top_k_renormalized": (
        "jamba",
        lambda: _row("jamba", config_overrides={"moe": _renormalized_jamba}),
    ),
}


@pytest.mark.parametrize("mutant", sorted(ROW_MUTANTS))
def test_a_row_mechanism_changed_fails_parity(checkpoints, runs, mutant, monkeypatch, tmp_path):
    family, row = ROW_MUTANTS[mutant]
    monkeypatch.setitem(FAMILIES, family, row())
    package = mobius_genai.build(checkpoints[family], "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), runs[family])
    assert not max_abs_diff(ours, runs[family].logits) <= 10 * TOLERANCE


@pytest.mark.parametrize("state", [0, 1], ids=["conv_state", "scan_state"])
def test_a_state_not_carried_fails_the_decode_steps(
    checkpoints, runs, state, monkeypatch, tmp_path
):
    monkeypatch.setattr(Mamba1Mixer, "forward", without_past(Mamba1Mixer, state))
    package = mobius_genai.build(checkpoints["mamba"], "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), runs["mamba"])
    reference = runs["mamba"].logits
    assert max_abs_diff(ours[:1], reference[:1]) <= TOLERANCE  # the prefill starts from zeros
    assert not max_abs_diff(ours[1:], reference[1:]) <= 10 * TOLERANCE


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba1_bundles")
    made = {}
    for family in ("mamba", "jamba"):
        ckpt = bundle_checkpoint(folder / family / "ckpt", family)
        made[family] = ckpt, packager.package(ckpt, "cpu", folder / family / "bundle", quiet=True)
    return made


def test_genai_config_of_a_decoder_without_attention(bundles):
    """og derives past_key_values.%d.conv_state from the KV patterns genai_config names though
    no graph input has a KV name; heads of 64 channels spanning the hidden size stand in for
    the attention sizes it requires; the bundle validates."""
    _, folder = bundles["mamba"]
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    decoder = config["decoder"]
    assert config["type"] == "decoder"
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert (decoder["num_attention_heads"], decoder["head_size"]) == (1, 64)
    assert config["context_length"] == 2048  # MambaConfig has no length; the default
    validate_bundle(folder)
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    names = {value.name for value in graph.input} | {value.name for value in graph.output}
    assert "present.2.recurrent_state" in names
    assert not any(name.endswith((".key", ".value")) for name in names)
    # og's Engine, beams, n-gram decoding and rewind refuse its states as they refuse Mamba2's
    assert set(bundle_og_limits(folder)) == {ENGINE, BEAM, NGRAM, REWIND}


@pytest.mark.parametrize("family", ["mamba", "jamba"])
def test_og_generates_a_batch_of_prompts_of_different_lengths(bundles, family):
    """og pads the shorter prompt on the right; the padding stays out of the Mamba1 states
    (and Jamba's attention masks it): each row continues as transformers continues that
    prompt alone."""
    assert_batch_continues_each_prompt(*bundles[family])


def test_jamba_int4_puts_the_experts_in_qmoe(tmp_path):
    """int4 for cpu: the experts of both MoE layers in QMoE, the other projections in
    MatMulNBits; og generates every token asked for with it."""
    ops = int4_bundle_ops("jamba", tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0


_PLACEMENT_KEYS = ("attn_layer_period", "attn_layer_offset", "expert_layer_period")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attn_layer_period": 3, "attn_layer_offset": 2, "expert_layer_period": 4},
        {"attn_layer_period": 1, "attn_layer_offset": 0, "expert_layer_offset": 0},
        {},  # JambaConfig's defaults, left out of config.json: attention 8 / 4, experts 2 / 1
    ],
)
def test_jamba_layers_are_placed_as_transformers_places_them(kwargs):
    theirs = JambaConfig(num_hidden_layers=10, **kwargs)
    raw = theirs.to_dict()
    if not kwargs:
        for key in (*_PLACEMENT_KEYS, "expert_layer_offset"):
            del raw[key]
    config = get_family("jamba").parse_config(raw)
    expected = tuple(
        "full_attention" if kind == "attention" else "mamba" for kind in theirs.layers_block_type
    )
    assert config.layer_types == expected
    sparse = tuple(i for i, n in enumerate(theirs.layers_num_experts) if n > 1)
    assert config.moe.sparse_layers == sparse
    assert config.no_rope_layers == tuple(range(10))


def test_dt_rank_auto_is_the_hidden_size_over_16_rounded_up():
    raw = {"model_type": "mamba", "hidden_size": 40, "num_hidden_layers": 2, "vocab_size": 16}
    config = get_family("mamba").parse_config(raw)
    assert config.mamba1.dt_rank == math.ceil(40 / 16) == 3
    assert config.mamba1.intermediate == 80  # expand 2 by default
    assert config.tie_word_embeddings  # MambaConfig ties by default


@pytest.mark.parametrize(("hidden", "heads"), [(4096, 64), (2560, 40), (100, 1)])
def test_wide_models_get_stand_in_heads_any_attention_could_have(hidden, heads):
    """FalconMamba-7B's 4096 channels and mamba-2.8b's 2560 as heads of 64 (one head that wide
    was refused as no attention has one); one head where 64 does not divide the width."""
    raw = {"model_type": "falcon_mamba", "hidden_size": hidden, "num_hidden_layers": 2}
    config = get_family("falcon_mamba").parse_config({**raw, "vocab_size": 16})
    assert (config.num_attention_heads, config.head_dim) == (heads, hidden // heads)


@pytest.mark.parametrize(
    ("family", "changes", "named"),
    [
        ("mamba", {"hidden_act": "gelu"}, "hidden_act"),
        ("mamba", {"conv_kernel": 1}, "conv_kernel"),
        ("jamba", {"attn_layer_offset": 2, "attn_layer_period": 2}, "attn_layer_offset"),
        ("jamba", {"expert_layer_offset": 3, "expert_layer_period": 2}, "expert_layer_offset"),
    ],
)
def test_refused_configs_name_the_field(checkpoints, family, changes, named):
    raw = {**json.loads((checkpoints[family] / "config.json").read_text()), **changes}
    with pytest.raises(ConfigError, match=named):
        get_family(family).parse_config(raw)
