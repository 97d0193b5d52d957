"""The HTTP side: Starlette routes in OpenAI's shapes over the engine loop.

Every refusal is an OpenAI-shaped error (4xx with a message naming what was wrong); an error
the server did not expect is a 500 for that request only. Bodies are read up to a size limit,
requests beyond the queue limit get a 429, and an API key, when set, is compared in constant
time. A request whose client disconnects is cancelled in the engine: a stream when Starlette
stops it, a non-streamed request by watching the connection while it waits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mobius_genai.serve.engine_loop import EngineLoop, Failed, Finished, Job
from mobius_genai.serve.image_urls import ImageUrls, fetched
from mobius_genai.serve.media import BundleMedia
from mobius_genai.serve.output import Delta
from mobius_genai.serve.protocol import (
    Generation,
    RequestError,
    Transcription,
    chat_request,
    completion_request,
    parse_body,
    transcription_request,
)
from mobius_genai.serve.responses import Reply, error_body, usage
from mobius_genai.serve.transcripts import MEDIA_TYPES, transcript_body

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = "data: [DONE]\n\n"
#: The status logged for a request whose client left (nginx's "client closed request").
_CLIENT_GONE = 499
_STOPPED = RequestError("the server stopped generating this reply", status=500, kind="server_error")


@dataclass
class Service:
    """What the routes share: the engine loop, the model's name and the limits."""

    engine: EngineLoop
    media: BundleMedia
    """Which media the bundle takes: images and clips in chat messages, or files to
    transcribe."""
    model_id: str
    adapter_names: tuple[str, ...]
    """The LoRA adapters served beside the base, each asked for as a model of its own."""
    created: int
    max_body_bytes: int
    max_queue: int
    api_key: str | None = None
    quiet: bool = False
    image_urls: ImageUrls = field(default_factory=ImageUrls)
    """Whether image_url parts may name http(s) URLs, which the server then fetches."""
    active: int = field(default=0, init=False)
    """Requests admitted and not yet answered (generating or waiting)."""
    abandoned: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    """Tasks waiting for the engine to stop the jobs of clients that left."""

    def log(self, line: str) -> None:
        """One line on stderr per request, unless quiet."""
        if not self.quiet:
            print(f"mobius-genai: {line}", file=sys.stderr, flush=True)


def create_app(service: Service) -> Starlette:
    """The ASGI app serving `service`."""

    async def health(request: Request) -> Response:
        engine = service.engine
        body = {
            "status": "ok" if engine.failure is None else "failed",
            "model": service.model_id,
            "requests": {"running": engine.running, "waiting": engine.waiting},
        }
        if engine.failure is not None:
            body["error"] = engine.failure
        return JSONResponse(body, status_code=200 if engine.failure is None else 503)

    async def models(request: Request) -> Response:
        _authorize(request, service)
        names = (service.model_id, *service.adapter_names)
        return JSONResponse({"object": "list", "data": [_model_card(service, n) for n in names]})

    async def model(request: Request) -> Response:
        _authorize(request, service)
        name = request.path_params["name"]
        _require_model(name, service)
        return JSONResponse(_model_card(service, name))

    async def chat(request: Request) -> Response:
        return await _generate(request, service, chat_request, chat=True)

    async def completions(request: Request) -> Response:
        return await _generate(request, service, completion_request, chat=False)

    async def transcriptions(request: Request) -> Response:
        return await _transcribe(request, service, "transcribe")

    async def translations(request: Request) -> Response:
        return await _transcribe(request, service, "translate")

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/models/{name:path}", model),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
        Route("/v1/audio/translations", translations, methods=["POST"]),
    ]

    async def refused(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestError)
        service.log(f"{request.url.path}: {error.status} {error.message}")
        return JSONResponse(error_body(error), status_code=error.status)

    handlers = {RequestError: refused, HTTPException: _http_error, Exception: _unexpected}
    return Starlette(routes=routes, exception_handlers=handlers)


async def _generate(
    request: Request,
    service: Service,
    parse: Callable[[dict[str, Any]], Generation],
    chat: bool,
) -> Response:
    _authorize(request, service)
    generation = parse(parse_body(await _body(request, service.max_body_bytes)))
    _require_model(generation.model, service)
    generation = await fetched(generation, service.image_urls)
    service.media.check(generation, request.url.path)
    reply = Reply(generation.model or service.model_id, chat)

    def whole(text: str, calls: list[Any], event: Finished, record: _Record) -> Response:
        counts = usage(record.prompt_tokens, event.completion_tokens)
        return JSONResponse(reply.whole(text, calls, event.reason, counts))

    def stream(job: Job, record: _Record) -> AsyncIterator[str]:
        return _stream(job, reply, record, generation.include_usage)

    return await _answer(request, service, generation, whole, stream if generation.stream else None)


