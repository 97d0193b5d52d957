"""verbose_json names a transcript's language as OpenAI's API does ("english"), from Whisper's
own table."""

from __future__ import annotations

from transformers.models.whisper.tokenization_whisper import LANGUAGES

from mobius_genai.runtime.whisper_languages import LANGUAGE_NAMES


def test_the_names_are_whispers_in_its_token_order():
    assert list(LANGUAGE_NAMES.items()) == list(LANGUAGES.items())
