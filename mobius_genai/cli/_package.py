"""`mobius-genai package MODEL --ep EP`: build a checked, runnable onnxruntime-genai bundle."""

from __future__ import annotations

import argparse
import contextlib
import functools
import time

from mobius_genai.bundle._staging import add_note
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.cli._args import add_checkpoint_arguments
from mobius_genai.cli._errors import reported_as_errors
from mobius_genai.errors import OptionError
from mobius_genai.optimize import trace_to_stderr
from mobius_genai.packager import package
from mobius_genai.progress import PREFIX, stderr_line
from mobius_genai.quantize import DEFAULT_QUALITY, QUALITIES, Int4Options
from mobius_genai.target import PRECISIONS, resolve_target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `package`."""
    add_checkpoint_arguments(
        parser,
        "bundle folder; default ./<model>-<ep>-<precision>, e.g. ./Qwen2.5-7B-cuda-fp16",
        required=False,
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="weight precision: fp32/fp16/bf16 set the dtype; int4 quantizes the linear weights "
        "(MatMulNBits) and keeps --dtype (or the EP's) for activations. Default: int4 when an "
        "--int4-* option is given or the source stores 4-bit weights (GGUF, GPTQ, AWQ: kept as "
        "stored), else --dtype's (or the EP's). A float precision dequantizes a pre-quantized "
        "source",
    )
    parser.add_argument(
        "--int4-block-size",
        type=int,
        help="int4 quantization block size: 16, 32, 64, 128 or 256; default: the "
        "--int4-quality recipe's (32 for each recipe today). Every --int4-* option implies "
        "--precision int4",
    )
    parser.add_argument(
        "--int4-asymmetric",
        action="store_true",
        help="int4 with zero points (asymmetric); default: the --int4-quality recipe's",
    )
    parser.add_argument(
        "--int4-quality",
        choices=tuple(QUALITIES),
        help=f"int4 recipe (default {DEFAULT_QUALITY}): "
        + "; ".join(f"{name}: {recipe.summary}" for name, recipe in QUALITIES.items()),
    )
    parser.add_argument(
        "--int4-accuracy-level",
        type=int,
        help="MatMulNBits accuracy_level 0-4 (for DequantizeLinear int4: the level onnxruntime "
        "fuses it at); default: the EP's (`mobius-genai eps`, int4 column)",
    )
    parser.add_argument(
        "--graph-capture",
        choices=("on", "off"),
        help="GPU graph capture (CUDA graphs, WebGPU/DirectML capture) in the bundle's provider "
        "options; default: the EP's (`mobius-genai eps`); needs GroupQueryAttention's shared KV "
        "buffer",
    )
    logits = parser.add_mutually_exclusive_group()
    logits.add_argument(
        "--prune-lm-head",
        dest="prune_lm_head",
        action="store_true",
        help="logits for each sequence's last position only: a faster prefill for "
        "og.Generator, but og.Engine, n-gram speculative decoding and get_output('logits') "
        "refuse the bundle (its card names them)",
    )
    logits.add_argument(
        "--full-logits",
        dest="prune_lm_head",
        action="store_false",
        help="logits for every position, which every onnxruntime-genai API accepts (default)",
    )
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PEFT_DIR",
        help="a PEFT LoRA adapter to ship as adapters/NAME.onnx_adapter (repeatable); the "
        "graph takes LoRA inputs for the adapters' target modules",
    )
    parser.add_argument(
        "--no-smoke-test",
        dest="smoke_test",
        action="store_false",
        help="skip generating a few tokens with onnxruntime-genai after writing",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="nothing on stderr but errors (no phases, bars, notes)"
    )


def named_folders(values: list[str]) -> dict[str, str]:
    """`--adapter NAME=DIR` values as {NAME: DIR}; a repeated name is an OptionError."""
    named: dict[str, str] = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise OptionError(f"--adapter {value!r}; accepted: NAME=PEFT_DIR")
        if name in named:
            raise OptionError(f"--adapter name {name!r} given twice; accepted: one name each")
        named[name] = folder
    return named


def run(args: argparse.Namespace) -> int:
    """Package, then print the bundle folder on stdout; --trace shows the trace on stderr.

    Every failure becomes one MobiusError (the CLI prints it as one line) and leaves no
    bundle behind.
    """
    start = time.monotonic()
    with (
        trace_to_stderr() if args.trace else contextlib.nullcontext(),
        reported_as_errors(f"packaging {args.model}"),
    ):
        target = resolve_target(
            args.ep,
            dtype=args.dtype,
            precision=args.precision,
            int4=Int4Options.from_choices(
                args.int4_block_size,
                args.int4_asymmetric,
                args.int4_accuracy_level,
                args.int4_quality,
            ),
            context_length=args.context_length,
            graph_capture=None if args.graph_capture is None else args.graph_capture == "on",
            stored=functools.partial(stored_bits, args.model, args.revision),
        )
        folder = package(
            args.model,
            output=args.output,
            target=target,
            trace_optimization=args.trace,
            smoke_test=args.smoke_test,
            force=args.force,
            quiet=args.quiet,
            revision=args.revision,
            prune_lm_head=args.prune_lm_head,
            adapters=named_folders(args.adapter),
        )
    try:
        if not args.quiet:
            elapsed = time.monotonic() - start
            stderr_line(f"{PREFIX}bundle written to {folder} in {elapsed:.0f} s")
        print(folder)
    except BaseException as error:  # Ctrl-C or SIGTERM once the bundle is in place
        add_note(error, f"output {folder}: the new bundle is complete and in place")
        raise
    return 0
