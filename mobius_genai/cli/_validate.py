"""`mobius-genai validate DIR`: check a bundle (any tool's) against genai's needs and its graph."""

from __future__ import annotations

import argparse

from mobius_genai.bundle.runnable import cpu_refusal
from mobius_genai.bundle.validate import validate_bundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `validate`."""
    parser.add_argument("folder", help="bundle folder (holding genai_config.json)")
    parser.add_argument(
        "--skip-hashes",
        action="store_true",
        help="do not re-hash the files listed in mobius_manifest.json",
    )


def run(args: argparse.Namespace) -> int:
    """Validate; problems raise BundleError, which the dispatcher prints (exit 1)."""
    report = validate_bundle(args.folder, check_hashes=not args.skip_hashes)
    decoder = report.genai_config["model"]["decoder"]
    manifest = "checksums match the manifest" if report.manifest else "no mobius manifest"
    if report.manifest and args.skip_hashes:
        manifest = "manifest sizes match (hashes skipped)"
    print(
        f"{args.folder}: valid ({report.genai_config['model']['type']}, "
        f"{decoder['num_hidden_layers']} layers, {manifest})"
    )
    refusal = cpu_refusal(report.graph)
    if refusal is not None:
        print(f"{args.folder}: note: {refusal}")
    return 0
