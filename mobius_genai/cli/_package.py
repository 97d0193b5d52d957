"""`mobius-genai package MODEL --ep EP`: build a checked, runnable onnxruntime-genai bundle."""

from __future__ import annotations

import argparse
import contextlib

from mobius_genai.optimize import trace_to_stderr
from mobius_genai.package.packager import PRECISIONS, PRECISIONS_TODO, package


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `package`."""
    parser.add_argument("model", help="hub id (e.g. Qwen/Qwen2.5-7B) or local checkpoint folder")
    parser.add_argument(
        "--ep",
        default="default",
        help="execution provider (see `mobius-genai eps`); default: default",
    )
    parser.add_argument(
        "-o",
        "--output",
        help="bundle folder; default ./<model>-<ep>-<precision>, e.g. ./Qwen2.5-7B-cuda-fp16",
    )
    parser.add_argument(
        "--dtype", choices=("f32", "f16", "bf16"), help="model dtype; default: the EP's"
    )
    parser.add_argument(
        "--precision",
        choices=(*PRECISIONS, *PRECISIONS_TODO),
        help="weight precision (fp32/fp16/bf16 set the dtype; int4 is not available yet)",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        help="tokens the bundle supports; default: max_position_embeddings",
    )
    parser.add_argument("--trace", action="store_true", help="report why each rewrite fired or not")
    parser.add_argument(
        "--no-smoke-test",
        dest="smoke_test",
        action="store_false",
        help="skip generating a few tokens with onnxruntime-genai after writing",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace a non-empty output folder (on success only)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or notes")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")


def run(args: argparse.Namespace) -> int:
    """Package, then print the bundle folder on stdout; --trace shows the trace on stderr."""
    with trace_to_stderr() if args.trace else contextlib.nullcontext():
        folder = package(
            args.model,
            args.ep,
            args.output,
            dtype=args.dtype,
            precision=args.precision,
            context_length=args.context_length,
            trace=args.trace,
            smoke_test=args.smoke_test,
            force=args.force,
            quiet=args.quiet,
            revision=args.revision,
        )
    print(folder)
    return 0
