"""`mobius-genai run DIR [--image PATH] --prompt TEXT`: stream generated text from a bundle."""

from __future__ import annotations

import argparse
import sys

from mobius_genai.bundle.generate import stream_text
from mobius_genai.cli._generation import Speed, add_sampling_arguments, search_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `run`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image file for a vision-language bundle (repeat for several); the prompt gets "
        "the model's image placeholder for each image it does not place itself",
    )
    parser.add_argument(
        "--raw", action="store_true", help="feed the prompt as is, without the chat template"
    )
    add_sampling_arguments(parser, max_new_tokens=128)
    parser.add_argument(
        "--ep",
        help="run on this execution provider instead of the one the bundle names (the bundle "
        "is not changed); e.g. --ep cpu runs a GPU bundle here, on the CPU provider",
    )


def run(args: argparse.Namespace) -> int:
    """Print the text as it is generated, then the speed on stderr."""
    speed = Speed()
    pieces = stream_text(
        args.folder,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        use_chat_template=not args.raw,
        images=args.image,
        search_options=search_options(args),
        ep=args.ep,
    )
    for piece in speed.timed(pieces):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    speed.report(args.quiet)
    return 0
