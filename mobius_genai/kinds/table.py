"""The table of model kinds: config.json's model_type → the kind that builds it.

Adding a kind (speech, omni, ...) is a module beside `text` and `vision_language` and one entry
here, before the text decoder (which takes every model_type no other kind claims, and refuses
those the family table lacks).
"""

from __future__ import annotations

from mobius_genai.kinds.base import ModelKind
from mobius_genai.kinds.text import TextDecoderKind
from mobius_genai.kinds.vision_language import VisionLanguageKind
from mobius_genai.kinds.whisper import WhisperKind

TEXT_DECODER = TextDecoderKind()
KINDS: tuple[ModelKind, ...] = (VisionLanguageKind(), WhisperKind(), TEXT_DECODER)


def kind_of(model_type: str) -> ModelKind:
    """The first kind of `KINDS` that claims `model_type`."""
    return next(kind for kind in KINDS if kind.claims(model_type))
