"""safetensors headers: each file's header is parsed once and checked, bad ones are clear errors.

A header is JSON written by whoever made the checkpoint: every way it can be wrong must end in
one line naming the file and the fault, never a traceback.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.checkpoint import _safetensors
from mobius_genai.checkpoint.weights import Checkpoint
from tests._hf import write_tiny_checkpoint

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _write(folder: Path, header: bytes | object, data: bytes = bytes(8)) -> Path:
    """A model.safetensors in `folder` with this header (JSON-encoded unless bytes) and data."""
    folder.mkdir(exist_ok=True)
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return folder


def _refused(folder: Path) -> str:
    with pytest.raises(WeightsError) as info:
        Checkpoint(folder)
    message = str(info.value)
    assert "\n" not in message
    assert f"{folder / 'model.safetensors'}: " in message
    return message


def _deep(depth: int) -> bytes:
    return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("header", "fault"),
    [
        ([], r"header is not a JSON object but \[\]"),
        (None, "header is not a JSON object but None"),
        ({"a": 3}, "tensor 'a': its entry is not an object"),
        ({"a": {**F32_2, "data_offsets": "0,8"}}, "tensor 'a': data_offsets '0,8'"),
        ({"a": {"dtype": "F32", "shape": [2]}}, "tensor 'a': data_offsets None"),
        ({"a": {**F32_2, "data_offsets": [0]}}, r"tensor 'a': data_offsets \[0\]"),
        ({"a": {**F32_2, "data_offsets": [0.0, 8.0]}}, r"tensor 'a': data_offsets \[0.0, 8.0\]"),
        ({"a": {**F32_2, "data_offsets": [8, 0]}}, r"tensor 'a': data_offsets \[8, 0\]"),
        ({"a": {**F32_2, "data_offsets": [0, 2**64]}}, "tensor 'a': data_offsets"),
        ({"a": {"shape": [2], "data_offsets": [0, 8]}}, "tensor 'a': dtype None"),
        ({"a": {**F32_2, "dtype": 4}}, "tensor 'a': dtype 4; accepted: BF16, BOOL"),
        ({"a": {**F32_2, "dtype": "F99"}}, "tensor 'a': dtype 'F99'"),
        ({"a": {**F32_2, "dtype": ["F32"]}}, r"tensor 'a': dtype \['F32'\]"),
        ({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, "tensor 'a': shape None"),
        ({"a": {**F32_2, "shape": "2"}}, "tensor 'a': shape '2'"),
        ({"a": {**F32_2, "shape": [-2]}}, r"tensor 'a': shape \[-2\]"),
        ({"a": {**F32_2, "shape": [True, 2]}}, r"tensor 'a': shape \[True, 2\]"),
        ({"a": {**F32_2, "shape": [2**40] * 3}}, "tensor 'a': shape .* too many elements"),
        ({"a": {**F32_2, "shape": [3]}}, r"tensor 'a': holds 8 bytes, .*F32 \[3\] needs 12"),
        (
            {"a": {**F32_2, "data_offsets": [0, 8]}, "b": {**F32_2, "data_offsets": [4, 12]}},
            "tensor 'b': its data starts at byte 4 .* the previous tensor's ends at byte 8",
        ),
        (
            {"a": {**F32_2, "data_offsets": [0, 8]}, "b": {**F32_2, "data_offsets": [12, 20]}},
            "tensor 'b': its data starts at byte 12 .* ends at byte 8",
        ),
        ({"a": {**F32_2, "data_offsets": [8, 16]}}, "tensor 'a': its data starts at byte 8"),
        ({"__metadata__": [], "a": F32_2}, "__metadata__ is not an object of strings"),
        ({"__metadata__": {"format": 1}, "a": F32_2}, "__metadata__ is not an object of strings"),
        (b"[" * 200_000 + b"]" * 200_000, "header nested too deeply"),
        (_deep(200_000), "header nested too deeply"),
        (b'{"a": ' + b"1" * 4301 + b"}", "header is not valid JSON .*4300 digits"),
        (b'{"a": {"dtype": "F32"', "header is not valid JSON"),
        (b'{"a": "\xff"}', "header is not valid JSON"),
    ],
)
def test_a_malformed_header_is_a_one_line_error(tmp_path: Path, header, fault: str):
    message = _refused(_write(tmp_path / "ckpt", header, bytes(20)))
    assert re.search(fault, message), message


def test_a_header_larger_than_safetensors_allows_is_refused(tmp_path: Path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((100_000_001).to_bytes(8, "little") + b"{}")
    assert "header of 100000001 bytes" in _refused(folder)


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        (b"", "shorter than the 8 bytes"),
        (b"\x01\x00", "shorter than the 8 bytes"),
        (bytes(8), "header of 0 bytes"),
        ((64).to_bytes(8, "little") + b"{}", "header of 64 bytes runs past the end"),
    ],
)
def test_a_file_too_short_for_its_header_is_refused(tmp_path: Path, content: bytes, fault: str):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(content)
    assert fault in _refused(folder)


def test_data_past_the_last_tensor_is_refused(tmp_path: Path):
    message = _refused(_write(tmp_path / "ckpt", {"a": F32_2}, bytes(12)))
    assert "4 bytes after the last tensor" in message


def test_a_header_is_read_once_per_file_and_tensors_from_their_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Building and saving reads every tensor (several in row blocks); each file's header is
    parsed once, when the checkpoint is opened, whatever the number of tensors."""
    folder = write_tiny_checkpoint(tmp_path / "ckpt", "qwen2", max_shard_size="50KB")
    parsed: Counter[Path] = Counter()
    original = _safetensors.read_header
    monkeypatch.setattr(
        _safetensors, "read_header", lambda file: parsed.update([file]) or original(file)
    )
    monkeypatch.setattr("mobius_genai.checkpoint.weights.STREAM_ELEMENTS", 1000)  # many block reads
    package = mobius_genai.build(folder, "cpu", "f32")
    package.save(tmp_path / "bundle", progress=False)
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) > 2
    assert parsed == Counter(shards)


