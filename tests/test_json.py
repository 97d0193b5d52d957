"""Hostile JSON files (integers of thousands of digits, nesting 100k levels deep) are one-line
errors of the caller's type naming the file, for every JSON file mobius-genai reads."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mobius_genai._json import read_json, read_json_object
from mobius_genai.bundle.genai_config import read_generation_config
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.config import read_config_json
from mobius_genai.errors import BundleError, ConfigError, WeightsError
from tests.conftest import TINY_QWEN2

#: The documents Python's json cannot read: ValueError for the first, RecursionError for the other.
HOSTILE = {
    "long integer": ('{"vocab_size": ' + "7" * 5000 + "}", "more than 4300 digits"),
    "deep nesting": ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("error", [ConfigError, BundleError, WeightsError])
def test_read_json_turns_hostile_documents_into_the_callers_error(tmp_path, kind, error):
    text, words = HOSTILE[kind]
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(error, match=f"doc.json: not readable as JSON .*{words}") as caught:
        read_json(path, error)
    assert "\n" not in str(caught.value)
    with pytest.raises(error, match=words):
        read_json_object(path, error)


def _checkpoint(tmp_path: Path, name: str, text: str) -> Path:
    folder = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    (folder / name).write_text(text)
    return folder


#: Every reader of a checkpoint JSON file: file name, reader, the error it must raise.
CHECKPOINT_READERS: dict[str, tuple[str, Callable[[Path], object], type[Exception]]] = {
    "config.json": ("config.json", read_config_json, ConfigError),
    "generation_config.json": (
        "generation_config.json",
        read_generation_config,
        ConfigError,
    ),
    "safetensors index": ("model.safetensors.index.json", Checkpoint, WeightsError),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("reader", sorted(CHECKPOINT_READERS))
def test_checkpoint_json_files(tmp_path, kind, reader):
    name, read, error = CHECKPOINT_READERS[reader]
    text, words = HOSTILE[kind]
    folder = _checkpoint(tmp_path, name, text)
    with pytest.raises(error, match=f"{name}.*{words}"):
        read(folder)


@pytest.mark.parametrize("text", ["[]", '{"weight_map": []}', '{"weight_map": {"w": 1}}'])
def test_safetensors_index_of_the_wrong_shape(tmp_path, text):
    folder = _checkpoint(tmp_path, "model.safetensors.index.json", text)
    with pytest.raises(WeightsError, match="model.safetensors.index.json: "):
        Checkpoint(folder)
