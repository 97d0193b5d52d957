"""Inputs of one decode step of a bundle's decoder run as a plain onnxruntime session."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def decode_feeds(session, folder: str | Path, past: int) -> dict[str, np.ndarray]:
    """One new token after a `past`-token KV cache of random values.

    KV shapes come from genai_config.json (graphs may leave their head dims symbolic). A
    recurrent state (a hybrid's conv or delta-rule state: every dimension but the batch fixed,
    as the graph declares it) is random values of its declared shape, batch 1. 3-D (mrope)
    position_ids give the three axes the same position, as for text.
    """
    decoder = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
    kv_shape = (1, decoder["num_key_value_heads"], past, decoder["head_size"])
    rng = np.random.default_rng(0)
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = np.array([[5]], np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, past + 1), np.int64)
        elif value.name == "position_ids":  # [batch, seq], or mrope's [3, batch, seq]
            shape = [dim if isinstance(dim, int) else 1 for dim in value.shape]
            feeds[value.name] = np.full(shape, past, np.int64)
        elif all(isinstance(dim, int) for dim in value.shape[1:]):  # a recurrent state
            shape = (1, *value.shape[1:])
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        else:  # past_key_values.*
            feeds[value.name] = rng.standard_normal(kv_shape).astype(np.float32)
    return feeds