async def _transcribe(request: Request, service: Service, task: str) -> Response:
    """A transcription (task transcribe) or translation form answered in its format."""
    _authorize(request, service)
    transcription = await _transcription(request, service.max_body_bytes, task)
    _require_model(transcription.model, service)
    service.media.check_transcription(transcription, request.url.path)

    def whole(text: str, calls: list[Any], event: Finished, record: _Record) -> Response:
        response_format = transcription.response_format
        body = transcript_body(event.transcript, response_format)
        if isinstance(body, dict):
            return JSONResponse(body)
        return Response(body, media_type=MEDIA_TYPES[response_format])

    return await _answer(request, service, transcription, whole)


_Whole = Callable[[str, list[Any], Finished, "_Record"], Response]


async def _answer(
    request: Request,
    service: Service,
    work: Generation | Transcription,
    whole: _Whole,
    stream: Callable[[Job, _Record], AsyncIterator[str]] | None = None,
) -> Response:
    """`work` queued on the engine, answered whole (`whole` of the text, the tool calls and the
    end) or as server-sent events (`stream`)."""
    if service.active >= service.max_queue:
        raise RequestError(
            f"the server is busy: {service.active} requests are in progress or waiting (its "
            "--max-queue); accepted: the same request again later",
            status=429,
            code="queue_full",
            kind="server_busy",
        )
    job = Job(work, asyncio.get_running_loop())
    record = _Record(service, job, request.url.path)
    service.engine.submit(job)
    handed_over = False
    try:
        started = await _next_event(job, request)
        if isinstance(started, Failed):
            record.close()
            raise started.error
        record.prompt_tokens = started.prompt_tokens
        if stream is not None:
            # Starlette runs the background task after the stream, also when the client left
            # before the stream began (and its generator never ran)
            done = BackgroundTask(record.leave)
            handed_over = True
            return StreamingResponse(
                stream(job, record),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
                background=done,
            )
        return await _whole(job, request, record, whole)
    except _ClientGone:
        return Response(status_code=_CLIENT_GONE)
    finally:
        if not handed_over:
            await record.leave()  # nothing to do once answered; else the client left or it failed


async def _whole(job: Job, request: Request, record: _Record, whole: _Whole) -> Response:
    text: list[str] = []
    calls = []
    while True:
        event = await _next_event(job, request)
        if isinstance(event, Delta):
            record.token()
            text.append(event.text)
            calls.extend(event.tool_calls)
        elif isinstance(event, Failed):
            record.close()
            raise event.error
        elif isinstance(event, Finished):
            record.close(event)
            if event.reason is None:
                raise _STOPPED
            return whole("".join(text), calls, event, record)


