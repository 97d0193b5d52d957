"""Nemotron-H (one block per layer: Mamba2, attention without rotary, or a relu2 MLP) and
Falcon-H1 (attention and Mamba2 side by side in every layer, µP multipliers): a prefill of
several of transformers' scan chunks then decode steps on the portable, cpu and strict-ONNX
graphs; variants (the hub's layer pattern, biases, the Falcon-H1 gated norm's placements); a
graph built with a mechanism changed or a multiplier dropped fails; a left-padded batch; the
caches and genai_config as onnxruntime-genai 0.18 reads them, its builder refusing both;
refused configs; int4. (onnxruntime-genai's greedy tokens against transformers', alone and in a batch of prompts of
different lengths: tests/models/families/test_bundles.py.)"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import ConfigError, WeightsError, packager
from mobius_genai.bundle.graph import TensorSpec
from mobius_genai.bundle.og_support import BEAM, ENGINE, NGRAM, REWIND, bundle_og_limits
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.rope import parse_rope
from mobius_genai.config.weight_scales import WeightScale
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._mutants import with_overrides
from tests._ort import (
    built_graph_diff,
    left_padded_diffs,
    long_prefill_reference,
    max_abs_diff,
    ort_session,
    parity_diffs,
    run_like_reference,
)
from tests.runtime.conftest import run_builder

TOLERANCE = 1e-4  # f32
FAMILIES_HERE = ("nemotron_h", "falcon_h1", "bamba")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba2_hybrids")
    return {family: write_tiny_checkpoint(folder / family, family) for family in FAMILIES_HERE}


@pytest.fixture(scope="module")
def long_runs(checkpoints):
    """transformers' chunked scan over 70 tokens, then 4 single-token decode steps."""
    return {family: long_prefill_reference(ckpt) for family, ckpt in checkpoints.items()}


@pytest.fixture(scope="module")
def short_runs(checkpoints):
    """A 12-token prefill and 2 decode steps: enough for the mutants to show."""
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 12))
    return {family: hf_reference_logits(ckpt, ids, 2) for family, ckpt in checkpoints.items()}


