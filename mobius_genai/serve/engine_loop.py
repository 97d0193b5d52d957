"""The one thread that owns the bundle's onnxruntime-genai objects and runs its `og.Engine`.

Facts of onnxruntime-genai 0.18 this follows (checked against the installed wheel):

- every Engine operation (create_request, begin_turn, run, cancel) must come from the thread
  that created the Engine ("Engine operations must be called from the Engine owner thread"), so
  the app hands requests over through a thread-safe queue and gets events back through its
  asyncio loop (`Job.post`);
- concurrent turns are batched by the Engine itself; on CPU bundles it batches statically: at
  most `STATIC_BATCH` turns run together (its scheduler fixes the number: the config overlay
  ``engine.static_batching.max_batch_size`` changes only what `get_capabilities` reports), and
  turns begun while a batch runs wait for the whole batch;
- a static Engine refuses per-turn stop strings and seeds, so stop strings are matched on the
  text (`output.Output`) and a seeded sampling request runs on an `og.Generator` of its own,
  one token per loop beside the Engine's batch, reproducible like `mobius-genai run --seed`;
- the Engine has no LoRA adapters (only `Generator.set_active_adapter`), so a request for one
  of the adapters served (`serve --adapter NAME`, asked for as model NAME) runs on an
  `og.Generator` of its own the same way, with its adapter active;
- a Request object that is garbage-collected silently drops its turn, so each is kept until its
  turn has finished, then closed;
- the Engine takes token ids only and runs plain decoders only: og 0.18 refuses a
  vision-language bundle's og.Engine ("The model type is not supported for decoding"; no
  multimodal pipeline, no Whisper: `bundle/og_support.py`). So a request with images or a clip
  runs on an `og.Generator` of its own fed the multimodal processor's inputs
  (`media.BundleMedia.prompt_inputs`, as `run --image` and `run --audio` make them), and a
  bundle that takes images or audio (vision-language bundles, Gemma 4 E2B/E4B, Whisper) is
  served with every request on a generator of its own, a token each in turn, so concurrent
  requests interleave rather than batch; a transcription is
  `runtime.transcription.transcript_steps`' generator, stepped a piece at a time the same way.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai.errors import BundleError, OptionError
from mobius_genai.runtime.adapters import ActiveAdapter, load_adapter
from mobius_genai.runtime.audio import Clip
from mobius_genai.runtime.opening import OpenBundle
from mobius_genai.runtime.transcription import (
    Steps,
    Transcript,
    TranscriptRequest,
    transcript_steps,
)
from mobius_genai.serve.media import BundleMedia
from mobius_genai.serve.output import Delta, Output
from mobius_genai.serve.prompt import PromptRules, prompt_ids, prompt_text, reply_budget
from mobius_genai.serve.protocol import Generation, RequestError, Transcription
from mobius_genai.serve.tools import ToolTokens, guidance

#: Turns og 0.18's static-batch scheduler runs at once (StaticBatchScheduler::Schedule).
STATIC_BATCH = 4
_EVENT_CAPACITY = 256
_FLAGS = og.EngineEventFlags
#: og's finish reasons as OpenAI's; None: the client is gone, nothing to send.
_FINISH = {
    og.FinishReason.EOS: "stop",
    og.FinishReason.STOP_STRING: "stop",
    og.FinishReason.MAX_GENERATED_TOKENS: "length",
    og.FinishReason.MAX_SESSION_TOKENS: "length",
    og.FinishReason.CANCELLED: None,
}


@dataclass(frozen=True)
class Started:
    """The request's turn has begun; its prompt took `prompt_tokens`."""

    prompt_tokens: int


@dataclass(frozen=True)
class Finished:
    """The reply is complete: OpenAI's `reason` (None when cancelled) and its token count; a
    transcription's `transcript`."""

    reason: str | None
    completion_tokens: int
    transcript: Transcript | None = None


@dataclass(frozen=True)
class Failed:
    """The request was refused or failed; `error` says how."""

    error: RequestError


