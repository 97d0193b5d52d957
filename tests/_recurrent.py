"""Test scaffolding of the recurrent rows: transformers' reference runs as onnxruntime-genai
feeds a graph (greedy steps through transformers' cache after a prefill, `cached_reference`;
prompts run alone laid out as one left-padded batch, `alone_then_padded`), a variant's parity,
a block's mutant that carries no state, and og's batch against transformers."""

from __future__ import annotations

import numpy as np
import torch

import mobius_genai
from tests._bundles import PROMPT, batch_greedy_tokens
from tests._hf import (
    ReferenceRun,
    ReferenceStep,
    hf_forward,
    hf_greedy_tokens,
    load_reference_model,
    positions_from_mask,
    write_tiny_checkpoint,
)
from tests._ort import max_abs_diff, ort_session, run_like_reference


def cached_reference(
    ckpt, ids: np.ndarray, decode_steps: int, dtype: torch.dtype = torch.float32
) -> ReferenceRun:
    """transformers' prefill of `ids` [batch, seq], then greedy single-token steps through its
    cache, the attention mask given with the prefill only (as generate() does); each step
    records the whole mask, as onnxruntime-genai feeds it. The model runs in `dtype`."""
    model = load_reference_model(ckpt).to(dtype)
    mask = np.ones_like(ids)
    steps, cache = [], None
    with torch.no_grad():
        for step in range(decode_steps + 1):
            positions = positions_from_mask(mask, ids.shape[1])
            masked = {"attention_mask": torch.from_numpy(mask)} if step == 0 else {}
            logits, cache = hf_forward(
                model,
                cache,
                input_ids=torch.from_numpy(ids),
                position_ids=torch.from_numpy(positions),
                **masked,
            )
            logits = logits.float().numpy()
            steps.append(ReferenceStep(ids, mask, positions, logits))
            ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
    return ReferenceRun(steps)


def alone_then_padded(ckpt, prompts: list[np.ndarray], decode_steps: int) -> ReferenceRun:
    """transformers' run of each prompt alone, laid out as one left-padded batch: the padded
    positions' logits are zeros (they mean nothing), each decode step feeds each row's own
    greedy token."""
    alone = [cached_reference(ckpt, prompt[None], decode_steps) for prompt in prompts]
    width = max(len(prompt) for prompt in prompts)
    steps = []
    for index in range(decode_steps + 1):
        ids, logits = [], []
        for run in alone:
            step = run.steps[index]
            pad = width - step.input_ids.shape[1] if index == 0 else 0
            ids.append(np.pad(step.input_ids[0], (pad, 0)))
            logits.append(np.pad(step.logits[0], ((pad, 0), (0, 0))))
        seq = len(ids[0])
        if index == 0:
            mask = np.stack([(np.arange(width) >= width - len(p)) for p in prompts]).astype(int)
        else:
            mask = np.concatenate([mask, np.ones((len(prompts), 1), int)], axis=1)
        step = ReferenceStep(
            np.stack(ids), mask.astype(np.int64), positions_from_mask(mask, seq), np.stack(logits)
        )
        steps.append(step)
    return ReferenceRun(steps)


def assert_variant_matches(family: str, overrides: dict, tmp_path) -> None:
    """`family`'s tiny checkpoint with `overrides`: a 2 x 12-token prefill and 3 decode steps
    on the portable and cpu graphs match transformers."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    ids = np.random.default_rng(1).integers(3, 128, size=(2, 12))
    reference = cached_reference(ckpt, ids, 3)
    for ep in ("default", "cpu"):
        package = mobius_genai.build(ckpt, ep, "f32", progress=False)
        ours = run_like_reference(ort_session(package, tmp_path / ep), reference)
        assert max_abs_diff(ours, reference.logits) <= 1e-4, ep


def without_past(block: type, state: int):
    """`block`'s forward (a recurrent block's: hidden states, mask, past states) with its past
    state number `state` (Mamba1's conv 0, scan 1) read as zeros: a state not carried from one
    call to the next."""
    forward = block.forward

    def mutant(self, op, hidden_states, attention_mask, *past):
        past = list(past)
        past[state] = op.Mul(past[state], op.CastLike(op.Constant(value_float=0.0), past[state]))
        return forward(self, op, hidden_states, attention_mask, *past)

    return mutant


def assert_batch_continues_each_prompt(ckpt, folder) -> None:
    """og's greedy rows for a batch of two prompts of different lengths are transformers'
    continuations of each prompt alone."""
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    expected = [hf_greedy_tokens(ckpt, prompt, 8, stop_at_eos=False) for prompt in prompts]
    assert rows == expected
    assert len(set(rows[0])) > 2  # a real continuation, not one token repeated
