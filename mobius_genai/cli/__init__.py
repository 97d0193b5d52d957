"""The `mobius-genai` command line: one module per subcommand, listed in `_COMMANDS`.

Every subcommand module provides `add_arguments(parser)` and `run(args) -> int`. Errors that
mobius-genai raises on purpose become one line on stderr and exit code 1; a traceback is shown
only with --debug. Ctrl-C exits with 130, SIGTERM with 143, each with one line on stderr and
after removing what was being written.

`main` installs its signal handlers before it imports anything else: this module imports only
`signal` and `sys` (and `mobius_genai` imports its public names lazily), because the
subcommands' modules import onnx, onnxscript and onnxruntime, which take seconds.
"""

from __future__ import annotations

import contextlib
import signal
import sys

from mobius_genai.errors import MobiusError
from mobius_genai.progress import stderr_line

TYPE_CHECKING = False  # typing itself takes milliseconds to import
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

# (name, module, one-line help); a module is imported when its command is on the command line.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    (
        "build",
        "mobius_genai.cli._build",
        "build the ONNX graph (model.onnx + data) of a checkpoint",
    ),
    ("package", "mobius_genai.cli._package", "build a runnable onnxruntime-genai bundle"),
    (
        "adapter",
        "mobius_genai.cli._adapter",
        "convert a PEFT LoRA adapter for a bundle packaged with --adapter",
    ),
    ("validate", "mobius_genai.cli._validate", "check a bundle: schema, files, graph vs config"),
    ("run", "mobius_genai.cli._run", "generate text from a bundle with onnxruntime-genai"),
    ("chat", "mobius_genai.cli._chat", "chat with a bundle (its chat template, streamed replies)"),
    ("bench", "mobius_genai.cli._bench", "prefill and decode speed, time to first token, memory"),
    ("serve", "mobius_genai.cli._serve", "an OpenAI-compatible HTTP server over a bundle"),
    ("eps", "mobius_genai.cli._eps", "list the execution providers and their capabilities"),
    (
        "olive-config",
        "mobius_genai.cli._olive_config",
        "write an Olive package config with MobiusExport",
    ),
)


class _Terminated(BaseException):
    """SIGTERM, raised where the program is so it unwinds like Ctrl-C (staged output folders
    are removed on the way out); not an Exception, so no `except Exception` swallows it."""


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (the top level's
    options take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _imported(module_name: str) -> object | None:
    """The module of the command on the command line, None when it is absent.

    Ctrl-C or SIGTERM waits until it is imported: a signal inside a C extension's
    initialization (onnxruntime's) leaves an ImportError and a half-made module.
    """
    import importlib

    held = hasattr(signal, "pthread_sigmask")
    if held:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return None
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with the arguments of the command `argv` names only: the other commands are
    listed, and their modules (and what they import: onnx, onnxruntime, olive) not imported."""
    import argparse
    import importlib.util

    from mobius_genai.cli._suggest import SuggestingParser

    chosen = _chosen_command(argv)
    parser = SuggestingParser(
        prog="mobius-genai",
        description="Turn a HuggingFace LLM checkpoint into an ONNX Runtime GenAI bundle.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name, help_text in _COMMANDS:
        texts = {"help": help_text, "description": help_text}
        if name != chosen:
            if importlib.util.find_spec(module_name) is not None:
                parser.add_command(subparsers, name, False, **texts)
            continue
        module = _imported(module_name)
        if module is None:
            continue
        sub = parser.add_command(subparsers, name, True, **texts)
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def _version() -> str:
    """The installed distribution's version (the package's own when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("mobius-genai")
    except metadata.PackageNotFoundError:
        from mobius_genai import __version__

        return __version__


def _finish_swaps(folder: str | None) -> None:
    """The commands that take a bundle folder (`run`, `chat`, `bench`, `validate`) first finish
    a swap that a `package --force` killed in its middle left there (`_staging.recover_stale`),
    and say so in one line."""
    if folder is None:
        return
    from pathlib import Path

    from mobius_genai.bundle._staging import recover_stale

    for note in recover_stale(Path(folder).absolute()):
        stderr_line(f"mobius-genai: {note}")


def _after_the_command_ends_on_signals() -> None:
    """From now until the process exits (atexit handlers, threads joined, modules freed), Ctrl-C
    and SIGTERM end it at once with one line and 130/143, instead of a traceback or death by
    the signal. Ctrl-C that the process ignores (a background job) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _after_the_command)
    signal.signal(signal.SIGTERM, _after_the_command)


def _after_the_command(signum: int, frame: object) -> None:
    import os

    with contextlib.suppress(Exception):  # stdout may be mid-write: this runs between bytecodes
        sys.stdout.flush()
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    os.write(
        2, f"mobius-genai: {word} after the command finished; what it wrote is complete\n".encode()
    )
    os._exit(128 + signum)


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _signal_behind(error: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or _Terminated that `error` was raised from, if any."""
    while error is not None and not isinstance(error, (KeyboardInterrupt, _Terminated)):
        error = error.__cause__ or error.__context__
    return error


def _stopped(signalled: BaseException) -> int:
    """Say that Ctrl-C or SIGTERM stopped the command and what it left (the notes
    staged_output adds while replacing OUT); its exit code."""
    interrupted = isinstance(signalled, KeyboardInterrupt)
    outcome = "; ".join(getattr(signalled, "__notes__", [])) or "nothing was written"
    stderr_line(f"mobius-genai: {'interrupted' if interrupted else 'terminated'}; {outcome}")
    return 128 + (signal.SIGINT if interrupted else signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code.

    Called without `argv` (the console script, `python -m mobius_genai.cli`), it owns the
    process: Ctrl-C or SIGTERM after the command has finished, while the process exits, ends
    it with one line and 130/143 as at any other moment (`_after_the_command`).
    """
    owns_process = argv is None
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
        handles_signals = True
    except ValueError:  # not the main thread: signals stay with whoever handles them
        previous, handles_signals = None, False
    debug = False
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = _parser(argv).parse_args(argv)
        debug = args.debug
        _finish_swaps(getattr(args, "folder", None))
        return int(args.handler(args) or 0)
    except (KeyboardInterrupt, _Terminated) as error:
        return _stopped(error)
    except MobiusError as error:
        if debug:
            raise
        stderr_line(f"mobius-genai: error: {error.command_line_message()}")
        return 1
    except Exception as error:  # e.g. an ImportError a signal caused inside a C extension
        signalled = _signal_behind(error)
        if signalled is None:
            raise
        return _stopped(signalled)
    finally:
        if handles_signals and owns_process:
            _after_the_command_ends_on_signals()
        elif handles_signals:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