async def _stream(
    job: Job, reply: Reply, record: _Record, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events of the reply, ending in [DONE]; stopped by Starlette when the client
    disconnects, which cancels the job. The events ready together go out in one write."""
    try:
        opening = reply.opening()
        if opening is not None:
            yield _event(opening)
        sent = _Sent(reply, record, include_usage)
        while not sent.done:
            ready = [await job.events.get()]
            while not job.events.empty():
                ready.append(job.events.get_nowait())
            yield "".join(sent.event(event) for event in ready)
    finally:
        await record.leave()


class _Sent:
    """The server-sent events of one stream's engine events, in order."""

    def __init__(self, reply: Reply, record: _Record, include_usage: bool) -> None:
        self.reply = reply
        self.record = record
        self.include_usage = include_usage
        self.calls = 0
        self.done = False

    def event(self, event: Delta | Finished | Failed) -> str:
        if self.done:
            return ""
        if isinstance(event, Delta):
            self.record.token()
            text = _event(self.reply.delta(event, self.calls))
            self.calls += len(event.tool_calls)
            return text
        self.done = True
        self.record.close(event if isinstance(event, Finished) else None)
        if isinstance(event, Failed) or event.reason is None:
            error = event.error if isinstance(event, Failed) else _STOPPED
            return _event(error_body(error)) + _DONE
        text = _event(self.reply.closing(event.reason))
        if self.include_usage:
            counts = usage(self.record.prompt_tokens, event.completion_tokens)
            text += _event(self.reply.usage_chunk(counts))
        return text + _DONE


class _Record:
    """One request's place among the `active` ones, its timing and its log line."""

    def __init__(self, service: Service, job: Job, path: str) -> None:
        self.service = service
        self.job = job
        self.path = path
        self.start = time.perf_counter()
        self.first: float | None = None
        self.prompt_tokens = 0
        self.open = True
        self._leaving = False
        service.active += 1

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def close(self, finished: Finished | None = None) -> None:
        """Free the request's place; log the reply when there is one (`finished`)."""
        if not self.open:
            return
        self.open = False
        self.service.active -= 1
        if finished is None or finished.reason is None:
            return
        seconds = time.perf_counter() - self.start
        tokens = finished.completion_tokens
        ttft = (self.first or time.perf_counter()) - self.start
        decode = seconds - ttft
        rate = f"{(tokens - 1) / decode:.1f} tokens/s" if tokens > 1 and decode > 0 else "n/a"
        self.service.log(
            f"{self.path}: {self.prompt_tokens} prompt + {tokens} tokens in {seconds:.2f} s "
            f"(first token {ttft:.2f} s, {rate}), {finished.reason}"
        )

    async def leave(self) -> None:
        """If the request is still open, its client left: cancel the job (once); its place is
        freed once the engine has stopped it."""
        if not self.open or self._leaving:
            return
        self._leaving = True
        self.service.engine.cancel(self.job)
        task = asyncio.get_running_loop().create_task(self._stopped())
        self.service.abandoned.add(task)
        task.add_done_callback(self.service.abandoned.discard)

    async def _stopped(self) -> None:
        while not isinstance(event := await self.job.events.get(), (Finished, Failed)):
            pass
        self.close()
        seconds = time.perf_counter() - self.start
        if isinstance(event, Finished) and event.reason is None:
            outcome = f"cancelled after {event.completion_tokens} tokens"
        elif isinstance(event, Finished):  # the engine finished first
            outcome = f"its reply had ended ({event.completion_tokens} tokens, {event.reason})"
        else:
            outcome = f"its request failed: {event.error.message}"
        self.service.log(f"{self.path}: the client left after {seconds:.2f} s; {outcome}")


async def _next_event(job: Job, request: Request) -> Any:
    """The job's next event; _ClientGone if the client disconnects first."""
    getting = asyncio.ensure_future(job.events.get())
    watching = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({getting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not getting.done():
            getting.cancel()
    if not getting.done() or getting.cancelled():
        raise _ClientGone
    return getting.result()


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 past `limit` bytes (before reading it all)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _transcription(request: Request, limit: int, task: str) -> Transcription:
    """The transcription a multipart/form-data body asks for (its `file` and text fields; a
    field sent more than once, as `timestamp_granularities[]`, as the list of its values)."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise RequestError(
            f"the request body is {kind or 'of no content type'}; accepted: multipart/form-data "
            "with the audio file as `file` and the fields model, language, response_format, "
            "prompt, temperature"
        )
    body = await _body(request, limit)

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    try:
        form = await MultiPartParser(request.headers, chunks(), max_files=1, max_fields=16).parse()
    except MultiPartException as error:
        raise RequestError(f"the form cannot be read: {error.message}") from None
    fields, audio = {}, None
    for name, value in form.multi_items():
        if isinstance(value, UploadFile) and name == "file":
            audio = await value.read()
        elif isinstance(value, UploadFile) or name == "file":
            raise RequestError(
                f"{name}: a form part of the wrong kind; accepted: the audio as the one file "
                "part `file`, text for the other fields",
                param=name,
            )
        elif name in fields:
            given = fields[name]
            fields[name] = [*(given if isinstance(given, list) else [given]), value]
        else:
            fields[name] = value
    return transcription_request(fields, audio, task)


def _too_large(size: int, limit: int) -> RequestError:
    return RequestError(
        f"the request body has {size} bytes or more; accepted: at most {limit} (the server's "
        "--max-body-mib)",
        status=413,
        code="request_too_large",
    )


def _authorize(request: Request, service: Service) -> None:
    if service.api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    expected = service.api_key.encode()
    if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)):
        raise RequestError(
            "a valid API key is required: an Authorization: Bearer <key> header",
            status=401,
            code="invalid_api_key",
        )


def _require_model(name: str | None, service: Service) -> None:
    accepted = (service.model_id, *service.adapter_names)
    if name is not None and name not in accepted:
        raise RequestError(
            f"The model {name!r} does not exist; accepted: {', '.join(map(repr, accepted))}",
            status=404,
            param="model",
            code="model_not_found",
        )


def _model_card(service: Service, name: str) -> dict[str, Any]:
    card = {"id": name, "object": "model", "created": service.created, "owned_by": "mobius-genai"}
    if name != service.model_id:
        card["parent"] = service.model_id  # an adapter of the base model
    return card


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    kind = "invalid_request_error" if error.status_code < 500 else "server_error"
    what = f"{request.method} {request.url.path}: {error.detail}"
    return JSONResponse(
        error_body(RequestError(what, status=error.status_code, kind=kind)),
        status_code=error.status_code,
    )


async def _unexpected(request: Request, error: Exception) -> Response:
    message = f"the server failed on this request: {type(error).__name__}: {error}"
    return JSONResponse(
        error_body(RequestError(message, status=500, kind="server_error")), status_code=500
    )
