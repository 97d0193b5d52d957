"""`serve`: load a bundle on the engine thread, listen, and run the app on uvicorn until Ctrl-C.

The socket is bound here, before uvicorn starts, so an address in use is one clear line, and
``--port 0`` serves on a free port that the startup line names. uvicorn's graceful shutdown is
the drain: on Ctrl-C (or SIGTERM) it stops accepting, lets the requests in flight finish (a
second Ctrl-C cuts them), and returns; then the engine thread is stopped.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from mobius_genai.bundle.bos import required_bos
from mobius_genai.bundle.bundle_folder import require_bundle
from mobius_genai.bundle.og_support import engine_support
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.errors import BundleError, OptionError
from mobius_genai.runtime.generate import chat_template
from mobius_genai.runtime.opening import ON_CPU, open_bundle
from mobius_genai.serve.engine_loop import STATIC_BATCH, EngineLoop
from mobius_genai.serve.image_urls import ImageUrls
from mobius_genai.serve.media import BundleMedia
from mobius_genai.serve.prompt import PromptRules
from mobius_genai.serve.tools import tool_tokens

_BACKLOG = 2048  # uvicorn's default


@dataclass(frozen=True)
class Limits:
    """What one request, and all of them together, may take."""

    max_batch: int = STATIC_BATCH
    """Requests generating on the Engine at once; more wait in order."""
    batch_window: float = 0.025
    """Seconds a request waits for others to batch with when the Engine is idle."""
    max_queue: int = 64
    """Requests in progress or waiting; beyond it a request gets a 429."""
    max_tokens: int | None = None
    """The most tokens a reply may ask for (None: the bundle's context)."""
    max_body_bytes: int = 4 << 20
    allow_image_urls: bool = False
    """image_url parts may name http(s) URLs, which the server fetches (each within
    max_body_bytes)."""


def serve(
    folder: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits = Limits(),
    cpu: bool = False,
    api_key: str | None = None,
    model_id: str | None = None,
    adapters: tuple[str, ...] = (),
    quiet: bool = False,
) -> None:
    """Serve the bundle in `folder` until interrupted (the interrupt is raised again after the
    requests in flight are answered); requests naming one of `adapters` (the bundle's LoRA
    adapters, or .onnx_adapter files) as their model run with it active."""
    import uvicorn  # the [serve] extra; imported here so `--help` works without it

    from mobius_genai.serve.app import Service, create_app

    engine, media, model_id = _engine(folder, limits, cpu, model_id, adapters)
    engine.start()
    try:
        _check_names(model_id, engine.adapter_names)
        listener = _listen(host, port)
        bound_host, bound_port = listener.getsockname()[:2]
        service = Service(
            engine=engine,
            media=media,
            model_id=model_id,
            adapter_names=engine.adapter_names,
            created=int((Path(folder) / "genai_config.json").stat().st_mtime),
            max_body_bytes=limits.max_body_bytes,
            max_queue=limits.max_queue,
            api_key=api_key,
            quiet=quiet,
            image_urls=ImageUrls(limits.allow_image_urls, limits.max_body_bytes),
        )
        config = uvicorn.Config(
            create_app(service),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        _say_where(
            folder, (model_id, *engine.adapter_names), bound_host, bound_port, limits, api_key
        )
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        engine.stop()


def _engine(
    folder: str | Path, limits: Limits, cpu: bool, model_id: str | None, adapters: tuple[str, ...]
) -> tuple[EngineLoop, BundleMedia, str]:
    """The engine loop of the bundle (not started), the media it takes and the model name it
    answers to. A bundle og.Engine does not run is refused, but one that takes images or audio
    (og's multimodal pipeline or Whisper's, which og 0.18's Engine refuses: "The model type is
    not supported for decoding"): that is served with og.Generator."""
    require_bundle(folder)
    config = read_genai_config(Path(folder))
    media = BundleMedia(str(folder), config)
    refused = engine_support(folder)
    if refused is not None and not media.multimodal:
        raise BundleError(f"{folder}: {refused}; `serve` runs bundles on og.Engine")
    search = config.get("search", {})
    context = int(search.get("max_length", config["model"]["context_length"]))
    rules = PromptRules(
        template=chat_template(folder),
        bos=required_bos(folder),
        context=context,
        max_tokens=min(limits.max_tokens or context, context),
        audio_placeholder=media.placeholder,
        image_placeholder=media.image_placeholder,
    )
    engine = EngineLoop(
        str(folder),
        lambda: open_bundle(folder, command="serve", provider=ON_CPU if cpu else None),
        rules,
        tool_tokens(config),
        media=media,
        engine=refused is None,
        sampled=bool(search.get("do_sample", False)),
        max_batch=limits.max_batch,
        batch_window=limits.batch_window,
        adapters=adapters,
    )
    return engine, media, model_id or Path(folder).resolve().name


def _check_names(model_id: str, adapter_names: tuple[str, ...]) -> None:
    """Every model a request may name is one thing: no adapter under the base's name."""
    if model_id in adapter_names:
        raise OptionError(
            f"--adapter {model_id!r} has the name the base model is served under; accepted: "
            "another --model-name, or an adapter file named otherwise"
        )


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port; an OptionError when it cannot be."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(_BACKLOG)  # connections wait from now on, while uvicorn starts
    except OSError as error:
        raise OptionError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); "
            "accepted: a local address and a free port (--port 0 picks one)"
        ) from None
    return listener


def _say_where(
    folder: str | Path,
    names: tuple[str, ...],
    host: str,
    port: int,
    limits: Limits,
    api_key: str | None,
) -> None:
    """The startup line (always: it names the port), and the warnings that go with it."""
    shown = f"[{host}]" if ":" in host else host
    served = " and ".join(repr(name) for name in names)
    print(
        f"mobius-genai: serving {folder} as {served} at http://{shown}:{port}/v1 "
        "(OpenAI API; Ctrl-C stops after the requests in flight)",
        file=sys.stderr,
        flush=True,
    )
    if not _loopback(host):
        guard = "requests need the API key" if api_key else "anyone who reaches it can use it"
        print(
            f"mobius-genai: warning: listening on {host}, reachable from other machines; "
            f"{guard} (--host 127.0.0.1 keeps it local)",
            file=sys.stderr,
        )
    if limits.max_batch > STATIC_BATCH:
        print(
            f"mobius-genai: note: onnxruntime-genai 0.18 batches at most {STATIC_BATCH} requests "
            f"at once on this bundle (static batching); --max-batch {limits.max_batch} lets "
            f"{limits.max_batch} in, {STATIC_BATCH} at a time",
            file=sys.stderr,
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
