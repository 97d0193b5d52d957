"""The tokens of one turn after another, for `run` and `chat`: onnxruntime-genai's Engine
(requests and turns, the API 0.18 serves with) wherever it runs the bundle, og.Generator where
it does not.

Where og's Engine does not run the bundle (`og_support.engine_support`: a pruned LM head, a
model type it refuses such as lfm2, an older bundle's concatenated KV cache), the Generator runs it, said
once in one line. Prompts with images go through the Generator too (a turn takes token ids
only).

A conversation keeps one Engine request: a turn whose prompt starts with every token the
request holds (the earlier prompts and replies) feeds only the rest, so the conversation's
cache is reused; any other prompt starts a new request. A turn stopped midway (Ctrl-C) is
cancelled with og's `cancel_turn`, and its request closed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai._signals import signals_held, threads_leave_signals_to_main
from mobius_genai.bundle._og_errors import og_error_line
from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.bundle.og_support import engine_support
from mobius_genai.errors import BundleError
from mobius_genai.runtime.audio import Clip, audio_prompt
from mobius_genai.runtime.generate import (
    chat_template,
    image_placeholder,
    load_tokenizer,
    open_images,
    processor_inputs,
)
from mobius_genai.runtime.mtp import MtpStats, mtp_tokens
from mobius_genai.runtime.opening import OpenBundle
from mobius_genai.runtime.placeholders import require_media

#: Why a turn ended, from the Engine's finish reason: "eos" (the model ended it), "length"
#: (max new tokens), "context" (the request's tokens filled the context), "stopped" (cancelled).
_FINISHES = {
    og.FinishReason.EOS: "eos",
    og.FinishReason.STOP_STRING: "eos",
    og.FinishReason.MAX_GENERATED_TOKENS: "length",
    og.FinishReason.MAX_SESSION_TOKENS: "context",
    og.FinishReason.CANCELLED: "stopped",
}
#: A turn's guidance: its kind (og's: "json_schema", "regex", "lark_grammar") and its text.
Guidance = tuple[str, str]
_TOKEN = int(og.EngineEventFlags.TOKEN)
_ENDED = int(og.EngineEventFlags.TURN_FINISHED) | int(og.EngineEventFlags.FAILED)
_EVENTS = 16


class Decoder:
    """Generates the turns of one conversation with `bundle`'s model; `note` hears, once, why
    the Engine does not run the bundle when og refuses it; `engine=False` keeps to og.Generator
    (prompts with images)."""

    def __init__(
        self,
        bundle: OpenBundle,
        note: Callable[[str], None] = lambda text: None,
        *,
        engine: bool = True,
    ) -> None:
        self.bundle = bundle
        self.finish: str | None = None
        """Why the latest turn ended ("eos", "length", "context", "stopped"), None before."""
        self.fed = 0
        """The prompt tokens the latest turn fed (fewer than its prompt when a request is
        reused)."""
        # og 0.18's Engine has no adapters: a LoRA adapter runs on og.Generator; an MTP head
        # runs on og.MtpGenerator (runtime/mtp.py)
        engine = engine and bundle.adapter is None and bundle.mtp is None
        self.mtp_stats = MtpStats()
        """What the MTP head did in the latest turn (drafts proposed, evaluated, accepted)."""
        self.engine: og.Engine | None = _engine(bundle, note) if engine else None
        self._request: og.Request | None = None
        self._held: list[int] = []
        self._guidance: Guidance | None = None

    def tokens(
        self,
        prompt: Sequence[int] | og.NamedTensors,
        *,
        max_new_tokens: int,
        max_length: int,
        guidance: Guidance | None = None,
    ) -> Iterator[int]:
        """The tokens generated after `prompt` (token ids, or a multimodal processor's inputs),
        as they come: at most `max_new_tokens`, and `max_length` tokens in all; sampled as the
        bundle's search settings (overridden when it was opened) say, within `guidance`."""
        self._guidance = guidance
        images = isinstance(prompt, og.NamedTensors)
        if self.bundle.mtp is not None and not images and guidance is None:
            return self._mtp_tokens(list(prompt), max_new_tokens, max_length)
        if self.engine is None or images:
            return self._generator_tokens(prompt, max_new_tokens, max_length)
        return self._engine_tokens(list(prompt), max_new_tokens, max_length)

    def reset(self) -> None:
        """Forget the conversation: the next turn starts a new request."""
        if self._request is not None:
            self._request.close()
        self._request, self._held = None, []

    def _engine_tokens(
        self, prompt: list[int], max_new_tokens: int, max_length: int
    ) -> Iterator[int]:
        held = len(self._held)
        if self._request is None or not (len(prompt) > held and prompt[:held] == self._held):
            self.reset()
            request_options = og.RequestOptions()
            request_options.set_max_session_tokens(max_length)
            self._request = self.engine.create_request(options=request_options)
            held = 0
        request, self.finish, self.fed = self._request, None, len(prompt) - held
        try:
            turn_options = og.TurnOptions(request)
            turn_options.set_max_generated_tokens(max_new_tokens)
            if self._guidance is not None:
                turn_options.set_guidance(*self._guidance)
            turn = request.begin_turn(np.asarray(prompt[held:], np.int32), turn_options)
        except RuntimeError as error:
            self.reset()
            raise self._refused(error) from error
        generated: list[int] = []
        try:
            yield from self._events(turn, generated)
        finally:
            if self.finish is not None:
                self._held = prompt + generated
            elif self._request is request:  # stopped midway: Ctrl-C, or the stream was closed
                with signals_held():
                    self._cancel(turn)

    def _events(self, turn: int, generated: list[int]) -> Iterator[int]:
        buffer = self.engine.create_event_buffer(_EVENTS)
        while self.finish is None:
            for event in self._run(buffer):
                flags = int(event.flags)
                if flags & _ENDED and event.turn_id == turn:  # first: a turn's last token ends it
                    self._ended(event)
                if flags & _TOKEN:
                    generated.append(int(event.token))
                    yield generated[-1]

    def _run(self, buffer: og.EngineEventBuffer) -> list[og.EngineEvent]:
        try:
            return list(self.engine.run(buffer))
        except RuntimeError as error:  # a failed step; the Engine is no longer healthy
            self._drop_engine()
            raise self._failure(error) from error

    def _ended(self, event: og.EngineEvent) -> None:
        if event.finish_reason in _FINISHES:
            self.finish = _FINISHES[event.finish_reason]
            return
        try:  # og says why on the Engine's next call
            self.engine.run(self.engine.create_event_buffer(1))
            cause = RuntimeError(f"the Engine failed the turn ({event.error_code.name})")
        except RuntimeError as error:
            cause = error
        self._drop_engine()
        raise self._failure(cause) from cause

    def _cancel(self, turn: int) -> None:
        """Cancel `turn` and run the Engine until it says the turn ended; close the request."""
        self._request.cancel_turn(turn)
        buffer = self.engine.create_event_buffer(_EVENTS)
        while self.engine.has_pending_requests():
            self.engine.run(buffer)
        self.reset()
        self.finish = "stopped"

    def _refused(self, error: RuntimeError) -> BundleError:
        """og's refusal of a request or its guidance: the input is the problem."""
        return BundleError(f"{self.bundle.folder}: the request was refused: {og_error_line(error)}")

    def _failure(self, error: BaseException) -> BundleError:
        """og's failure while generating: of a guided turn, the guidance; else the bundle."""
        if self._guidance is None:
            return self.bundle.failure("generate", error)
        return BundleError(
            f"{self.bundle.folder}: the reply guided by {self._guidance[0]} stopped: "
            f"{og_error_line(error)}"
        )

    def _drop_engine(self) -> None:
        """After a failure the Engine refuses every call: the next turn gets a new one."""
        self._request, self._held = None, []
        with threads_leave_signals_to_main():
            self.engine = og.Engine(self.bundle.model)

    def _mtp_tokens(self, prompt: list[int], max_new_tokens: int, max_length: int) -> Iterator[int]:
        self.finish, self.fed, self.mtp_stats = None, len(prompt), MtpStats()
        limit = min(len(prompt) + max_new_tokens, max_length)
        tokens = mtp_tokens(self.bundle.model, self.bundle.mtp, prompt, limit, self.mtp_stats)
        return self._watched(tokens, max_new_tokens)

    def _watched(self, tokens: Iterator[int], max_new_tokens: int) -> Iterator[int]:
        """`tokens` as they come; og's failure as one line, and why the turn ended."""
        last, count = None, 0
        try:
            for last in tokens:
                count += 1
                yield last
        except RuntimeError as error:
            raise self._failure(error) from error
        except BaseException:  # stopped midway: Ctrl-C, or the stream was closed
            self.finish = "stopped"
            raise
        if last in _eos_token_ids(self.bundle.config):
            self.finish = "eos"
        else:
            self.finish = "length" if count >= max_new_tokens else "context"

    def _generator_tokens(
        self,
        prompt: Sequence[int] | og.NamedTensors,
        max_new_tokens: int,
        max_length: int,
    ) -> Iterator[int]:
        images = isinstance(prompt, og.NamedTensors)
        length = prompt["input_ids"].as_numpy().size if images else len(prompt)
        self.finish, self.fed = None, length
        try:
            params = og.GeneratorParams(self.bundle.model)
            params.set_search_options(max_length=min(length + max_new_tokens, max_length))
            if self._guidance is not None:
                params.set_guidance(*self._guidance)
            generator = og.Generator(self.bundle.model, params)
            if self.bundle.adapter is not None:
                self.bundle.adapter.activate(generator)
        except RuntimeError as error:
            raise self._refused(error) from error
        yield from self._watched(_generated(generator, prompt), max_new_tokens)


def _generated(generator: og.Generator, prompt: Sequence[int] | og.NamedTensors) -> Iterator[int]:
    """og.Generator's tokens after `prompt` (token ids, or a multimodal processor's inputs)."""
    if isinstance(prompt, og.NamedTensors):
        generator.set_inputs(prompt)
    else:
        generator.append_tokens(list(prompt))
    while not generator.is_done():
        generator.generate_next_token()
        yield int(generator.get_next_tokens()[0])


def _eos_token_ids(config: Mapping[str, Any]) -> set[int]:
    """The token ids that end generation (genai_config's model.eos_token_id: one or a list)."""
    ids = config["model"].get("eos_token_id", [])
    return {ids} if isinstance(ids, int) else set(ids)


def _engine(bundle: OpenBundle, note: Callable[[str], None]) -> og.Engine | None:
    """og.Engine of the bundle's model; None, said to `note` in one line, where og's Engine
    does not run the bundle (`og_support.engine_support`: a pruned LM head, a model type it
    refuses, an older bundle's concatenated cache) or refuses to start."""
    refusal = engine_support(bundle.folder)
    if refusal is None:
        try:
            with threads_leave_signals_to_main():
                return og.Engine(bundle.model)
        except RuntimeError as error:
            refusal = f"og.Engine does not run this bundle: {og_error_line(error)}"
    note(f"{refusal}; generating with og.Generator")
    return None


def stream_text(
    bundle: OpenBundle,
    prompt: str,
    *,
    max_new_tokens: int,
    max_length: int,
    use_chat_template: bool = True,
    images: Sequence[str | Path] = (),
    audio: Clip | None = None,
    guidance: Guidance | None = None,
    note: Callable[[str], None] = lambda text: None,
) -> Iterator[str]:
    """Text pieces generated for `prompt` (sampled as the bundle's search settings say,
    overridden when it was opened).

    With `images` (files), the prompt goes through the multimodal processor with them; it gets
    the model type's image placeholder in front for each image it does not place itself. With
    an `audio` clip (a bundle with a speech graph), likewise with the clip's placeholder.
    `guidance` constrains the reply (a JSON schema, a regular expression, a Lark grammar). A
    prompt placing more images or clips than the files given is an OptionError.
    """
    folder, text = bundle.folder, prompt
    require_media(folder, bundle.config, text, images=len(images), audios=int(audio is not None))
    if images:
        placeholder = image_placeholder(folder, bundle.config)
        text = " ".join([placeholder] * (len(images) - text.count(placeholder)) + [text])
        pictures = open_images(images)
    media = {"images": pictures} if images else {}
    if audio is not None:
        text, media["audios"] = audio_prompt(folder, bundle.config, text, audio)
    template = chat_template(folder)  # checked before og's tokenizer here parses it
    tokenizer = load_tokenizer(bundle.model, folder)
    template = template if use_chat_template else None
    try:
        if template is not None:
            messages = json.dumps([{"role": "user", "content": text}])
            text = tokenizer.apply_chat_template(
                messages, template_str=template, add_generation_prompt=True
            )
        if media:
            named = [*map(str, images), *([] if audio is None else [audio.name])]
            sources = ", ".join(named)
            inputs = processor_inputs(bundle.model, text, sources, **media)
        else:
            inputs = with_bos(tokenizer.encode(text), required_bos(folder))
    except RuntimeError as error:  # og's error type for template and tokenizer failures
        raise BundleError(
            f"{folder}: onnxruntime-genai cannot encode the prompt: {error}"
        ) from error
    stream = tokenizer.create_stream()
    tokens = Decoder(bundle, note, engine=not media).tokens(
        inputs, max_new_tokens=max_new_tokens, max_length=max_length, guidance=guidance
    )
    with contextlib.closing(tokens):
        for token in tokens:
            yield stream.decode(token)
