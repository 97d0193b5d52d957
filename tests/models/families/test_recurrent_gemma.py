"""RecurrentGemma (RG-LRU blocks and local attention, config/rglru.py, components/rglru.py,
models/families/recurrent_gemma.py): a prefill past the attention window and cached decode
steps on the portable, cpu and strict-ONNX graphs against transformers; a variant; a
left-padded batch against each prompt alone; a graph built with a mechanism changed fails;
onnxruntime-genai's tokens for a batch of prompts of different lengths; int4 on cpu; the GPU
EPs' graphs; layer placement and refused configs. (og's greedy tokens against transformers'
for one prompt: tests/models/families/test_bundles.py.)

transformers' RG-LRU blocks read no attention mask: a left-padded row's padding runs through
their conv (the recurrence is reset at position 0, the conv is not), so a padded row is
compared with transformers' run of that prompt alone, the contract og's batches need.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from transformers import RecurrentGemmaConfig

import mobius_genai
from mobius_genai import ConfigError, UnsupportedModelError, packager
from mobius_genai.bundle.og_support import BEAM, ENGINE, NGRAM, REWIND, bundle_og_limits
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.components import rglru
from mobius_genai.components.rglru import RgLru, RgLruBlock
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.models.families.preprocess import offset_norm_weights
from mobius_genai.models.families.scales import sqrt_hidden
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import (
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import built_graph_diff, max_abs_diff, ort_session, run_like_reference
from tests._recurrent import (
    alone_then_padded,
    assert_batch_continues_each_prompt,
    assert_variant_matches,
    cached_reference,
    without_past,
)

TOLERANCE = 1e-4  # f32
FAMILY = "recurrent_gemma"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("rgemma") / "ckpt", FAMILY)


@pytest.fixture(scope="module")
def run(checkpoint):
    """A 2 x 20-token prefill (past the window of 6) and 4 decode steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    return cached_reference(checkpoint, ids, 4)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # the conv and the scan as fused ops with bodies
        ("cpu", {"", "com.microsoft"}),
        # the bodies inlined: a Scan carries the state (Mamba1's default run checks them)
        pytest.param("onnx-standard", {""}, marks=pytest.mark.slow),
    ],
)
def test_prefill_then_decode_matches_transformers(checkpoint, run, ep, domains, tmp_path):
    built, diff = built_graph_diff(checkpoint, run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def test_graph_declares_the_rglru_states_and_keeps_a_cache_for_attention(checkpoint):
    """Layers 0, 1 and 3 carry a conv state [48, 3] and a float32 recurrence [48, 1, 1];
    layer 2 attends over one key/value head of 24 channels."""
    package = mobius_genai.build(checkpoint, "cpu", "f32", load_weights=False)
    inputs = {value.name: value for value in package["model"].graph.inputs}
    for layer in (0, 1, 3):
        conv = inputs[f"past_key_values.{layer}.conv_state"]
        state = inputs[f"past_key_values.{layer}.recurrent_state"]
        assert list(conv.shape)[1:] == [48, 3]
        assert list(state.shape)[1:] == [48, 1, 1]
        assert f"past_key_values.{layer}.key" not in inputs
    assert list(inputs["past_key_values.2.key"].shape)[1::2] == [1, 24]
    assert "past_key_values.2.conv_state" not in inputs


@pytest.mark.slow
def test_variant_matches_transformers(tmp_path):
    """Attention first, a tied head, biased q/k/v, a 3-tap conv, the RG-LRU as wide as the
    hidden size (gates in 2 blocks of 32), two key/value heads, the softcap at 5."""
    overrides = {
        "block_types": ["attention", "recurrent"],
        "tie_word_embeddings": True,
        "attention_bias": True,
        "conv1d_width": 3,
        "hidden_size": 64,
        "lru_width": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "logits_soft_cap": 5.0,
    }
    assert_variant_matches(FAMILY, overrides, tmp_path)


def test_a_left_padded_batch_continues_each_prompt_alone(checkpoint, tmp_path):
    """Row 0 padded by 5 on the portable graph (GroupQueryAttention takes no left padding; og
    pads on the right: the og test below): the padding feeds neither the conv, the recurrence
    nor attention, and the first real token is the recurrence's position 0."""
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 128, size=7), rng.integers(3, 128, size=12)]
    reference = alone_then_padded(checkpoint, prompts, 3)
    package = mobius_genai.build(checkpoint, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    ours[0][0, :5] = 0.0  # padded positions
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def _row(**changes) -> object:
    row = FAMILIES[FAMILY]
    overrides = changes.pop("config_overrides", {})
    return dataclasses.replace(
        row, config_overrides={**row.config_overrides, **overrides}, **changes
    )


def _identity_conv(name: str, array: np.ndarray, config) -> np.ndarray:
    """The conv read as the identity (its last tap 1, the others and the bias 0)."""
    if name.endswith("conv_1d.weight"):
        identity = np.zeros_like(array)
        identity[..., -1] = 1.0
        return identity
    if name.endswith("conv_1d.bias"):
        return np.zeros_like(array)
    return offset_norm_weights(name, array, config)


#: mutant → the row with a mechanism changed (the softcap and the residual are generic: slow)
ROW_MUTANTS = {
    "conv_skipped": lambda: _row(preprocess_weight=_identity_conv, preprocessed_weights=None),
    "embeddings_scaled_unrounded": lambda: _row(
        config_overrides={"embedding_multiplier": sqrt_hidden}
    ),
    "residual_from_the_normed_input": lambda: _row(config_overrides={"residual_after_norm": True}),
    "no_softcap": lambda: _row(config_overrides={"final_logit_softcapping": None}),
}
_GENERIC_MUTANTS = ("no_softcap", "residual_from_the_normed_input")


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(m, marks=[pytest.mark.slow] if m in _GENERIC_MUTANTS else [])
        for m in sorted(ROW_MUTANTS)
    ],
)
def test_a_row_mechanism_changed_fails_parity(checkpoint, run, mutant, monkeypatch, tmp_path):
    monkeypatch.setitem(FAMILIES, FAMILY, ROW_MUTANTS[mutant]())
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert not max_abs_diff(ours, run.logits) <= 10 * TOLERANCE


