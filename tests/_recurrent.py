"""transformers' reference runs of recurrent decoders, as onnxruntime-genai feeds a graph:
greedy steps through transformers' cache after a prefill (`cached_reference`), and prompts run
alone laid out as one left-padded batch (`alone_then_padded`)."""

from __future__ import annotations

import numpy as np
import torch

from tests._hf import (
    ReferenceRun,
    ReferenceStep,
    hf_forward,
    load_reference_model,
    positions_from_mask,
)


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
