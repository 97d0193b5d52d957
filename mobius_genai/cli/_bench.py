"""`mobius-genai bench DIR`: prefill and decode tokens/s, time to first token and peak memory
of a bundle for chosen prompt lengths and batch sizes, as a table or JSON; `bench DIR --audio
[FILE]`: a speech bundle's real-time factor on that clip, or the time to the first token
after it beside a prompt (Gemma 4 E2B/E4B); `bench DIR --image [FILE]`: a vision-language
bundle's time to the first token after an image, against the prompt without it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from mobius_genai.bench.audio import ClipBench, bench_audio, generated_clip
from mobius_genai.bench.image import bench_image
from mobius_genai.bench.runner import BenchRow, bench
from mobius_genai.cli._args import positive_int
from mobius_genai.cli._generation import (
    add_adapter_argument,
    add_ep_argument,
    add_no_mtp_argument,
    add_threads_argument,
    on_cpu,
)
from mobius_genai.cli._table import aligned_table
from mobius_genai.errors import OptionError
from mobius_genai.runtime.audio import Clip

_HEADERS = ("prompt", "batch", "TTFT ms", "prefill tok/s", "decode tok/s", "peak RSS MiB")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `bench`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument(
        "--prompt-lengths",
        default="16,128",
        help="comma-separated prompt lengths in tokens (default 16,128)",
    )
    parser.add_argument(
        "--batch-sizes", default="1", help="comma-separated batch sizes (default 1)"
    )
    parser.add_argument(
        "--new-tokens", type=positive_int, default=32, help="tokens generated per run (default 32)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="timed runs per configuration, after a warm-up; the table shows medians (default 3)",
    )
    parser.add_argument(
        "--audio",
        metavar="PATH",
        nargs="?",
        const="",
        help="time a clip (this WAV, FLAC or MP3 file; without PATH, a generated tone): a speech "
        "bundle's transcription (real-time factor), or the first token after a clip beside the "
        "prompt (Gemma 4 E2B/E4B)",
    )
    parser.add_argument(
        "--image",
        metavar="PATH",
        nargs="?",
        const="",
        help="time the first token after an image (this PNG or JPEG file; without PATH, a "
        "generated one at the processor's size) beside the prompt, against the prompt alone "
        "(a vision-language bundle)",
    )
    add_ep_argument(parser)
    add_threads_argument(parser)
    add_adapter_argument(parser)
    add_no_mtp_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Measure each configuration in a process of its own, then print the results."""
    cpu = on_cpu(args)
    if args.audio is not None and args.image is not None:
        raise OptionError("--audio and --image: bench times one at a time; accepted: either")
    if args.audio is not None:
        return _audio(args, cpu)
    if args.image is not None:
        return _image(args, cpu)
    rows = bench(
        args.folder,
        prompt_lengths=_integers("--prompt-lengths", args.prompt_lengths),
        batch_sizes=_integers("--batch-sizes", args.batch_sizes),
        new_tokens=args.new_tokens,
        rounds=args.rounds,
        cpu=cpu,
        threads=args.threads,
        adapter=args.adapter,
        mtp=not args.no_mtp,
    )
    if args.json:
        print(
            json.dumps({"bundle": args.folder, **_settings(args), "rows": _dicts(rows)}, indent=2)
        )
    else:
        print(_table(rows, args))
    return 0


def _audio(args: argparse.Namespace, cpu: bool) -> int:
    clip = Clip.read(args.audio) if args.audio else generated_clip()
    shown = args.audio or clip.name
    result = bench_audio(args.folder, clip, **_media_timing(args, cpu))
    if isinstance(result, ClipBench):
        ratio = {"clip_cost": result.clip_cost}
        line = result.line(shown, "clip", args.rounds)
    else:
        ratio = {"real_time_factor": result.real_time_factor}
        line = (
            f"{shown}: {result.audio_seconds:.1f} s of audio transcribed in "
            f"{result.seconds:.3f} s (median of {args.rounds}, {result.tokens} pieces): "
            f"real-time factor {result.real_time_factor:.3f}"
        )
    if args.json:
        fields = {**dataclasses.asdict(result), **ratio}
        print(json.dumps({"bundle": args.folder, "audio": shown, **fields}, indent=2))
    else:
        print(line)
    return 0


def _media_timing(args: argparse.Namespace, cpu: bool) -> dict[str, object]:
    """What `--audio` and `--image` time with: rounds, provider, threads, tokens."""
    return {
        "rounds": args.rounds,
        "cpu": cpu,
        "threads": args.threads,
        "new_tokens": args.new_tokens,
    }


def _image(args: argparse.Namespace, cpu: bool) -> int:
    image = None
    if args.image:
        path = Path(args.image)
        if not path.is_file():
            raise OptionError(f"--image {path}: not a file; accepted: a PNG or JPEG image file")
        image = path.read_bytes()
    result = bench_image(args.folder, image, **_media_timing(args, cpu))
    shown = args.image or f"a generated {result.width} x {result.height} image"
    if args.json:
        fields = {**dataclasses.asdict(result), "image_cost": result.image_cost}
        print(json.dumps({"bundle": args.folder, "image": shown, **fields}, indent=2))
        return 0
    print(result.line(shown, "image", args.rounds))
    return 0


def _integers(option: str, text: str) -> list[int]:
    """The distinct positive integers of a comma-separated list, in order."""
    values = []
    for item in text.split(","):
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value <= 0:
            raise OptionError(
                f"{option} {text}: {item.strip()!r} is not a positive integer; accepted: "
                "positive integers separated by commas, e.g. 16,128"
            )
        if value not in values:
            values.append(value)
    return values


def _settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "ep": args.ep.lower() if args.ep else "bundle",
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
    }


def _dicts(rows: list[BenchRow]) -> list[dict[str, object]]:
    return [dataclasses.asdict(row) for row in rows]


def _table(rows: list[BenchRow], args: argparse.Namespace) -> str:
    cells = [
        (
            str(row.prompt_length),
            str(row.batch_size),
            f"{row.ttft_ms:,.1f}",
            f"{row.prefill_tps:,.1f}",
            f"{row.decode_tps:,.1f}",
            "n/a" if row.peak_rss_mib is None else f"{row.peak_rss_mib:,.0f}",
        )
        for row in rows
    ]
    provider = "the CPU provider" if args.ep else "the bundle's provider"
    notes = (
        f"{args.folder} on {provider}: {args.new_tokens} new tokens per run, medians of "
        f"{args.rounds} runs after a warm-up; tokens/s count the whole batch.\n"
        "Peak RSS: the process of each row (model loading included, GPU memory not counted)."
    )
    accepted = [f"{row.acceptance:.0%}" for row in rows if row.acceptance is not None]
    if accepted:
        notes += (
            "\nMTP head (og.MtpGenerator, batch 1; --no-mtp without): drafts accepted "
            + ", ".join(accepted)
        )
    return aligned_table([_HEADERS, *cells], right=range(len(_HEADERS))) + "\n\n" + notes
