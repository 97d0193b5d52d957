"""Decoding with a bundle's MTP head: onnxruntime-genai 0.18's og.MtpGenerator (the main model
verifies the head's drafts; the tokens are the main model's greedy tokens).

og.MtpGenerator runs greedy or sampled search at batch 1 without guidance or adapters; it
takes the prompt once (`append_tokens`), so each turn of a conversation is a new one.
Its `get_stats()` counts the drafts the head proposed, the main model evaluated and accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from mobius_genai.bundle.mtp_config import DRAFT_TOKENS
from mobius_genai.runtime.generate import load_model


@dataclasses.dataclass
class MtpStats:
    """What the head did over one generation (og's `get_stats()` keys)."""

    proposed: int = 0
    evaluated: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        """Accepted drafts per evaluated draft; None before any."""
        return self.accepted / self.evaluated if self.evaluated else None

    def read(self, stats: Mapping[str, Any]) -> None:
        self.proposed = int(stats["draft_tokens_proposed"])
        self.evaluated = int(stats["draft_tokens_evaluated"])
        self.accepted = int(stats["draft_tokens_accepted"])


def mtp_generator(
    model: og.Model, head: og.Model, max_length: int, *, draft_tokens: int = DRAFT_TOKENS
) -> og.MtpGenerator:
    """og.MtpGenerator of `model` and its `head` for sequences of at most `max_length` tokens,
    searching as the bundle's search settings say (greedy unless they sample)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    params.set_speculative_options(max_draft_tokens=draft_tokens)
    return og.MtpGenerator(model, head, params)


def mtp_tokens(
    model: og.Model,
    head: og.Model,
    prompt: Sequence[int],
    max_length: int,
    stats: MtpStats | None = None,
) -> Iterator[int]:
    """The tokens og.MtpGenerator generates after `prompt`, up to `max_length` tokens in all,
    one at a time; `stats` is kept up to date as they come."""
    generator = mtp_generator(model, head, max_length)
    generator.append_tokens(list(prompt))
    length = len(prompt)
    while not generator.is_done() and length < max_length:
        generator.generate_next_token()
        sequence = generator.get_sequence()
        if len(sequence) == length:
            break
        length = len(sequence)
        if stats is not None:
            stats.read(generator.get_stats())
        yield int(sequence[-1])


def smoke_mtp(
    folder: Path, prompt: Sequence[int], tokens: Sequence[int], options: Mapping[str, str]
) -> dict[str, Any]:
    """The smoke test's run of og.MtpGenerator after `prompt`, beside og.Generator's greedy
    `tokens`: the draft tokens per round, the drafts proposed, evaluated and accepted, and
    whether the tokens are the same (they may differ only where a near-tie rounds differently
    in the verify forward: the main model checks every draft)."""
    model = load_model(folder, session_options=options)
    head = load_model(folder, session_options=options, mtp_head=True)
    stats = MtpStats()
    drafted = list(mtp_tokens(model, head, prompt, len(prompt) + len(tokens), stats))
    return {
        "draft_tokens": DRAFT_TOKENS,
        "proposed": stats.proposed,
        "evaluated": stats.evaluated,
        "accepted": stats.accepted,
        "same_tokens": drafted == list(tokens),
    }
