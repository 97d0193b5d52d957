"""Bad GGUF input through `mobius-genai package`: one line naming the problem, exit code 1,
nothing written (no output folder, the GGUF untouched)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from mobius_genai.cli import main
from tests.checkpoint.gguf._tiny import write_tiny_gguf


def _truncated(at: Callable[[int], int]) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        raw = write_tiny_gguf(path, "llama").read_bytes()
        path.write_bytes(raw[: at(len(raw))])
        return path

    return write


def _truncated_in(tensor: str, **arguments) -> Callable[[Path], Path]:
    """A GGUF written with `arguments`, cut 8 bytes into `tensor`'s data."""

    def write(path: Path) -> Path:
        write_tiny_gguf(path, "llama", **arguments)
        start = next(t.data_offset for t in GGUFReader(path).tensors if t.name == tensor)
        path.write_bytes(path.read_bytes()[: start + 8])
        return path

    return write


_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "long_factor": [2.0] * 8,
    "short_factor": [1.0] * 8,
    "original_max_position_embeddings": 8,
}

#: case → (writes the GGUF at the path given, words the error must hold)
BAD_INPUT: dict[str, tuple[Callable[[Path], Path], list[str]]] = {
    "truncated in the header": (_truncated(lambda size: 200), ["not a readable GGUF file"]),
    "truncated in the tensor data": (
        _truncated(lambda size: size - 1000),
        ["not a readable GGUF file"],
    ),
    "truncated in Q5_K blocks": (
        _truncated_in(
            "blk.2.ffn_gate.weight",
            hidden_size=256,
            intermediate_size=256,
            types={"ffn_gate": "Q5_K", "ffn_up": "Q5_1"},
        ),
        ["not a readable GGUF file"],
    ),
    "unsupported tensor type": (
        lambda path: write_tiny_gguf(path, "llama", types={"attn_v": "F64"}),
        ["blk.0.attn_v.weight", "F64", "accepted: ", "Q4_K"],
    ),
    "unsupported architecture": (
        lambda path: write_tiny_gguf(path, "llama", architecture="falcon"),
        ["general.architecture is 'falcon'", "accepted: llama"],
    ),
    "non-positive rope scaling factor": (
        lambda path: write_tiny_gguf(
            path,
            "llama",
            rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
            metadata={"llama.rope.scaling.factor": 0.0},
        ),
        ["llama.rope.scaling.factor is 0.0", "accepted: a positive number"],
    ),
    "rotated channels beyond the head": (
        lambda path: write_tiny_gguf(
            path, "llama", partial_rotary_factor=2.0, rope_parameters={"rope_theta": 1e4}
        ),
        ["llama.rope.dimension_count is 32", "accepted: an even number of channels"],
    ),
    "unsupported rope scaling type": (
        lambda path: write_tiny_gguf(path, "llama", metadata={"llama.rope.scaling.type": "yarn"}),
        ["llama.rope.scaling.type is 'yarn'", "accepted: none, linear"],
    ),
    "longrope factors of the wrong length": (
        lambda path: write_tiny_gguf(
            path,
            "phi3",
            tie=False,
            max_position_embeddings=64,
            rope_parameters=_LONGROPE,
            rope_tensors={"rope_factors_long.weight": np.ones(5)},
        ),
        [
            "rope_factors_long.weight has 5 entries",
            "one positive factor per rotated channel pair (8)",
        ],
    ),
    "tensors of more layers than block_count": (
        lambda path: write_tiny_gguf(path, "llama", extra_layers=1),
        ["reads no tensor", "model.layers.3."],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_gguf_fails_cleanly_and_writes_nothing(tmp_path: Path, capsys, case: str):
    write, named = BAD_INPUT[case]
    gguf = write(tmp_path / "model.gguf")
    before = gguf.read_bytes()
    out = tmp_path / "out"
    assert main(["package", str(gguf), "--ep", "cpu", "-o", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mobius-genai: error: ") and err.count("\n") == 1, err
    assert str(gguf) in err
    for words in named:
        assert words in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    assert gguf.read_bytes() == before
