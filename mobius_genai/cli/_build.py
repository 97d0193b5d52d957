"""`mobius-genai build MODEL [-o OUT]`: the optimized ONNX graph of a checkpoint, nothing more.

Writes OUT/model.onnx and OUT/model.onnx.data (ModelPackage.save). Unlike `package`, the graph
keeps the logits of every position: it is for other tools (scoring a prompt, evaluating
perplexity), while onnxruntime-genai reads only the last position's. Everything is written into a
temporary folder beside OUT that becomes OUT only when the graph is complete, so a failure
leaves no OUT behind (and an existing OUT untouched). For a runnable bundle use `package`.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from mobius_genai.build import build
from mobius_genai.bundle.output_folder import checkpoint_folder, staged_output
from mobius_genai.cli._args import add_checkpoint_arguments
from mobius_genai.cli._errors import reported_as_errors
from mobius_genai.optimize import trace_to_stderr
from mobius_genai.packager import bundle_name
from mobius_genai.progress import stderr_line
from mobius_genai.target import resolve_target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `build`."""
    parser.description = (
        f"{parser.description}. The graph computes logits for every position, as `package` "
        "does by default (`package --prune-lm-head` keeps the last position's only)."
    )
    add_checkpoint_arguments(
        parser,
        "folder for model.onnx (+ .data); default ./<model>-<ep>-<precision>-graph, e.g. "
        "./Qwen2.5-7B-cuda-fp16-graph (package's name for the bundle, marked as a bare graph)",
        required=False,
    )
    parser.add_argument(
        "--no-weights",
        dest="load_weights",
        action="store_false",
        help="read config.json only: the graph without weights (fast, for inspection)",
    )


def run(args: argparse.Namespace) -> int:
    """Build, save into a staging folder, rename it to OUT; print OUT on stdout.

    Every failure becomes one MobiusError (the CLI prints it as one line; --debug shows the
    traceback of the cause) and leaves no OUT behind.
    """
    target = resolve_target(args.ep, dtype=args.dtype, context_length=args.context_length)
    name = f"{bundle_name(args.model, target.ep.name, target.precision)}-graph"
    out = Path(args.output) if args.output else Path.cwd() / name
    with (
        trace_to_stderr() if args.trace else contextlib.nullcontext(),
        reported_as_errors(f"building {args.model} into {out}"),
        staged_output(
            out,
            force=args.force,
            protect=checkpoint_folder(args.model),
            say=lambda note: stderr_line(f"mobius-genai: {note}"),
        ) as staging,
    ):
        package = build(
            args.model,
            target=target,
            load_weights=args.load_weights,
            trace_optimization=args.trace,
            revision=args.revision,
            progress=True,
        )
        package.save(staging)
    print(out)
    return 0