def _without_input_gate(gate):
    def mutant(self, op, x, weight, bias):
        if weight is self.input_gate_weight:
            return op.Expand(op.Constant(value_float=1.0), op.Shape(x))  # the input gate dropped
        return gate(self, op, x, weight, bias)

    return mutant


def _softplus_as_identity(op, param):
    return rglru.in_float32(op, param)


def _never_first(op, hidden_states, attention_mask):
    first = rglru.current_mask(op, hidden_states, attention_mask)
    return op.Unsqueeze(op.Equal(first, op.Constant(value_int=-1)), op.Constant(value_ints=[2]))


#: mutant → (object, attribute, replacement) in components/rglru.py
COMPONENT_MUTANTS = {
    "input_gate_dropped": (RgLru, "_gate", _without_input_gate(RgLru._gate)),
    "decay_scale_4_not_8": (rglru, "RECURRENCE_SCALE", 4.0),
    "softplus_skipped": (rglru, "decay_rate", _softplus_as_identity),
    "no_reset_at_position_0": (rglru, "_first_real_tokens", _never_first),
}


@pytest.mark.parametrize("mutant", sorted(COMPONENT_MUTANTS))
def test_a_component_mechanism_changed_fails_parity(checkpoint, run, mutant, monkeypatch, tmp_path):
    monkeypatch.setattr(*COMPONENT_MUTANTS[mutant])
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert not max_abs_diff(ours, run.logits) <= 10 * TOLERANCE


@pytest.mark.parametrize("state", [0, 1], ids=["conv_state", "recurrent_state"])
def test_a_state_not_carried_fails_the_decode_steps(checkpoint, run, state, monkeypatch, tmp_path):
    monkeypatch.setattr(RgLruBlock, "forward", without_past(RgLruBlock, state))
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert max_abs_diff(ours[:1], run.logits[:1]) <= TOLERANCE  # the prefill starts from zeros
    assert not max_abs_diff(ours[1:], run.logits[1:]) <= 10 * TOLERANCE


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rgemma_bundle")
    ckpt = bundle_checkpoint(folder / "ckpt", FAMILY)
    return ckpt, packager.package(ckpt, "cpu", folder / "bundle", quiet=True)


def test_og_generates_a_batch_of_prompts_of_different_lengths(bundle):
    """og pads the shorter prompt on the right; the padding stays out of the RG-LRU states
    and the attention: each row continues as transformers continues that prompt alone."""
    ckpt, folder = bundle
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "decoder"
    assert config["decoder"]["inputs"]["past_key_names"] == "past_key_values.%d.key"
    validate_bundle(folder)
    # og's Engine, beams, n-gram decoding and rewind refuse its states as they refuse Mamba1's
    assert set(bundle_og_limits(folder)) == {ENGINE, BEAM, NGRAM, REWIND}
    assert_batch_continues_each_prompt(ckpt, folder)


