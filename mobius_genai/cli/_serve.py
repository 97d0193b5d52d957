"""`mobius-genai serve DIR`: an OpenAI-compatible HTTP server over the bundle (the [serve] extra).

Listens on 127.0.0.1 unless --host says otherwise; prints one line per request (--quiet: none);
Ctrl-C (or SIGTERM) stops accepting, lets the requests in flight finish, and exits with 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from mobius_genai.cli import _Terminated
from mobius_genai.cli._args import positive_int
from mobius_genai.cli._generation import add_ep_argument, on_cpu
from mobius_genai.errors import OptionError
from mobius_genai.progress import stderr_line

#: The [serve] extra's modules (python-multipart: Starlette's form parser, for transcriptions).
_SERVE_MODULES = ("uvicorn", "starlette", "python_multipart")
#: Read when --api-key is not given, so the key stays out of the process list.
API_KEY_VARIABLE = "MOBIUS_GENAI_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `serve`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    parser.add_argument(
        "--port", type=_port, default=8000, help="port to listen on (default 8000; 0: any free one)"
    )
    parser.add_argument(
        "--max-batch",
        type=positive_int,
        default=4,
        help="requests generating at once, batched by onnxruntime-genai's Engine (default 4)",
    )
    parser.add_argument(
        "--batch-window-ms",
        type=_milliseconds,
        default=25,
        help="when nothing runs, how long a request waits for others to share its batch "
        "(onnxruntime-genai's static batches take no one in once they run; default 25)",
    )
    parser.add_argument(
        "--max-queue",
        type=positive_int,
        default=64,
        help="requests in progress or waiting; more get HTTP 429 (default 64)",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        help="the most tokens one reply may ask for (default: the bundle's context length)",
    )
    parser.add_argument(
        "--max-body-mib",
        type=positive_int,
        default=4,
        help="largest request body in MiB; larger ones get HTTP 413 (default 4)",
    )
    parser.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch the http(s) URLs of image_url parts (default: images only as data: URLs; "
        "the server then reaches whatever this machine reaches)",
    )
    parser.add_argument(
        "--api-key",
        help=f"require `Authorization: Bearer KEY` on /v1 (default: ${API_KEY_VARIABLE} if set, "
        "else no key)",
    )
    parser.add_argument("--model-name", help="the model id clients use (default: the folder name)")
    parser.add_argument(
        "--adapter",
        metavar="NAME",
        action="append",
        default=[],
        help="also serve the bundle's LoRA adapter NAME (adapters/NAME.onnx_adapter) or an "
        ".onnx_adapter file, as model NAME (the file's stem) beside the base (repeatable)",
    )
    add_ep_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no line per request on stderr")


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM, then return 0 once the requests in flight are answered."""
    if any(importlib.util.find_spec(name) is None for name in _SERVE_MODULES):
        raise OptionError(
            "serve needs the [serve] extra (Starlette, uvicorn and python-multipart); accepted: "
            "pip install 'mobius-genai[serve]'"
        )
    from mobius_genai.serve.server import Limits, serve

    limits = Limits(
        max_batch=args.max_batch,
        batch_window=args.batch_window_ms / 1000,
        max_queue=args.max_queue,
        max_tokens=args.max_tokens,
        max_body_bytes=args.max_body_mib << 20,
        allow_image_urls=args.allow_image_urls,
    )
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    try:
        serve(
            args.folder,
            host=args.host,
            port=args.port,
            limits=limits,
            cpu=on_cpu(args),
            api_key=api_key,
            model_id=args.model_name,
            adapters=tuple(args.adapter),
            quiet=args.quiet,
        )
    except (KeyboardInterrupt, _Terminated):  # raised again by uvicorn after the drain
        stderr_line("mobius-genai: stopped")
    return 0


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return int(text)


def _milliseconds(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number of milliseconds, got {text!r}")
    return int(text)
