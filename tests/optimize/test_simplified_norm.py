"""SimplifiedNorm: RMSNormalization → SimplifiedLayerNormalization, same attributes, same logits."""

from __future__ import annotations

import pytest

from mobius_genai.optimize.rules import simplified_norm
from tests.optimize._graphs import (
    apply,
    clone,
    decline_reasons,
    max_diff,
    nodes,
    op_counts,
    parse,
    random_feeds,
    run,
    run_decoder,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-5  # f32 logits, max abs diff before vs after, prefill + 4 decode steps


def test_every_rms_norm_becomes_simplified_layer_norm_with_its_attributes():
    model = parse(
        """
        g (float[2, 3, 8] x, float[8] w) => (float[2, 3, 8] y) {
            y = RMSNormalization <axis = -1, epsilon = 0.001> (x, w)
        }
        """
    )
    before = run(clone(model), random_feeds(model))
    assert apply(model, simplified_norm.rules()) == [1]
    (node,) = nodes(model, "SimplifiedLayerNormalization")
    assert node.domain == "" and not nodes(model, "RMSNormalization")
    assert node.attributes.get_int("axis") == -1
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-3)
    assert max_diff(before, run(model, random_feeds(model))) <= 1e-6


def test_declines_a_stash_type_other_than_float():
    model = parse(
        """
        g (float[2, 8] x, float[8] w) => (float[2, 8] y) {
            y = RMSNormalization <stash_type = 10> (x, w)
        }
        """
    )
    assert any(
        "stash_type is not float" in r for r in decline_reasons(model, simplified_norm.rules())
    )
    assert apply(model, simplified_norm.rules()) == [0]


def test_rewritten_decoder_runs_with_ort(tmp_path):
    config = tiny_config()
    model, _ = tiny_decoder(config)
    norms = op_counts(model)["RMSNormalization"]
    assert norms == 2 * config.num_hidden_layers + 1
    before = run_decoder(model, config, tmp_path / "before")
    lowered = clone(model)
    assert apply(lowered, simplified_norm.rules()) == [norms]
    assert op_counts(lowered)["SimplifiedLayerNormalization"] == norms
    after = run_decoder(lowered, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE
