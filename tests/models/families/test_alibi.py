"""ALiBi (config/alibi.py, components/alibi.py) and its rows, bloom and mpt: the slopes as
transformers makes them for every head count, padded batches against transformers, each part of
the mechanism undone (parity must then fail), the fused op each EP gets, og's batches, and the
config.json switches refused in one line.

The rows' logits against transformers (prefill and cached decode, portable and cpu graphs) are
test_parity.py's CASES and MUTANTS; the bundles' greedy tokens are test_bundles.py's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import onnx_ir as ir
import pytest
import torch
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

import mobius_genai
from mobius_genai import UnsupportedModelError, packager
from mobius_genai.components import alibi
from mobius_genai.config.alibi import Alibi
from mobius_genai.models import FAMILIES, causal_lm, get_family
from tests._bundles import (
    assert_og_batches_continue_each_prompt,
    bundle_checkpoint,
)
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._ort import (
    left_padded_diffs,
    max_abs_diff,
    mutant_diffs,
    ort_session,
    run_like_reference,
)
from tests.models.families.test_parity import FALCON_RW

TOLERANCE = 1e-4  # f32, max abs diff of logits
#: Six heads: not a power of two, so the slopes interleave a second series (config/alibi.py).
SIX_HEADS = {"num_attention_heads": 6, "hidden_size": 96}


@pytest.mark.parametrize("heads", range(1, 41))
def test_slopes_are_bloom_and_mpt_slopes_for_every_head_count(heads):
    bloom = _get_alibi_slopes(heads, torch.device("cpu")).numpy()
    mpt = build_mpt_alibi_tensor(heads, 2)[:, 0, 0].numpy() * -1  # the key one position back
    ours = Alibi().slopes(heads)
    np.testing.assert_allclose(ours, bloom, rtol=1e-6)
    np.testing.assert_allclose(ours, mpt, rtol=1e-6)


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_left_padded_batch_matches_transformers(family, tmp_path):
    """A batch whose first row is left-padded by 4, six heads (the interleaved slopes)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **SIX_HEADS)
    first, rest = left_padded_diffs(ckpt, tmp_path)
    assert max(first, rest) <= TOLERANCE, (first, rest)


def _holed_diff(ckpt, directory) -> float:
    """The portable graph against transformers on a batch whose first row has two padding
    slots among its tokens (og.Generator's right-padded row continues after its padding):
    the largest logits difference at real positions, prefill and decode steps."""
    ids = np.random.default_rng(2).integers(3, 128, size=(2, 10))
    mask = np.ones_like(ids)
    mask[0, 4:6] = 0
    reference = hf_reference_logits(ckpt, ids, decode_steps=3, attention_mask=mask)
    package = mobius_genai.build(ckpt, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, directory), reference)
    real = mask.astype(bool)
    first = float(np.abs(ours[0][real] - reference.logits[0][real]).max())
    return max(first, max_abs_diff(ours[1:], reference.logits[1:]))


def _positions_by_slot(op, mask, input_ids, attention_mask, *settings):
    """Mutant: the keys' positions counted in slots, the padding ignored."""
    ones = op.Add(op.Mul(attention_mask, op.Constant(value_int=0)), op.Constant(value_int=1))
    return alibi.alibi_bias(op, mask, input_ids, ones, *settings)


