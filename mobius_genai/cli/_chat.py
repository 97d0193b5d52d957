"""`mobius-genai chat DIR`: talk with a bundle, replies streamed as they are generated.

Each line read is a user message; the reply is generated from the whole conversation (the
bundle's chat template), the oldest turns dropped when the context would not hold the next
reply (said on stderr). End-of-file (Ctrl-D) or `/exit` ends the chat with exit code 0;
Ctrl-C ends it like any command (one line, exit code 130).
"""

from __future__ import annotations

import argparse
import sys

from mobius_genai.bundle.chat import Conversation
from mobius_genai.cli._generation import (
    Speed,
    add_ep_argument,
    add_sampling_arguments,
    on_cpu,
    search_options,
)
from mobius_genai.errors import MobiusError

_EXIT = "/exit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `chat`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument("--system", help="a system message in front of the conversation")
    add_sampling_arguments(parser, max_new_tokens=256)
    add_ep_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Read messages from stdin until it ends or says /exit; print each reply as it comes."""
    options = search_options(args)
    cpu = on_cpu(args)
    conversation = Conversation(
        args.folder,
        cpu=cpu,
        system=args.system,
        max_new_tokens=args.max_new_tokens,
        search_options=options,
        note=lambda text: print(f"mobius-genai: {text}", file=sys.stderr),
    )
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"Chat with {args.folder}; {_EXIT} or Ctrl-D ends it.", file=sys.stderr)
    while True:
        try:
            message = input("> " if interactive else "")
        except EOFError:
            break
        if message.strip() == _EXIT:
            break
        if not message.strip():
            continue
        speed = Speed()
        try:
            for piece in speed.timed(conversation.reply(message)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except MobiusError as error:  # this message fails; the conversation goes on
            print(f"mobius-genai: error: {error}", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        speed.report(args.quiet)
    if interactive:
        sys.stdout.write("\n")
    return 0
