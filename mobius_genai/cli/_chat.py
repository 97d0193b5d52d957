"""`mobius-genai chat DIR`: talk with a bundle, replies streamed as they are generated.

Each line read is a user message; the reply is generated from the whole conversation (the
bundle's chat template), the oldest turns dropped when the context would not hold the next
reply (said on stderr). A line starting with `/` is a command, never sent to the model
(`/help` lists them). Ctrl-C during a reply stops the reply and the chat goes on (the text so
far stays in the conversation); end-of-file (Ctrl-D), `/exit` or `/quit` ends the chat with exit
code 0. A reply cut at --max-new-tokens or at the context gets a marker on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable

from mobius_genai.cli._generation import (
    Speed,
    add_adapter_argument,
    add_ep_argument,
    add_max_length_argument,
    add_no_mtp_argument,
    add_sampling_arguments,
    add_threads_argument,
    max_length,
    provider,
    say,
    search_options,
)
from mobius_genai.errors import MobiusError
from mobius_genai.progress import stderr_line
from mobius_genai.runtime.chat import Conversation
from mobius_genai.runtime.opening import open_bundle

_END = "end"


def _help(conversation: Conversation) -> None:
    stderr_line("\n".join(f"  {name:<7} {what}" for name, (what, _) in _COMMANDS.items()))


def _reset(conversation: Conversation) -> None:
    conversation.reset()
    stderr_line("[conversation reset]")


#: The chat's commands: what each does (for /help) and its action (`_END` ends the chat).
_COMMANDS: dict[str, tuple[str, Callable[[Conversation], None] | str]] = {
    "/help": ("list these commands", _help),
    "/reset": ("start the conversation again (the --system message stays)", _reset),
    "/exit": ("end the chat (as does Ctrl-D)", _END),
    "/quit": ("end the chat", _END),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `chat`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument("--system", help="a system message in front of the conversation")
    add_sampling_arguments(parser, max_new_tokens=256)
    add_max_length_argument(parser)
    add_threads_argument(parser)
    add_adapter_argument(parser)
    add_no_mtp_argument(parser)
    add_ep_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Read messages from stdin until it ends or says /exit; print each reply as it comes."""
    options = search_options(args)
    bundle = open_bundle(
        args.folder,
        command="chat",
        provider=provider(args),
        threads=args.threads,
        search=options,
        adapter=args.adapter,
        mtp=not args.no_mtp,
    )
    conversation = Conversation(
        bundle,
        system=args.system,
        max_new_tokens=args.max_new_tokens,
        note=say,
        max_length=max_length(args, bundle),
    )
    interactive = sys.stdin.isatty()
    if interactive:
        stderr_line(
            f"Chat with {args.folder}; /help lists the commands, /exit or Ctrl-D ends it, "
            "Ctrl-C stops a reply."
        )
    try:
        _converse(conversation, interactive, args)
    except KeyboardInterrupt as interrupt:  # not during a reply, nor at an interactive prompt
        interrupt.add_note("chat ended")
        raise
    if interactive:
        sys.stdout.write("\n")
    return 0


def _converse(conversation: Conversation, interactive: bool, args: argparse.Namespace) -> None:
    while True:
        message = _next_message(interactive)
        if message is None:
            return
        if not message.strip():
            continue
        if message.startswith("/"):
            if _command(message.strip(), conversation) == _END:
                return
            continue
        _reply(conversation, message, args)


def _next_message(interactive: bool) -> str | None:
    """The next line of input, None at its end; Ctrl-C at an interactive prompt gives a new
    prompt (elsewhere it ends the chat)."""
    while True:
        try:
            return input("> " if interactive else "")
        except EOFError:
            return None
        except KeyboardInterrupt:
            if not interactive:
                raise
            stderr_line("\n(/exit or Ctrl-D ends the chat)")


def _command(line: str, conversation: Conversation) -> str | None:
    """Do the command `line` names; `_END` when it ends the chat."""
    name = line.split()[0].lower()
    if name not in _COMMANDS:
        stderr_line(f"mobius-genai: unknown command {name}; /help lists the commands")
        return None
    action = _COMMANDS[name][1]
    if action == _END:
        return _END
    action(conversation)
    return None


def _reply(conversation: Conversation, message: str, args: argparse.Namespace) -> None:
    """Stream the reply to `message`; Ctrl-C stops it, a failure is said and the chat goes on."""
    speed = Speed()
    reply = conversation.reply(message)
    try:
        with contextlib.closing(reply):  # closing it cancels what is still generating
            for piece in speed.timed(reply):
                sys.stdout.write(piece)
                sys.stdout.flush()
    except KeyboardInterrupt:  # the reply stops here (og's cancel_turn); the chat goes on
        sys.stdout.write("\n")
        stderr_line("[reply stopped]")
        return
    except MobiusError as error:  # this message fails; the conversation goes on
        stderr_line(f"mobius-genai: error: {error}")
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    marker = _MARKERS.get(conversation.finish)
    if marker is not None:
        stderr_line(marker.format(conversation=conversation, args=args))
    speed.report(args.quiet)


#: The line saying why a reply did not end by itself, by `Conversation.finish`.
_MARKERS = {
    "length": "[… reply cut at {args.max_new_tokens} tokens; raise --max-new-tokens]",
    "context": "[… reply cut: the conversation fills the context ({conversation.context} "
    "tokens); /reset starts again]",
}
