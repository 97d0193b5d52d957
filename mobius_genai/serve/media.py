"""Images and audio in requests: what the served bundle takes, and a chat prompt's images and
clip turned into og's processor inputs as `run --image` and `run --audio` make them
(runtime/generate.py, runtime/audio.py: the same checks and calls).

A bundle with a vision graph (model.vision: qwen2_5_vl, qwen3_vl, gemma3, mistral3, lfm2_vl,
gemma4) takes image_url parts, as many as og 0.18's processor takes in one prompt: any number
that fits the context (each image is hundreds of tokens), though og stacks lfm2_vl's images in
one batch and refuses several of different sizes, and fails mistral3's where the tallest image
is not also the widest; those refusals come back as a 400 with og's words. A bundle whose og
type places a clip in prompts and which has a speech graph (Gemma 4 E2B/E4B) takes one
input_audio part per request (og 0.18 takes one clip per prompt). Each part's place among its
message's text parts is where the bundle's placeholder goes, and the chat template renders the
message around it. A speech bundle (Whisper) transcribes instead, through
POST /v1/audio/transcriptions. The checks that need no onnxruntime-genai object run in the app
before a request is queued (`BundleMedia.check`: which media the bundle takes, each image's
bytes as `run --image` checks a file's); the processor runs on the engine thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnxruntime_genai as og

from mobius_genai.errors import BundleError, OptionError
from mobius_genai.kinds.og_types import MULTILINGUAL_VOCAB, og_type
from mobius_genai.runtime.audio import (
    PROMPT_CLIP_SECONDS,
    Clip,
    audio_inputs,
    has_audio,
    language_codes,
    prompt_audio,
)
from mobius_genai.runtime.generate import processor_inputs
from mobius_genai.runtime.image_bytes import MAX_PIXELS, image_pixels, image_refusal
from mobius_genai.runtime.placeholders import require_media
from mobius_genai.serve.protocol import Generation, InputImage, RequestError, Transcription

#: How a request gives an image and a clip, which a refusal names.
SERVED_MEDIA = {"image": "image_url part", "clip": "input_audio part"}


@dataclass(frozen=True)
class BundleMedia:
    """The served bundle's folder and genai_config: which audio its requests may hold."""

    folder: str
    config: Mapping[str, Any]

    @property
    def placeholder(self) -> str | None:
        """The placeholder a clip takes in a prompt; None for a bundle that takes none."""
        return prompt_audio(self.config)

    @property
    def transcribes(self) -> bool:
        """A speech bundle (Whisper): it transcribes audio and takes no chat."""
        return has_audio(self.config)

    @property
    def image_placeholder(self) -> str | None:
        """The placeholder an image takes in a prompt; None for a bundle without a vision
        graph."""
        model = self.config["model"]
        return og_type(model["type"]).image_placeholder if "vision" in model else None

    @property
    def takes_audio(self) -> bool:
        return self.transcribes or self.placeholder is not None

    @property
    def multimodal(self) -> bool:
        """The bundle takes images or audio: og's multimodal pipeline (or Whisper's), which
        og.Engine does not run."""
        return self.takes_audio or self.image_placeholder is not None

    def inputs(self) -> str:
        """The bundle's inputs in words, for refusals."""
        model = self.config["model"]
        if self.transcribes:
            what = "audio to transcribe"
        else:
            media = [("images", "vision" in model), ("audio", self.placeholder is not None)]
            names = ["text", *(name for name, present in media if present)]
            what = " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "text"
        return f"the bundle (model.type {model['type']!r}) takes {what}"

    def parts(self) -> str:
        """The content parts a chat message may hold here, in words, for refusals."""
        kinds = [("image_url", self.image_placeholder), ("input_audio", self.placeholder)]
        names = ["text", *(name for name, present in kinds if present is not None)]
        return ", ".join(names[:-1]) + f" and {names[-1]} parts" if len(names) > 1 else "text parts"

    def check(self, generation: Generation, route: str) -> None:
        """A RequestError for a chat or completion this bundle cannot take: any on a speech
        bundle, audio on a bundle without a speech graph, more than one clip, images on a
        bundle without a vision graph, an image og cannot decode safely (its URL not fetched
        yet: `image_urls.fetched` first)."""
        if self.transcribes:
            raise RequestError(
                f"{route}: {self.inputs()}; accepted: POST /v1/audio/transcriptions with the "
                "audio file"
            )
        clips = generation.clips
        if clips and self.placeholder is None:
            raise RequestError(
                f"{clips[0].where}: {self.inputs()}, no audio; accepted: {self.parts()}",
                param=clips[0].where,
            )
        if len(clips) > 1:
            raise RequestError(
                f"{clips[1].where}: a request takes one clip (onnxruntime-genai 0.18 takes one "
                "per prompt); accepted: one input_audio part",
                param=clips[1].where,
            )
        for image in generation.images:
            _check_image(image, self)
        pixels = sum(image_pixels(image.data) for image in generation.images)
        if pixels > MAX_PIXELS:
            where = generation.images[-1].where
            raise RequestError(
                f"{where}: the request's images hold {pixels:,} pixels together, over the "
                f"{MAX_PIXELS:,} accepted in one request; accepted: fewer or smaller images",
                param=where,
            )

    def check_transcription(self, transcription: Transcription, route: str) -> None:
        """A RequestError unless the bundle transcribes, and translates for a translation, in
        the language asked for (a token of its tokenizer)."""
        if not self.transcribes:
            also = "; a clip goes in a chat message's input_audio part" if self.placeholder else ""
            raise RequestError(
                f"{route}: {self.inputs()}{also}; accepted: a speech bundle (Whisper) served"
            )
        vocab_size = self.config["model"]["vocab_size"]
        if transcription.task == "translate" and vocab_size < MULTILINGUAL_VOCAB:
            raise RequestError(
                f"{route}: the bundle is an English-only Whisper model (vocab_size {vocab_size}, "
                "a .en checkpoint), which does not translate; accepted: a multilingual Whisper "
                "bundle, or POST /v1/audio/transcriptions"
            )
        codes = language_codes(self.folder) if vocab_size >= MULTILINGUAL_VOCAB else ["en"]
        if transcription.language is not None and transcription.language not in codes:
            raise RequestError(
                f"language {transcription.language!r}: not a language of the model's "
                f"tokenizer; accepted: {', '.join(codes)}",
                param="language",
            )

    def prompt_inputs(
        self, generation: Generation, text: str, model: og.Model
    ) -> og.NamedTensors | None:
        """og's processor inputs of the rendered prompt `text` with the request's images and
        clip (None without either); a RequestError for placeholders without an image or clip
        behind them, a clip og would not read whole, images og cannot process. Runs on the
        engine thread."""
        clips, images = generation.clips, generation.images
        counts = {"images": len(images), "audios": len(clips)}
        where = ", ".join(part.where for part in (*images, *clips)) or "messages"
        try:
            require_media(self.folder, self.config, text, **counts, given_as=SERVED_MEDIA)
            if not images:
                if not clips:
                    return None
                clip = Clip(clips[0].data, clips[0].where)
                clip.seconds(PROMPT_CLIP_SECONDS)
                return audio_inputs(model, text, clip)
            media = {"images": og.Images.open_bytes(*(image.data for image in images))}
            if clips:
                clip = Clip(clips[0].data, clips[0].where)
                clip.seconds(PROMPT_CLIP_SECONDS)
                media["audios"] = clip.audios()
            return processor_inputs(model, text, where, **media)
        except OptionError as error:
            raise RequestError(str(error), param=where) from None
        except BundleError as error:  # og's processor refused the images
            raise RequestError(
                f"{error}; accepted: PNG or JPEG images that onnxruntime-genai's processor "
                "takes together in one prompt",
                param=where,
            ) from None


def _check_image(image: InputImage, media: BundleMedia) -> None:
    """A RequestError for an image the bundle takes none of, or og cannot decode safely."""
    if media.image_placeholder is None:
        raise RequestError(
            f"{image.where}: {media.inputs()}, no images; accepted: {media.parts()}",
            param=image.where,
        )
    refusal = image_refusal(image.data)
    if refusal is not None:
        raise RequestError(f"{image.where}: {refusal}", param=image.where)
