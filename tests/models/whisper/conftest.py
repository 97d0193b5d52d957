"""Whisper fixtures: one tiny random checkpoint per layout, its reference model, a bundle."""

from __future__ import annotations

import pytest

from mobius_genai.packager import package
from tests.models.whisper._whisper import LAYOUTS, write_whisper_checkpoint, write_whisper_tokenizer


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def whisper_checkpoint(request, tmp_path_factory):
    """(layout, transformers' model, checkpoint folder) for each layout."""
    folder = tmp_path_factory.mktemp(f"whisper-{request.param}")
    return request.param, write_whisper_checkpoint(folder, request.param), folder


@pytest.fixture(scope="module")
def multilingual_checkpoint(tmp_path_factory):
    """(transformers' model, checkpoint folder) of the multilingual layout."""
    folder = tmp_path_factory.mktemp("whisper-multilingual")
    return write_whisper_checkpoint(folder, "multilingual"), folder


@pytest.fixture(scope="module")
def speech_bundle(multilingual_checkpoint, tmp_path_factory):
    """The multilingual checkpoint with a tokenizer, packaged for cpu (no smoke test)."""
    _, folder = multilingual_checkpoint
    write_whisper_tokenizer(folder, "multilingual")
    out = tmp_path_factory.mktemp("speech") / "bundle"
    return package(folder, "cpu", out, quiet=True, smoke_test=False)
