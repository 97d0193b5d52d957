"""`mobius-genai package MODEL --ep EP`: build a checked, runnable onnxruntime-genai bundle."""

from __future__ import annotations

import argparse
import contextlib

from mobius_genai.bundle.packager import PRECISIONS, QUANTIZED_PRECISIONS, package
from mobius_genai.cli._args import add_checkpoint_arguments
from mobius_genai.cli._errors import reported_as_errors
from mobius_genai.errors import ConfigError
from mobius_genai.optimize import trace_to_stderr
from mobius_genai.quantize import Int4Options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `package`."""
    add_checkpoint_arguments(
        parser,
        "bundle folder; default ./<model>-<ep>-<precision>, e.g. ./Qwen2.5-7B-cuda-fp16",
        required=False,
    )
    parser.add_argument(
        "--precision",
        choices=(*PRECISIONS, *QUANTIZED_PRECISIONS),
        help="weight precision: fp32/fp16/bf16 set the dtype; int4 quantizes the linear weights "
        "(MatMulNBits) and keeps --dtype (or the EP's) for activations",
    )
    parser.add_argument(
        "--int4-block-size",
        type=int,
        help="int4 quantization block size: 16, 32 (default), 64, 128 or 256",
    )
    parser.add_argument(
        "--int4-asymmetric",
        action="store_true",
        help="int4 with zero points (asymmetric); default: symmetric",
    )
    parser.add_argument(
        "--int4-accuracy-level",
        type=int,
        help="MatMulNBits accuracy_level 0-4; default: the EP's (cpu and webgpu 4, others 0)",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        help="tokens the bundle supports; default: max_position_embeddings",
    )
    parser.add_argument(
        "--full-logits",
        dest="prune_lm_head",
        action="store_false",
        help="logits for every position (default: the last position only, all that "
        "onnxruntime-genai reads; needed e.g. to score prompts)",
    )
    parser.add_argument(
        "--no-smoke-test",
        dest="smoke_test",
        action="store_false",
        help="skip generating a few tokens with onnxruntime-genai after writing",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or notes")


def _int4_options(args: argparse.Namespace) -> Int4Options | None:
    chosen = Int4Options.from_choices(
        args.int4_block_size, args.int4_asymmetric, args.int4_accuracy_level
    )
    if chosen is not None and args.precision != "int4":
        raise ConfigError("--int4-* options need --precision int4")
    return chosen


def run(args: argparse.Namespace) -> int:
    """Package, then print the bundle folder on stdout; --trace shows the trace on stderr.

    Every failure becomes one MobiusError (the CLI prints it as one line) and leaves no
    bundle behind.
    """
    int4 = _int4_options(args)
    with (
        trace_to_stderr() if args.trace else contextlib.nullcontext(),
        reported_as_errors(f"packaging {args.model}"),
    ):
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
            int4=int4,
            prune_lm_head=args.prune_lm_head,
        )
    print(folder)
    return 0
