"""The contracts every model kind must keep in the default run (og.Engine with concurrent
requests, the logits of every position, n-gram speculative decoding), on the kinds
test_og_contract.py runs only when slow tests are asked for, and on int4 and QMoE bundles
(test_og_contract.py runs every contract on `default` EP bundles).

The test functions are test_og_contract.py's own, collected here again with this module's
`kind` fixture, so that both files check exactly the same things."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import open_kind
from tests.runtime.test_og_contract import (
    test_engine_requests_of_different_lengths_give_their_tokens_alone,
    test_logits_of_every_position_equal_transformers,
    test_ngram_speculative_decoding_gives_the_greedy_tokens,
)

__all__ = [
    "test_engine_requests_of_different_lengths_give_their_tokens_alone",
    "test_logits_of_every_position_equal_transformers",
    "test_ngram_speculative_decoding_gives_the_greedy_tokens",
]


@pytest.fixture(params=["dense_int4", "moe", "qmoe", "lfm2", "delta_net", "vlm"])
def kind(request):
    """(og.Model, bundle folder, checkpoint folder, transformers class) of one model kind."""
    return open_kind(request, request.param)
