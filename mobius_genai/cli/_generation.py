"""Options shared by the commands that run a bundle: sampling, the context and the speed line
(`run`, `chat`), the provider to run on and onnxruntime's threads (`run`, `chat`, `bench`).

Given sampling options override the bundle's own search settings (genai_config.json `search`):
`--temperature 0` is greedy decoding; a positive temperature, `--top-p` or `--top-k` turn
sampling on; `--seed` makes sampling reproducible.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from typing import Any

from mobius_genai.cli._args import positive_int
from mobius_genai.ep import HOST_EP
from mobius_genai.errors import OptionError
from mobius_genai.progress import stderr_line
from mobius_genai.runtime.opening import ON_CPU, OpenBundle
from mobius_genai.runtime.placement import Provider

#: What --ep accepts, with what it does: the bundle itself is never changed.
EP_OVERRIDES = {
    HOST_EP: "the bundle's graph on the CPU provider, whatever its provider_options say"
}


def add_ep_argument(parser: argparse.ArgumentParser) -> None:
    """--ep: run on another provider than the bundle's."""
    parser.add_argument(
        "--ep",
        help="run on another provider than the bundle's: cpu (its graph on the CPU "
        "provider, e.g. a GPU bundle here); default: the bundle's",
    )


def on_cpu(args: argparse.Namespace) -> bool:
    """Whether --ep asks for the CPU provider; an OptionError for a value it does not accept."""
    if args.ep is None:
        return False
    if args.ep.lower() not in EP_OVERRIDES:
        raise OptionError(
            f"--ep {args.ep}: not accepted here; accepted: "
            + "; ".join(f"{name} ({what})" for name, what in EP_OVERRIDES.items())
        )
    return True


def provider(args: argparse.Namespace) -> Provider | None:
    """The provider --ep asks for (the CPU's), None for the bundle's own."""
    return ON_CPU if on_cpu(args) else None


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads: onnxruntime's intra-op threads."""
    parser.add_argument(
        "--threads", type=positive_int, help="onnxruntime intra-op threads (default: its own)"
    )


def add_adapter_argument(parser: argparse.ArgumentParser) -> None:
    """--adapter: a LoRA adapter of the bundle (or an .onnx_adapter file) made active."""
    parser.add_argument(
        "--adapter",
        metavar="NAME",
        help="run with the bundle's LoRA adapter NAME (adapters/NAME.onnx_adapter) or an "
        ".onnx_adapter file; default: the base model",
    )


def add_no_mtp_argument(parser: argparse.ArgumentParser) -> None:
    """--no-mtp: decode without the bundle's MTP head (to compare)."""
    parser.add_argument(
        "--no-mtp",
        action="store_true",
        help="decode without the bundle's multi-token-prediction head (og.MtpGenerator drafts "
        "with it by default, when the bundle has one)",
    )


def add_max_length_argument(parser: argparse.ArgumentParser) -> None:
    """--max-length: the tokens of prompt and reply together."""
    parser.add_argument(
        "--max-length",
        type=positive_int,
        help="tokens of the prompt and the reply together (the conversation, for chat), at most "
        "the bundle's context length; default: the bundle's search.max_length",
    )


def max_length(args: argparse.Namespace, bundle: OpenBundle) -> int:
    """--max-length, or the bundle's search.max_length; beyond the bundle's context length it is
    capped there, and said on stderr."""
    if args.max_length is None:
        return bundle.default_max_length
    if args.max_length > bundle.context_length:
        say(
            f"--max-length {args.max_length}: beyond {bundle.folder}'s context length "
            f"({bundle.context_length} tokens, model.context_length); using "
            f"{bundle.context_length}"
        )
        return bundle.context_length
    return args.max_length


def say(text: str) -> None:
    """A note on stderr."""
    stderr_line(f"mobius-genai: {text}")


def add_sampling_arguments(
    parser: argparse.ArgumentParser, max_new_tokens: int, default_help: str | None = None
) -> None:
    """--max-new-tokens, --temperature, --top-p, --top-k, --seed and --quiet. With
    `default_help`, --max-new-tokens defaults to None (the command applies `max_new_tokens`
    where `default_help` says it does)."""
    parser.add_argument(
        "--max-new-tokens",
        "--max-tokens",
        type=positive_int,
        default=max_new_tokens if default_help is None else None,
        help=f"tokens to generate at most (default {default_help or max_new_tokens})",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature: 0 is greedy, above 0 samples; default: the bundle's search "
        "settings (greedy for mobius-genai bundles)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        help="sample from the smallest set of tokens of this total probability, in (0, 1]",
    )
    parser.add_argument("--top-k", type=int, help="sample from the k most likely tokens, k >= 1")
    parser.add_argument("--seed", type=int, help="random seed of sampling (reproducible output)")
    parser.add_argument(
        "--quiet", action="store_true", help="no speed line (tokens/s) on stderr at the end"
    )


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """onnxruntime-genai search options of the given sampling arguments; an OptionError names a
    value out of range."""
    options: dict[str, Any] = {}
    if args.temperature is not None:
        if not math.isfinite(args.temperature) or args.temperature < 0:
            raise OptionError(
                f"--temperature {args.temperature}: out of range; accepted: 0 (greedy) or a "
                "positive number"
            )
        options["do_sample"] = args.temperature > 0
        if args.temperature > 0:
            options["temperature"] = args.temperature
    if args.top_p is not None:
        if not 0 < args.top_p <= 1:
            raise OptionError(f"--top-p {args.top_p}: out of range; accepted: 0 < p <= 1")
        options["top_p"] = args.top_p
    if args.top_k is not None:
        if args.top_k < 1:
            raise OptionError(f"--top-k {args.top_k}: out of range; accepted: an integer >= 1")
        options["top_k"] = args.top_k
    if (args.top_p is not None or args.top_k is not None) and args.temperature != 0:
        options["do_sample"] = True
    if args.seed is not None:
        if args.seed < 0:
            raise OptionError(f"--seed {args.seed}: out of range; accepted: an integer >= 0")
        options["random_seed"] = args.seed
    return options


class Speed:
    """Counts the pieces (one per generated token) of a stream and times them."""

    def __init__(self) -> None:
        self.tokens = 0
        self._decoded = 0
        self._seconds = 0.0

    def timed(self, pieces: Iterator[str]) -> Iterator[str]:
        """`pieces`, counted; the clock runs from the first piece to the last (decode speed:
        the wait for the first piece is the model's loading and the prompt's prefill)."""
        first = None
        for piece in pieces:
            now = time.perf_counter()
            if first is None:
                first = now
            self.tokens += 1
            self._decoded = self.tokens - 1
            self._seconds = now - first
            yield piece

    def report(self, quiet: bool) -> None:
        """One line on stderr: the tokens generated and the decode rate after the first."""
        if quiet:
            return
        rate = f"{self._decoded / self._seconds:.1f}" if self._seconds > 0 else "n/a"
        stderr_line(f"mobius-genai: {self.tokens} tokens, decode {rate} tokens/s")