class Job:
    """One request on its way between the app's event loop and the engine thread."""

    def __init__(
        self, generation: Generation | Transcription, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.generation = generation
        self.events: asyncio.Queue[Started | Delta | Finished | Failed] = asyncio.Queue()
        self._loop = loop

    def post(self, event: Started | Delta | Finished | Failed) -> None:
        """Hand `event` to the app (called on the engine thread)."""
        self._loop.call_soon_threadsafe(self.events.put_nowait, event)


class _Lane:
    """A job being generated: its decoding stream, its reply and its token count."""

    def __init__(self, job: Job, stream: og.TokenizerStream, output: Output) -> None:
        self.job = job
        self.stream = stream
        self.output = output
        self.tokens = 0
        self.done = False
        """The app has its Finished; later engine events only clean up."""


class _Turn(_Lane):
    """A job on the Engine: its prompt and options until it begins, then its Request."""

    def __init__(self, job: Job, stream: og.TokenizerStream, output: Output, **begin: Any) -> None:
        super().__init__(job, stream, output)
        self.begin = begin
        self.request: og.Request | None = None
        self.turn_id = 0


class _OwnGenerator(_Lane):
    """A job on an og.Generator of its own: seeded sampling, or an adapter active."""

    def __init__(self, job: Job, stream: og.TokenizerStream, output: Output, generator) -> None:
        super().__init__(job, stream, output)
        self.generator = generator


class _Transcript(_Lane):
    """A transcription: `runtime.transcription.transcript_steps`, a token per step."""

    def __init__(self, job: Job, steps: Steps) -> None:
        super().__init__(job, None, Output())
        self.steps = steps


class EngineLoop:
    """Runs a bundle's Engine on a thread of its own; `submit` and `cancel` from any thread.

    `make_bundle` opens the bundle `name` (on the engine thread; a bundle the Engine cannot run
    is a BundleError from `start`); `engine=False` serves it without og.Engine, every request on
    an og.Generator of its own; `media` says which images and audio requests may hold;
    `rules` bound every prompt;
    `sampled` is the bundle's own choice between sampling and greedy (its search.do_sample);
    `max_batch` turns run on the Engine at once, the others wait in order; an idle Engine
    waits up to `batch_window` seconds for a batch to fill before it runs the first request;
    `adapters` are the bundle's LoRA adapters (names, or .onnx_adapter files) requests may ask
    for by name instead of the base model.
    """

    def __init__(
        self,
        name: str,
        make_bundle: Callable[[], OpenBundle],
        rules: PromptRules,
        tool_tokens: ToolTokens | None,
        *,
        media: BundleMedia,
        engine: bool = True,
        sampled: bool,
        max_batch: int,
        batch_window: float = 0.0,
        adapters: tuple[str, ...] = (),
    ) -> None:
        self._name = name
        self._adapter_args = adapters
        self._adapters: dict[str, ActiveAdapter] = {}
        self._make_bundle = make_bundle
        self._media = media
        self._use_engine = engine
        self._engine: og.Engine | None = None
        self._rules = rules
        self._tool_tokens = tool_tokens
        self._sampled = sampled
        self._max_batch = max_batch
        self._batch_window = batch_window
        self._inbox: queue.SimpleQueue[tuple[str, Job | None]] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="og-engine", daemon=True)
        self._waiting: deque[_Turn] = deque()
        self._turns: dict[int, _Turn] = {}
        self._own: list[_OwnGenerator | _Transcript] = []
        self._lanes: dict[Job, _Lane] = {}
        self.failure: str | None = None
        """Why the Engine stopped working, None while it works."""

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The adapters requests may name as their model (known once started)."""
        return tuple(self._adapters)

    @property
    def running(self) -> int:
        """Jobs generating now."""
        return len(self._turns) + len(self._own)

    @property
    def waiting(self) -> int:
        """Jobs waiting for a place in the Engine's batch."""
        return len(self._waiting)

    def start(self) -> None:
        """Load the model on the engine thread; its loading error is raised here."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    def submit(self, job: Job) -> None:
        """Queue `job`; its events arrive on `job.events`."""
        self._inbox.put(("submit", job))

    def cancel(self, job: Job) -> None:
        """Stop generating for `job` (its client is gone); it gets Finished(None)."""
        self._inbox.put(("cancel", job))

    def stop(self) -> None:
        """Cancel what is left, release the Engine on its thread and end the thread."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join()

    # ---- the engine thread ------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._bundle = self._make_bundle()
            self._model = self._bundle.model
            self._tokenizer = og.Tokenizer(self._model)
            self._eos = {int(token) for token in self._tokenizer.eos_token_ids}
            for argument in self._adapter_args:
                adapter = load_adapter(Path(self._name), self._model, argument)
                self._adapters[adapter.name] = adapter
            if self._use_engine:
                self._engine = og.Engine(self._model)
                self._buffer = self._engine.create_event_buffer(_EVENT_CAPACITY)
                self._probe()
        except BaseException as error:  # raised again by start() on the caller's thread
            self._load_error = error
            self._ready.set()
            return
        self._ready.set()
        try:
            while self._take_messages():
                self._begin_turns()
                self._step()
        finally:
            for lane in list(self._lanes.values()):
                self._finish(lane, None)
            for lane in self._turns.values():
                lane.request.close()
            self._turns.clear()
            self._buffer = self._engine = None

    def _probe(self) -> None:
        """One token through the Engine before serving: a bundle it cannot run fails here, once,
        instead of failing every request (og 0.18's Engine fails on a pruned LM head; the
        bundle's og_limits say so first where its manifest has them)."""
        request = self._engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(1)
        request.begin_turn(np.asarray(self._tokenizer.encode("Hi"), np.int32), options)
        failed = None
        while self._engine.has_pending_requests():
            for event in self._engine.run(self._buffer):
                if int(event.flags) & int(_FLAGS.FAILED):
                    failed = event.error_code.name
        request.close()
        if failed is not None:
            raise BundleError(
                f"{self._name}: onnxruntime-genai's Engine cannot run this bundle ({failed}); "
                "accepted: a bundle whose graph computes every position's logits (`mobius-genai "
                "package` without --prune-lm-head)"
            )

    def _idle(self) -> bool:
        """Nothing to run until the app sends something."""
        can_begin = self._waiting and len(self._turns) < self._max_batch
        return not (self._own or can_begin or self._pending())

    def _pending(self) -> bool:
        return self._engine is not None and self._engine.has_pending_requests()

    def _take_messages(self) -> bool:
        """Handle what the app sent, waiting for it when there is nothing to run; False on stop.

        When the Engine was idle, the first request waits up to `batch_window` seconds for
        others to fill its batch: a static batch takes no one in once it runs.
        """
        idle = self.failure is None and self._idle()
        block, deadline = idle, None
        while True:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                kind, job = self._inbox.get(block=block, timeout=timeout)
            except queue.Empty:
                return True
            if kind == "stop":
                return False
            if kind == "submit":
                self._accept(job)
            elif job in self._lanes:
                self._finish(self._lanes[job], None)
            if idle and deadline is None:
                deadline = time.monotonic() + self._batch_window
            block = idle and len(self._waiting) < self._max_batch

    def _accept(self, job: Job) -> None:
        if self.failure is not None:
            job.post(Failed(RequestError(self.failure, status=503, kind="server_error")))
            return
        generation = job.generation
        try:
            if isinstance(generation, Transcription):
                lane: _Lane = self._transcript(job, generation)
            else:
                lane = self._lane(job, generation)
        except RequestError as error:
            job.post(Failed(error))
            return
        except RuntimeError as error:  # og: a grammar llguidance cannot build, and the like
            job.post(Failed(RequestError(f"the request cannot be served: {error}")))
            return
        self._lanes[job] = lane

    def _lane(self, job: Job, generation: Generation) -> _Lane:
        """The job's lane: a turn of the Engine, or a generator of its own (seeded sampling,
        an adapter, images or a clip, a bundle the Engine does not run)."""
        stream = self._tokenizer.create_stream()
        calls = generation.tools and generation.tool_choice.mode != "none"
        output = Output(generation.stop, self._tool_tokens if calls else None)
        text = prompt_text(generation, self._tokenizer, self._rules)
        inputs = self._media.prompt_inputs(generation, text, self._model)
        if inputs is None:
            ids = prompt_ids(text, self._tokenizer, self._rules)
        else:
            ids = inputs["input_ids"].as_numpy().reshape(-1).tolist()
        budget = reply_budget(generation, len(ids), self._rules)
        guide = guidance(generation, self._tool_tokens)
        adapter = self._adapters.get(generation.model or "")
        seeded = generation.sampling.seed is not None and self._samples(generation)
        if adapter is not None or seeded or inputs is not None or self._engine is None:
            prompt = ids if inputs is None else inputs
            generator = self._generator(prompt, budget, generation, guide, adapter, len(ids))
            lane = _OwnGenerator(job, stream, output, generator)
            self._own.append(lane)
            job.post(Started(len(ids)))
            return lane
        turn = _Turn(job, stream, output, ids=ids, budget=budget, guide=guide)
        self._waiting.append(turn)
        return turn

    def _transcript(self, job: Job, transcription: Transcription) -> _Transcript:
        request = TranscriptRequest(
            language=transcription.language,
            task=transcription.task,
            timestamps=transcription.timestamps,
            temperature=transcription.temperature,
            prompt=transcription.prompt,
        )
        steps = transcript_steps(self._bundle, Clip(transcription.audio, "file"), request)
        lane = _Transcript(job, steps)
        self._own.append(lane)
        job.post(Started(0))
        return lane

    def _samples(self, generation: Generation) -> bool:
        """Whether the reply is sampled: the request says, else the bundle's search settings."""
        asked = generation.sampling.do_sample
        return self._sampled if asked is None else asked

    def _generator(
        self,
        prompt: list[int] | og.NamedTensors,
        budget: int,
        generation: Generation,
        guide: tuple[str, str] | None,
        adapter: ActiveAdapter | None,
        prompt_tokens: int,
    ) -> og.Generator:
        params = og.GeneratorParams(self._model)
        sampling = generation.sampling
        options: dict[str, Any] = {"do_sample": self._samples(generation)}
        if options["do_sample"]:
            if sampling.seed is not None:
                options["random_seed"] = sampling.seed
            if sampling.temperature is not None:
                options["temperature"] = sampling.temperature
            if sampling.top_p is not None:
                options["top_p"] = sampling.top_p
        params.set_search_options(**options, max_length=prompt_tokens + budget)
        if guide is not None:
            params.set_guidance(*guide)
        generator = og.Generator(self._model, params)
        if adapter is not None:
            adapter.activate(generator)
        if isinstance(prompt, og.NamedTensors):
            generator.set_inputs(prompt)
        else:
            generator.append_tokens(prompt)
        return generator

    def _begin_turns(self) -> None:
        while self._waiting and len(self._turns) < self._max_batch:
            lane = self._waiting.popleft()
            begin = lane.begin
            request = self._engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(begin["budget"])
            _set_sampling(options, lane.job.generation)
            try:
                if begin["guide"] is not None:
                    options.set_guidance(*begin["guide"])
                lane.turn_id = request.begin_turn(np.asarray(begin["ids"], np.int32), options)
            except RuntimeError as error:  # og: a grammar llguidance cannot build, and the like
                request.close()
                self._fail(lane, RequestError(f"the request cannot be served: {error}"))
                continue
            lane.request = request
            self._turns[id(request)] = lane
            lane.job.post(Started(len(begin["ids"])))

    def _step(self) -> None:
        if self._pending():
            try:
                events = list(self._engine.run(self._buffer))
            except RuntimeError as error:  # the Engine is no longer healthy: fail everything
                self._fail_all(f"onnxruntime-genai's Engine failed: {error}")
                return
            for event in events:
                self._on_event(event)
        for lane in list(self._own):
            self._step_own(lane)

    def _on_event(self, event: og.EngineEvent) -> None:
        lane = self._turns.get(id(event.request))
        if lane is None:
            return
        flags = int(event.flags)
        if flags & int(_FLAGS.TOKEN) and event.token is not None and not lane.done:
            self._token(lane, int(event.token))
        if flags & (int(_FLAGS.TURN_FINISHED) | int(_FLAGS.FAILED)):
            del self._turns[id(event.request)]
            lane.request.close()
            if flags & int(_FLAGS.FAILED):
                unserviceable = event.error_code == og.EngineErrorCode.REQUEST_UNSERVICEABLE
                message = f"onnxruntime-genai failed the request ({event.error_code.name})"
                self._fail(lane, RequestError(message, status=400 if unserviceable else 500))
            else:
                self._finish(lane, _FINISH.get(event.finish_reason))

    def _step_own(self, lane: _OwnGenerator | _Transcript) -> None:
        if isinstance(lane, _Transcript):
            self._step_transcript(lane)
            return
        generator = lane.generator
        try:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
        except RuntimeError as error:
            self._fail(lane, RequestError(f"generation failed: {error}", status=500))
            return
        self._token(lane, token)
        if not lane.done and generator.is_done():
            self._finish(lane, "stop" if token in self._eos else "length")

    def _step_transcript(self, lane: _Transcript) -> None:
        try:
            next(lane.steps)
        except StopIteration as done:  # the transcript is whole
            if self._release(lane):
                lane.job.post(Finished("stop", lane.tokens, done.value))
            return
        except OptionError as error:  # the clip or the language: the request's to mend
            self._fail(lane, RequestError(str(error)))
            return
        except BundleError as error:
            self._fail(lane, RequestError(str(error), status=500, kind="server_error"))
            return
        except RuntimeError as error:
            message = f"onnxruntime-genai failed to transcribe the audio: {error}"
            self._fail(lane, RequestError(message, status=500, kind="server_error"))
            return
        lane.tokens += 1

    def _token(self, lane: _Lane, token: int) -> None:
        if token in self._eos:
            return
        lane.tokens += 1
        delta = lane.output.add(token, lane.stream.decode(token))
        if delta:
            lane.job.post(delta)
        if lane.output.stopped:
            self._finish(lane, "stop")

    def _release(self, lane: _Lane) -> bool:
        """Stop the lane's generation (once): False when it was already released."""
        if lane.done:
            return False
        lane.done = True
        self._lanes.pop(lane.job, None)
        if isinstance(lane, (_OwnGenerator, _Transcript)):
            self._own.remove(lane)
        elif lane.request is None:
            if lane in self._waiting:
                self._waiting.remove(lane)
        elif id(lane.request) in self._turns:  # still generating; its CANCELLED event cleans up
            lane.request.cancel_turn(lane.turn_id)
        return True

    def _finish(self, lane: _Lane, reason: str | None) -> None:
        """Tell the app the reply is complete; `reason` None: cancelled, nothing more to send."""
        if not self._release(lane):
            return
        if reason is not None:
            rest = lane.output.finish()
            if rest:
                lane.job.post(rest)
            if reason == "stop" and lane.output.tool_calls:
                reason = "tool_calls"
        lane.job.post(Finished(reason, lane.tokens))

    def _fail(self, lane: _Lane, error: RequestError) -> None:
        if self._release(lane):
            lane.job.post(Failed(error))

    def _fail_all(self, message: str) -> None:
        """The Engine cannot go on: every job fails, and later ones are refused."""
        self.failure = message
        for lane in self._lanes.values():
            lane.done = True
            lane.job.post(Failed(RequestError(message, status=500, kind="server_error")))
        self._lanes.clear()
        self._waiting.clear()
        self._turns.clear()
        self._own.clear()


def _set_sampling(options: og.TurnOptions, generation: Generation) -> None:
    sampling = generation.sampling
    if sampling.do_sample is not None:
        options.set_do_sample(sampling.do_sample)
    if sampling.temperature:
        options.set_temperature(sampling.temperature)
    if sampling.top_p is not None:
        options.set_top_p(sampling.top_p)