def test_int4_puts_the_projections_in_matmulnbits(tmp_path):
    """int4 for cpu (an RG-LRU and an MLP 64 wide, which int4's blocks of 32 divide): the
    attention's, the RG-LRU's and the MLPs' projections in MatMulNBits, the gates' blocks in
    float; og generates every token asked for with it."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", FAMILY, lru_width=64, intermediate_size=128)
    bundle = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    tokens = greedy_tokens(load_model(bundle), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["MatMulNBits"] >= 4 + 3 * 3 + 4 * 3  # attention 4, each RG-LRU 3, MLPs 3


@pytest.mark.parametrize(
    "ep", ["cuda", *(pytest.param(ep, marks=pytest.mark.slow) for ep in ("dml", "webgpu"))]
)
def test_gpu_ep_graphs_attend_with_group_query_attention(checkpoint, ep):
    """The attention layer fuses to GroupQueryAttention (its window as local_window_size), the
    three RG-LRU layers keep a conv and a scan each (fused or as their bodies)."""
    graph = mobius_genai.build(checkpoint, ep, "f16", load_weights=False)["model"].graph
    nodes = list(graph)
    ops = [node.op_type for node in nodes]
    assert ops.count("GroupQueryAttention") == 1 and "Attention" not in ops
    gqa = next(node for node in nodes if node.op_type == "GroupQueryAttention")
    assert gqa.attributes["local_window_size"].as_int() == 6
    scans = ops.count("LinearAttention") or ops.count("Scan")
    assert scans == 3


def test_layers_are_placed_as_transformers_places_them():
    theirs = RecurrentGemmaConfig(num_hidden_layers=7, block_types=["recurrent", "attention"])
    config = get_family(FAMILY).parse_config(theirs.to_dict())
    expected = tuple(
        "rglru" if kind == "linear_attention" else "sliding_attention"
        for kind in theirs.layers_block_type
    )
    assert config.layer_types == expected
    assert config.sliding_window == 2048
    assert (config.head_dim, config.rotary_dim) == (256, 128)  # 2560 / 10, half rotated
    assert config.intermediate_size == 3 * 2560 // 2
    assert config.embedding_multiplier == 50.5  # sqrt(2560) = 50.596 in bfloat16


@pytest.mark.parametrize(
    ("changes", "error", "named"),
    [
        ({"block_types": ["recurrent", "mlp"]}, ConfigError, "block_types"),
        ({"lru_width": 42}, ConfigError, "lru_width"),
        ({"conv1d_width": 1}, ConfigError, "conv1d_width"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            UnsupportedModelError,
            "rope_type is 'linear'",
        ),
    ],
)
def test_refused_configs_name_the_field(changes, error, named):
    raw = {**json.loads(tiny_config(FAMILY).to_json_string()), **changes}
    with pytest.raises(error, match=named):
        get_family(FAMILY).parse_config(raw)


def test_embedding_scale_is_the_bfloat16_of_sqrt_hidden():
    for hidden in (64, 80, 2560, 4096):
        expected = torch.tensor(hidden**0.5, dtype=torch.bfloat16).item()
        raw = {"hidden_size": hidden}
        assert get_family(FAMILY).config_overrides["embedding_multiplier"](raw) == expected


#: The keys of RecurrentGemma-2B's hub config.json (transformers 4's layout: rope_theta and
#: partial_rotary_factor at the top level, a head_dim the class recomputes anyway).
HUB_2B = {
    "architectures": ["RecurrentGemmaForCausalLM"],
    "attention_bias": False,
    "attention_window_size": 2048,
    "block_types": ["recurrent", "recurrent", "attention"],
    "bos_token_id": 2,
    "conv1d_width": 4,
    "embeddings_scale_by_sqrt_dim": True,
    "eos_token_id": 1,
    "final_w_init_variance_scale": 0.07692307692307693,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2560,
    "intermediate_size": 15360,
    "logits_soft_cap": 30.0,
    "lru_width": 2560,
    "model_type": "recurrent_gemma",
    "num_attention_heads": 10,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 256000,
    "w_init_variance_scale": 0.01,
}


def test_the_hub_config_reads_as_transformers_reads_it():
    ours = get_family(FAMILY).parse_config(dict(HUB_2B))
    theirs = get_family(FAMILY).parse_config(RecurrentGemmaConfig(**HUB_2B).to_dict())
    assert ours == dataclasses.replace(theirs, torch_dtype=ours.torch_dtype)
    assert (ours.num_key_value_heads, ours.head_dim, ours.rotary_dim) == (1, 256, 128)
    assert ours.intermediate_size == 7680 and ours.rglru.block_width == 256
    assert ours.layer_types[:3] == ("rglru", "rglru", "sliding_attention")
    assert ours.max_position_embeddings == 8192  # no length in config.json
