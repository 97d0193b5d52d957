"""Both stored formats are `CheckpointReader`s, answering the same questions in their terms."""

from __future__ import annotations

from pathlib import Path

from mobius_genai.checkpoint.gguf import GgufCheckpoint
from mobius_genai.checkpoint.opening import open_checkpoint
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.checkpoint.weights import Checkpoint
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.conftest import TINY_QWEN2


def test_safetensors_and_gguf_checkpoints_are_readers(tmp_path: Path):
    gguf = open_checkpoint(
        write_tiny_gguf(tmp_path / "tiny.gguf", "llama", types={"attn_q": "Q4_0"})
    )
    safetensors = open_checkpoint(TINY_QWEN2)
    readers = [gguf.reader(), safetensors.reader()]
    assert [type(reader) for reader in readers] == [GgufCheckpoint, Checkpoint]
    for reader in readers:
        assert isinstance(reader, CheckpointReader)
        assert not reader.mxfp4_experts
        name = "model.layers.0.self_attn.q_proj.weight"
        assert reader.read(name).shape == reader.shape(name)
    assert readers[0].describe().startswith("GGUF (")
    assert 4 in readers[0].stored_bits()  # attn_q stored as Q4_0
    assert (readers[1].describe(), readers[1].stored_bits()) == (None, frozenset())
