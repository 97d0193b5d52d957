"""The `mobius-genai` command line: one module per subcommand, listed in `_COMMANDS`.

Every subcommand module provides `add_arguments(parser)` and `run(args) -> int`. Errors that
mobius-genai raises on purpose become one line on stderr and exit code 1; a traceback is shown
only with --debug. Ctrl-C exits with 130, SIGTERM with 143, both after removing what was
being written.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence

from mobius_genai.errors import MobiusError

# (name, module, one-line help); modules are imported lazily so `--help` stays fast.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    (
        "build",
        "mobius_genai.cli._build",
        "build the ONNX graph (model.onnx + data) of a checkpoint",
    ),
    ("package", "mobius_genai.cli._package", "build a runnable onnxruntime-genai bundle"),
    ("validate", "mobius_genai.cli._validate", "check a bundle: schema, files, graph vs config"),
    ("run", "mobius_genai.cli._run", "generate text from a bundle with onnxruntime-genai"),
    ("eps", "mobius_genai.cli._eps", "list the execution providers and their capabilities"),
    (
        "olive-config",
        "mobius_genai.cli._olive_config",
        "write an Olive package config with MobiusExport",
    ),
)


def _available_commands() -> list[tuple[str, object, str]]:
    found = []
    for name, module_name, help_text in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        found.append((name, module, help_text))
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mobius-genai",
        description="Turn a HuggingFace LLM checkpoint into an ONNX Runtime GenAI bundle.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module, help_text in _available_commands():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so staged output folders are removed on the way out."""
    raise SystemExit(128 + signum)


def _outcome(interruption: BaseException) -> str:
    """What an interrupted command left behind, as the notes of staged_output say."""
    return "; ".join(getattr(interruption, "__notes__", [])) or "nothing was written"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    handles_signals = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if handles_signals else None
    debug = False
    try:
        args = _parser().parse_args(argv)
        debug = args.debug
        return int(args.handler(args) or 0)
    except KeyboardInterrupt as interrupt:
        print(f"mobius-genai: interrupted; {_outcome(interrupt)}", file=sys.stderr)
        return 130
    except SystemExit as stop:
        if getattr(stop, "__notes__", None):  # SIGTERM while writing: say what OUT holds
            print(f"mobius-genai: terminated; {_outcome(stop)}", file=sys.stderr)
        raise
    except MobiusError as error:
        if debug:
            raise
        print(f"mobius-genai: error: {error}", file=sys.stderr)
        return 1
    finally:
        if handles_signals:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
