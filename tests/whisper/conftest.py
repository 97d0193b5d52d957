"""Whisper fixtures: one tiny random checkpoint per layout, and its reference model."""

from __future__ import annotations

import pytest

from tests.whisper._whisper import LAYOUTS, write_whisper_checkpoint


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