def test_tensors_read_from_their_offsets_equal_safetensors_reads(tmp_path: Path):
    """Every dtype safetensors writes comes back as safetensors reads it; bf16 as
    ml_dtypes.bfloat16; slices read only that slice."""
    rng = np.random.default_rng(0)
    tensors = {
        name: rng.standard_normal((5, 7)).astype(dtype)
        for name, dtype in [
            ("f32", np.float32),
            ("f16", np.float16),
            ("f64", np.float64),
            ("bf16", ml_dtypes.bfloat16),
        ]
    }
    tensors.update(
        i64=np.arange(12, dtype=np.int64).reshape(3, 4),
        u8=np.arange(6, dtype=np.uint8),
        flag=np.array([True, False]),
        scalar=np.array(2.5, np.float32),
        empty=np.zeros((0, 3), np.float32),
    )
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "np"})
    expected = load_file(folder / "model.safetensors")
    checkpoint = Checkpoint(folder)
    assert set(checkpoint) == set(tensors)
    for name, array in expected.items():
        got = checkpoint.read(name)
        assert got.dtype == array.dtype, name
        np.testing.assert_array_equal(got, array, err_msg=name)
        assert checkpoint.shape(name) == array.shape
    assert checkpoint.dtype("bf16") == "BF16"
    assert checkpoint.read("bf16").dtype == ml_dtypes.bfloat16
    part = checkpoint.read("f32", (slice(1, 4), slice(2, 5)))
    np.testing.assert_array_equal(part, expected["f32"][1:4, 2:5])
    assert part.flags.c_contiguous and part.flags.owndata


def _mapped(file: Path) -> bool:
    return str(file.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_no_map_of_a_file_outlives_a_read(tmp_path: Path):
    """Pages read through a map stay in the process's RSS while it is mapped: a checkpoint
    keeps no map open, so reading a 15 GB checkpoint does not leave 15 GB resident."""
    header = {"a": F32_2, "b": {**F32_2, "data_offsets": [8, 16]}}
    folder = _write(tmp_path / "ckpt", header, bytes(16))
    file = folder / "model.safetensors"
    checkpoint = Checkpoint(folder)
    assert not _mapped(file)
    for name in checkpoint:
        checkpoint.read(name)
        checkpoint.read(name, (slice(1, 2),))
        assert not _mapped(file)