def test_keys_are_placed_by_their_positions_not_their_slots(tmp_path, monkeypatch):
    """Bloom counts a key's position in the mask's ones: padding between a row's tokens does
    not move the keys after it. Counted in slots (padding ignored), parity fails."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "bloom", seed=1)
    assert _holed_diff(ckpt, tmp_path / "ours") <= TOLERANCE
    monkeypatch.setattr(causal_lm, "alibi_bias", _positions_by_slot)
    assert _holed_diff(ckpt, tmp_path / "mutant") > 10 * TOLERANCE


def _one_series(self, num_heads):
    """Mutant: 2^(-8k/n) for every head, right only for a power of two."""
    return 2.0 ** (-self.max_bias * np.arange(1, num_heads + 1) / num_heads)


def _by_query_position(op, mask, input_ids, attention_mask, settings, num_heads, _scale):
    """Mutant: slope x the query's position instead of the key's. Constant along each row of
    scores, softmax removes it: the same as no ALiBi at all."""
    one = op.Constant(value_int=1)
    positions = op.Sub(op.CumSum(attention_mask, one), one)
    seq = op.Shape(input_ids, start=1, end=2)
    queries = op.Slice(
        positions, op.Neg(seq), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[1])
    )
    slopes = settings.slopes(num_heads).reshape(1, -1, 1, 1).astype(np.float32)
    per_head = op.Constant(value=ir.tensor(slopes))
    rows = op.Cast(op.Unsqueeze(queries, op.Constant(value_ints=[1, 3])), to=ir.DataType.FLOAT)
    return op.Add(mask, op.CastLike(op.Mul(rows, per_head), mask))


_SLOPES = Alibi.slopes

MUTANTS = {
    "one_slope_series_for_six_heads": (Alibi, "slopes", _one_series),
    "bias_by_query_position": (causal_lm, "alibi_bias", _by_query_position),
    "slopes_in_reverse_head_order": (
        Alibi,
        "slopes",
        lambda self, heads: _SLOPES(self, heads)[::-1],
    ),
}


@pytest.mark.parametrize("family", ["bloom", "mpt"])
@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_part_of_alibi_wrong(case, family, tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **SIX_HEADS)
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    ours, mutated = mutant_diffs(ckpt, ids, tmp_path, family, MUTANTS[case], monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def test_falcon_rounds_slopes_and_products_to_bfloat16(tmp_path, monkeypatch):
    """Twelve heads (slopes 2^(-k/2), not bfloat16 numbers) over 48 tokens: FalconModel's
    bfloat16 rounding moves the logits; built without it, parity fails."""
    rw = {**FALCON_RW, "num_attention_heads": 12}
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "falcon", seed=1, **rw)
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 48))
    row = FAMILIES["falcon"]
    overrides = {**row.config_overrides, "alibi": Alibi(scaled=True)}
    mutant = dataclasses.replace(row, config_overrides=overrides)
    ours, mutated = mutant_diffs(ckpt, ids, tmp_path, "falcon", mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def _attention_ops(graph) -> Counter:
    return Counter(
        node.op_type for node in graph if node.op_type in ("Attention", "GroupQueryAttention")
    )


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_each_ep_gets_the_fused_op_that_takes_the_bias(family, tmp_path, recwarn):
    """cpu's GroupQueryAttention takes attention_bias [batch, heads, seq, total]: every layer
    runs it with causal=0 and the ALiBi biases laid out by key position (alibi.position_bias,
    a Where; the portable graph's bias is a Max). webgpu's takes none: standard Attention stays,
    with no warning that GQA was expected, and the trace says why GQAFusion declined."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    assert _attention_ops(graph) == {"GroupQueryAttention": 3}
    fused = [node for node in graph if node.op_type == "GroupQueryAttention"]
    assert all(node.attributes.get_int("causal", 1) == 0 for node in fused)
    assert {node.inputs[10].producer().op_type for node in fused} == {"Where"}
    package = mobius_genai.build(ckpt, "webgpu", "f32", load_weights=False, progress=False)
    assert _attention_ops(package["model"].graph) == {"Attention": 3}
    reasons = [d.reason for d in package.reports["model"].rules["GQAFusion"].declines]
    expected = "linear biases by key position (ALiBi); causal GroupQueryAttention adds no bias"
    assert len(reasons) == 3 and set(reasons) == {expected}, reasons
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


def test_og_batch_of_prompts_of_different_lengths_generates_like_transformers(tmp_path):
    """og.Generator pads the shorter prompt on the right and goes on after its padding: the
    keys after the hole keep their positions, each row continues as transformers continues
    that prompt alone (the cpu bundle: GroupQueryAttention with the bias; six heads); so do
    og.Engine's requests of different lengths."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "bloom")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    assert_og_batches_continue_each_prompt(ckpt, folder)


@pytest.mark.parametrize(
    ("family", "switches", "words"),
    [
        ("mpt", {"attn_config": {"prefix_lm": True}}, "attn_config.prefix_lm is True"),
        ("mpt", {"attn_config": {"qk_ln": True}}, "attn_config.qk_ln is True"),
        ("mpt", {"attn_config": {"alibi": False}}, "attn_config.alibi is False"),
        ("mpt", {"attn_config": {"alibi_bias_max": 16}}, "attn_config.alibi_bias_max is 16"),
        (
            "mpt",
            {"attn_config": {"attn_type": "multiquery_attention"}},
            "attn_config.attn_type is 'multiquery_attention'",
        ),
        ("mpt", {"attn_config": {"attn_uses_sequence_id": True}}, "attn_uses_sequence_id"),
        ("mpt", {"no_bias": False}, "no_bias is false"),
        ("mpt", {"logit_scale": 0.5}, "logit_scale is 0.5"),
    ],
)
def test_what_the_rows_do_not_build_is_refused_in_one_line(family, switches, words):
    raw = {**tiny_config(family).to_dict(), **switches}
    with pytest.raises(UnsupportedModelError, match=r"^config\.json: [^\n]*$") as error:
        get_family(family).parse_config(raw)
    assert words in str(error.value)
