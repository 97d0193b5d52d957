"""GGUF metadata → config.json values the GGUF does not store, as llama.cpp assumes them."""

from __future__ import annotations

import pytest

from mobius_genai.checkpoint.gguf.metadata import config_json

#: Gemma 3 sizes and the query_pre_attn_scalar of each one's config.json on the hub: head_dim,
#: except 27B's hidden_size / heads (llama.cpp takes 62 layers for 27B, llama-model.cpp).
GEMMA3 = {
    "4b": ({"layers": 34, "hidden": 2560, "heads": 8, "kv": 4, "head_dim": 256}, 256),
    "12b": ({"layers": 48, "hidden": 3840, "heads": 16, "kv": 8, "head_dim": 256}, 256),
    "27b": ({"layers": 62, "hidden": 5376, "heads": 32, "kv": 16, "head_dim": 128}, 168),
}


@pytest.mark.parametrize("size", list(GEMMA3))
def test_gemma3_query_pre_attn_scalar(size: str):
    sizes, expected = GEMMA3[size]
    meta = {
        "general.architecture": "gemma3",
        "gemma3.block_count": sizes["layers"],
        "gemma3.embedding_length": sizes["hidden"],
        "gemma3.attention.head_count": sizes["heads"],
        "gemma3.attention.head_count_kv": sizes["kv"],
        "gemma3.attention.key_length": sizes["head_dim"],
        "gemma3.rope.scaling.type": "linear",
        "gemma3.rope.scaling.factor": 8.0,
    }
    config = config_json(meta, tied=True, vocab=262208, where="gemma3.gguf")
    assert config["query_pre_attn_scalar"] == expected
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