@pytest.mark.parametrize("family", FAMILIES_HERE)
@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_long_prefill_then_decode_matches_transformers(
    checkpoints, long_runs, family, ep, domains, tmp_path
):
    built, diff = built_graph_diff(checkpoints[family], long_runs[family], ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


# case → (family, config overrides)
VARIANTS = {
    # Mamba2 and MLP projections with biases, one group, attention first; tie_word_embeddings,
    # which transformers ignores (NemotronHForCausalLM ties no head)
    "nemotron_h_biases_one_group_tied": (
        "nemotron_h",
        {
            "use_bias": True,
            "mlp_bias": True,
            "n_groups": 1,
            "tie_word_embeddings": True,
            "layers_block_type": ["full_attention", "linear_attention", "mlp", "linear_attention"],
        },
    ),
    # no gated norm (Falcon-H1's default: y * silu(gate)), no biases, a tied head
    "falcon_h1_gate_only_tied": (
        "falcon_h1",
        {
            "mamba_rms_norm": False,
            "mamba_proj_bias": False,
            "projectors_bias": False,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": True,
        },
    ),
    # the gated norm normalizing y * silu(gate), as Granite's; mamba_d_ssm unset: 2 x hidden
    "falcon_h1_norm_after_gate_expand": (
        "falcon_h1",
        {"mamba_norm_before_gate": False, "mamba_d_ssm": None, "mamba_n_heads": 8},
    ),
}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_match_transformers(case, tmp_path):
    family, overrides = VARIANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    diffs = parity_diffs(tmp_path, ckpt, ids, decode_steps=3)  # the default and cpu graphs
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_config_layout_matches_transformers(tmp_path):
    """Hub configs spell the layers as hybrid_override_pattern with num_hidden_layers, carry
    attention_head_dim and rms_norm_eps beside the head_dim and layer_norm_epsilon
    transformers reads, and leave time_step_limit out; transformers 5 writes
    layers_block_type alone."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "nemotron_h", seed=2, layer_norm_epsilon=1e-3)
    raw = json.loads((ckpt / "config.json").read_text())
    assert "num_hidden_layers" not in raw and "hybrid_override_pattern" not in raw
    for key in ("layers_block_type", "time_step_limit"):
        del raw[key]
    raw |= {
        "hybrid_override_pattern": "M-*-M",
        "num_hidden_layers": 5,
        "attention_head_dim": 16,
        "rms_norm_eps": 1e-6,
    }
    (ckpt / "config.json").write_text(json.dumps(raw))
    config = get_family("nemotron_h").parse_config(raw)
    assert config.layer_types == ("mamba2", "mlp", "full_attention", "mlp", "mamba2")
    assert config.norm_eps == 1e-3
    ids = np.random.default_rng(3).integers(3, 128, size=(1, 20))
    reference = hf_reference_logits(ckpt, ids, decode_steps=2)
    ours = run_like_reference(
        ort_session(mobius_genai.build(ckpt, "cpu", "f32"), tmp_path / "onnx"), reference
    )
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_bamba_rotates_half_of_each_head_whatever_config_json_says(checkpoints, tmp_path):
    """A config.json (as transformers 4 wrote Bamba's) without partial_rotary_factor: BambaConfig
    rotates half of each head all the same, and so does the bundle."""
    ckpt = checkpoints["bamba"]
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 12))
    before = hf_reference_logits(ckpt, ids, 2)
    raw = json.loads((ckpt / "config.json").read_text())
    raw["rope_parameters"].pop("partial_rotary_factor")
    (tmp_path / "ckpt").mkdir()
    for path in ckpt.iterdir():
        (tmp_path / "ckpt" / path.name).write_bytes(path.read_bytes())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(raw))
    reference = hf_reference_logits(tmp_path / "ckpt", ids, 2)
    assert max_abs_diff(reference.logits, before.logits) == 0.0
    package = mobius_genai.build(tmp_path / "ckpt", "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_left_padded_batch_matches_transformers(checkpoints, tmp_path):
    """Padding stays out of Falcon-H1's Mamba2 states while its attention masks it."""
    first, rest = left_padded_diffs(checkpoints["falcon_h1"], tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def _mamba2_norm(family: str, norm: str):
    """The row's Mamba2 settings with the gated norm placed as `norm`."""
    read = FAMILIES[family].config_overrides["mamba2"]
    return lambda raw: dataclasses.replace(read(raw), norm=norm)


#: mutant → (family, the row's overrides changed)
MUTANTS = {
    "nemotron_h_attention_rotated": ("nemotron_h", {"no_rope_layers": ()}),
    "nemotron_h_relu_mlp": ("nemotron_h", {"hidden_act": "relu"}),
    "nemotron_h_norm_before_gate": (
        "nemotron_h",
        {"mamba2": _mamba2_norm("nemotron_h", "norm_then_gate")},
    ),
    "falcon_h1_norm_after_gate": (
        "falcon_h1",
        {"mamba2": _mamba2_norm("falcon_h1", "gate_then_norm")},
    ),
    # BambaConfig's fixed half rotary turned into whole heads
    "bamba_whole_heads_rotated": (
        "bamba",
        {"rope": lambda raw: dataclasses.replace(parse_rope(raw)[0], partial_rotary_factor=1.0)},
    ),
    "bamba_norm_before_gate": ("bamba", {"mamba2": _mamba2_norm("bamba", "norm_then_gate")}),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mechanism_changed_fails_parity(checkpoints, short_runs, mutant, monkeypatch, tmp_path):
    family, overrides = MUTANTS[mutant]
    monkeypatch.setitem(FAMILIES, family, with_overrides(family, **overrides))
    package = mobius_genai.build(checkpoints[family], "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), short_runs[family])
    assert not max_abs_diff(ours, short_runs[family].logits) <= 10 * TOLERANCE


FALCON_MULTIPLIERS = (
    "embedding_multiplier",
    "lm_head_multiplier",
    "key_multiplier",
    "attention_in_multiplier",
    "attention_out_multiplier",
    "ssm_in_multiplier",
    "ssm_out_multiplier",
    "mlp_multipliers",
    "ssm_multipliers",
)


@pytest.mark.parametrize("key", FALCON_MULTIPLIERS)
def test_a_falcon_h1_multiplier_dropped_fails_parity(
    checkpoints, short_runs, key, monkeypatch, tmp_path
):
    """Each multiplier read as absent (1.0, or all ones) by every override: the graph or the
    weights it folds into lose it, and the logits move."""
    row = FAMILIES["falcon_h1"]

    def without(read):
        return lambda raw: read({k: v for k, v in raw.items() if k != key})

    overrides = {
        name: without(read) if callable(read) else read
        for name, read in row.config_overrides.items()
    }
    monkeypatch.setitem(FAMILIES, "falcon_h1", with_overrides("falcon_h1", **overrides))
    package = mobius_genai.build(checkpoints["falcon_h1"], "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), short_runs["falcon_h1"])
    assert not max_abs_diff(ours, short_runs["falcon_h1"].logits) <= 10 * TOLERANCE


def test_a_layer_pattern_read_one_layer_off_is_refused_by_the_weights(checkpoints, monkeypatch):
    """The pattern decides which tensors each layer reads: shifted by one, the attention
    layer's q_proj is looked for where the checkpoint has an MLP."""
    read = FAMILIES["nemotron_h"].config_overrides["layer_types"]
    shifted = with_overrides("nemotron_h", layer_types=lambda raw: (*read(raw)[1:], read(raw)[0]))
    monkeypatch.setitem(FAMILIES, "nemotron_h", shifted)
    with pytest.raises(WeightsError) as error:
        mobius_genai.build(checkpoints["nemotron_h"], "default", "f32")
    assert "backbone.layers.1.mixer.q_proj.weight" in str(error.value)


@pytest.mark.parametrize(
    ("family", "changes", "error", "field"),
    [
        ("nemotron_h", {"layers_block_type": None, "hybrid_override_pattern": "M-X*"},
         ConfigError, "hybrid_override_pattern"),
        ("nemotron_h", {"layers_block_type": ["mamba2"]}, ConfigError, "layers_block_type"),
        ("nemotron_h", {"mamba_hidden_act": "gelu"}, ConfigError, "mamba_hidden_act"),
        ("falcon_h1", {"ssm_multipliers": [1.0, 1.0]}, ConfigError, "ssm_multipliers"),
        ("falcon_h1", {"mamba_d_ssm": 40}, ConfigError, "mamba_d_ssm"),
        ("falcon_h1", {"key_multiplier": -1.0}, ConfigError, "key_multiplier"),
    ],
)  # fmt: skip
def test_a_config_the_rows_cannot_build_is_refused_in_one_line(
    checkpoints, family, changes, error, field
):
    raw = {**json.loads((checkpoints[family] / "config.json").read_text()), **changes}
    with pytest.raises(error, match=field) as raised:
        get_family(family).parse_config(raw)
    assert "\n" not in str(raised.value)


@pytest.fixture(scope="module")
def cpu_bundles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba2_bundles")
    return {
        family: packager.package(
            bundle_checkpoint(folder / f"{family}_ckpt", family), "cpu", folder / family, quiet=True
        )
        for family in FAMILIES_HERE
    }


@pytest.mark.parametrize("family", FAMILIES_HERE)
def test_og_runs_what_its_builder_refuses_and_refuses_what_it_refuses_granite(
    cpu_bundles, family, tmp_path_factory
):
    """onnxruntime-genai 0.18's builder knows neither model type; og.Generator runs our
    bundles (model.type decoder) with transformers' tokens (test_bundles.py), and og refuses
    them what it refuses Granite-4.0-H's and the gated delta nets' bundles, for the same cause
    (recurrent states its Engine, beam search, n-gram decoding and rewind cannot carry)."""
    checkpoint = cpu_bundles[family].parent / f"{family}_ckpt"
    _, done = run_builder(tmp_path_factory, checkpoint, family)
    assert done.returncode != 0
    assert "model is not currently supported" in done.stderr
    assert set(bundle_og_limits(cpu_bundles[family])) == {ENGINE, BEAM, NGRAM, REWIND}


def _cache_inputs(graph) -> dict[str, TensorSpec]:
    return {name: spec for name, spec in graph.inputs.items() if name.startswith("past_")}


def test_nemotron_h_caches_as_onnxruntime_genai_reads_them(cpu_bundles):
    """Its attention layer alone has a KV cache, its Mamba2 layers the two states named from
    the KV patterns, its MLP layers nothing: og's generic decoder finds each by name."""
    config = json.loads((cpu_bundles["nemotron_h"] / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder" and "layer_types" not in decoder
    assert decoder["num_hidden_layers"] == 5
    inputs = _cache_inputs(validate_bundle(cpu_bundles["nemotron_h"]).graph)
    states = ("conv_state", "recurrent_state")
    assert set(inputs) == {
        "past_key_values.2.key",
        "past_key_values.2.value",
        *(f"past_key_values.{i}.{state}" for i in (0, 4) for state in states),
    }
    f32 = onnx.TensorProto.FLOAT
    # [batch, x|B|C channels (32 + 2 * 2 * 8), taps - 1]; [batch, heads, state, head_dim]
    assert inputs["past_key_values.0.conv_state"] == TensorSpec(f32, ("batch_size", 64, 3))
    assert inputs["past_key_values.4.recurrent_state"] == TensorSpec(f32, ("batch_size", 4, 8, 8))


def test_falcon_h1_layers_carry_a_kv_cache_and_mamba2_states(cpu_bundles):
    config = json.loads((cpu_bundles["falcon_h1"] / "genai_config.json").read_text())
    assert config["model"]["type"] == "decoder"
    inputs = _cache_inputs(validate_bundle(cpu_bundles["falcon_h1"]).graph)
    kinds = ("key", "value", "conv_state", "recurrent_state")
    assert set(inputs) == {f"past_key_values.{i}.{kind}" for i in range(3) for kind in kinds}
    assert inputs["past_key_values.1.recurrent_state"].shape == ("batch_size", 4, 8, 12)


@pytest.mark.parametrize("family", FAMILIES_HERE)
def test_int4_bundle_generates(family, tmp_path):
    """The Mamba2, attention and MLP projections become MatMulNBits (Falcon-H1's with its
    multipliers folded in); both states stay float32. (Blocks of 16: the tiny Falcon-H1's
    Mamba2 width is 48.)"""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    int4 = Int4Options(block_size=16)
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=int4, quiet=True
    )
    model = ir.load(folder / "model.onnx")
    quantized = {
        node.inputs[1].name.rsplit(".weight", 1)[0]
        for node in model.graph.all_nodes()
        if node.op_type == "MatMulNBits"
    }
    mamba = {"nemotron_h": [0, 4], "falcon_h1": [0, 1, 2], "bamba": [0, 2]}[family]
    assert {f"model.layers.{i}.mamba.{p}_proj" for i in mamba for p in ("in", "out")} <= quantized
    states = [value for value in model.graph.inputs if value.name.endswith("_state")]
    assert len(states) == 2 * len(mamba)
    assert {value.dtype for value in states} == {ir.DataType.FLOAT}
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


def test_weight_scale_runs_scale_their_rows_and_must_cover_them():
    scale = WeightScale("w", ((2, 2.0), (1, -1.0), (None, 0.5)))
    array = np.ones((5, 3), np.float32)
    np.testing.assert_array_equal(scale.apply(array)[:, 0], [2.0, 2.0, -1.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="cover 3 of 5"):
        WeightScale("w", ((2, 2.0), (1, 1.0))).apply(array)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layer_types": ("mlp", "full_attention")}, "'mlp' layers"),
        ({"parallel_recurrent": "mamba2"}, "beside attention needs its settings"),
        ({"parallel_recurrent": "ssm"}, "beside attention needs its settings"),
    ],
)
def test_block_layouts_a_family_does_not_read_are_refused(overrides, message):
    """An MLP-only layer needs one block per layer; a block beside attention its settings."""
    raw = tiny_config("llama", num_hidden_layers=2).to_dict()
    with pytest.raises(ConfigError, match=message):
        ArchitectureConfig.from_dict(raw, **overrides)
