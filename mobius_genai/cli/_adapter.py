"""`mobius-genai adapter PEFT_DIR --bundle BUNDLE -o FILE`: convert a further LoRA adapter for a
bundle packaged with LoRA inputs (`package --adapter`)."""

from __future__ import annotations

import argparse

from mobius_genai.bundle.adapters import convert_for_bundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `adapter`."""
    parser.add_argument(
        "peft_dir", help="PEFT LoRA adapter folder (adapter_config.json + safetensors)"
    )
    parser.add_argument("--bundle", required=True, help="bundle packaged with --adapter")
    parser.add_argument("-o", "--output", required=True, help="the .onnx_adapter file to write")
    parser.add_argument("--force", action="store_true", help="replace an existing output file")


def run(args: argparse.Namespace) -> int:
    """Convert; problems raise MobiusError, which the dispatcher prints (exit 1)."""
    out = convert_for_bundle(args.peft_dir, args.bundle, args.output, force=args.force)
    print(out)
    return 0
