"""`mobius-genai eps`: the registered execution providers and their capabilities, as a table."""

from __future__ import annotations

import argparse

from mobius_genai.ep import format_ep_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`eps` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    """Print the registry table on stdout."""
    print(format_ep_table())
    return 0
