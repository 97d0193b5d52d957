"""`mobius-genai olive-config -o FILE`: the Olive package config that makes MobiusExport usable.

`olive run --config RECIPE --package-config FILE` then finds MobiusExport and MobiusFinalize as
well as every built-in Olive pass (the file replaces Olive's registry, so it carries all of it).
olive-ai is imported only when the command runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import json
import sys

from mobius_genai.olive.package_config import olive_package_config, write_package_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `olive-config`."""
    parser.add_argument(
        "-o",
        "--output",
        default="-",
        help="file to write (replaced if it exists); default: standard output",
    )


def run(args: argparse.Namespace) -> int:
    """Write the package config; print its path (or the JSON itself with `-o -`)."""
    if args.output == "-":
        json.dump(olive_package_config(), sys.stdout, indent=4)
        sys.stdout.write("\n")
        return 0
    path = write_package_config(args.output)
    print(path)
    return 0
