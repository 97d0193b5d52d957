"""GGUF files (llama.cpp) as a source: config, tokenizer and weights from the file itself.

`open_gguf` reads the metadata with the gguf package (llama.cpp's own reader) and writes the
config.json, tokenizer.json, tokenizer_config.json and generation_config.json a HuggingFace
checkpoint would have into a private folder (removed at exit); the weights stay in the GGUF:
block types MatMulNBits holds keep their integers (`GgufCheckpoint.stored_integers`), others are
dequantized as they are read.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mobius_genai._json import write_json
from mobius_genai.checkpoint.gguf.checkpoint import GgufCheckpoint
from mobius_genai.checkpoint.gguf.metadata import config_json, generation_config
from mobius_genai.checkpoint.gguf.tokenizer import tokenizer_config, tokenizer_json
from mobius_genai.checkpoint.source import Source

__all__ = ["GgufCheckpoint", "open_gguf"]


def open_gguf(path: Path) -> tuple[Source, dict[str, Any], GgufCheckpoint]:
    """The Source (a folder of HuggingFace metadata files), config.json and checkpoint of a GGUF."""
    checkpoint = GgufCheckpoint(path)
    meta = checkpoint.metadata
    where = str(path)
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or int(
        meta.get(f"{checkpoint.arch}.vocab_size", 0)
    )
    tied = "lm_head.weight" not in checkpoint
    config = config_json(meta, tied, vocab, where, checkpoint.rope_tensors)
    folder = Path(tempfile.mkdtemp(prefix="mobius-gguf-"))
    atexit.register(shutil.rmtree, folder, True)
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", generation_config(meta))
    write_json(folder / "tokenizer.json", tokenizer_json(meta, where))
    write_json(
        folder / "tokenizer_config.json",
        tokenizer_config(meta, config.get("max_position_embeddings")),
    )
    return Source(path=folder, model_id=path.name, weights=path), config, checkpoint
