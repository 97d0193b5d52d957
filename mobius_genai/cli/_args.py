"""Arguments shared by the commands that build from a checkpoint (`build`, `package`)."""

from __future__ import annotations

import argparse

from mobius_genai.ep import ep_registry
from mobius_genai.target import FLOAT_PRECISIONS


def positive_int(text: str) -> int:
    """argparse type: an integer above zero."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_checkpoint_arguments(
    parser: argparse.ArgumentParser, output_help: str, required: bool
) -> None:
    """MODEL, -o, --ep, --dtype, --trace, --force, --revision and --context-length."""
    parser.add_argument("model", help="hub id (e.g. Qwen/Qwen2.5-7B) or local checkpoint folder")
    parser.add_argument("-o", "--output", required=required, help=output_help)
    parser.add_argument(
        "--ep",
        default="default",
        help=f"execution provider: {', '.join(ep_registry)}, in any case, or its onnxruntime "
        "name (see `mobius-genai eps`); default: default",
    )
    parser.add_argument(
        "--dtype",
        help=f"model dtype: {', '.join(FLOAT_PRECISIONS)} (f32, f16 also accepted); "
        "default: the EP's (see `mobius-genai eps`)",
    )
    parser.add_argument("--trace", action="store_true", help="log each optimization step to stderr")
    parser.add_argument(
        "--force", action="store_true", help="replace a non-empty output folder (on success only)"
    )
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")
    parser.add_argument(
        "--context-length",
        type=positive_int,
        help="tokens the model supports; default: max_position_embeddings",
    )
