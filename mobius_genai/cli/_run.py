"""`mobius-genai run DIR [PROMPT] [--image PATH]`: stream generated text from a bundle;
`run DIR --audio FILE [--language en] [--task transcribe|translate] [--prompt TEXT]
[--format text|srt|vtt|json|verbose_json] [--timestamps]` prints a speech bundle's transcript
(runtime/transcription.py, the one serve gives, in serve's response formats; with
--timestamps, one `[start -> end] text` line per segment).

The prompt is the positional PROMPT or `--prompt TEXT`. Text comes from onnxruntime-genai's
Engine where it runs the bundle, from og.Generator where it does not (`bundle.decoding`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from mobius_genai.bundle.bundle_folder import require_bundle
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.cli._generation import (
    Speed,
    add_adapter_argument,
    add_max_length_argument,
    add_no_mtp_argument,
    add_sampling_arguments,
    add_threads_argument,
    max_length,
    say,
    search_options,
)
from mobius_genai.errors import OptionError
from mobius_genai.runtime.audio import TASKS, Clip, has_audio, require_audio_bundle
from mobius_genai.runtime.decoding import Guidance, stream_text
from mobius_genai.runtime.opening import OpenBundle, open_bundle
from mobius_genai.runtime.placement import provider_of
from mobius_genai.runtime.timestamps import Segment
from mobius_genai.runtime.transcription import (
    TimedSegment,
    TranscriptRequest,
    transcript_steps,
)
from mobius_genai.serve.protocol import TIMED_FORMATS
from mobius_genai.serve.transcripts import MEDIA_TYPES, transcript_body

#: run's --max-new-tokens for generated text.
_NEW_TOKENS = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `run`."""
    parser.add_argument("folder", help="bundle folder")
    parser.add_argument(
        "prompt", nargs="?", help="the user message (or raw text with --raw); or --prompt"
    )
    parser.add_argument("--prompt", dest="prompt_option", metavar="PROMPT", help="as PROMPT")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image file for a vision-language bundle (repeat for several); the prompt gets "
        "the model's image placeholder for each image it does not place itself",
    )
    parser.add_argument(
        "--audio",
        metavar="PATH",
        help="an audio file (WAV or FLAC of any length, MP3 up to 30 s) for a speech bundle: "
        "prints its transcript (a prompt is the text before it, as serve's `prompt`); for a "
        "bundle with a speech graph (Gemma 4 E2B/E4B), one clip (up to 30 s) beside the prompt",
    )
    parser.add_argument(
        "--language",
        metavar="CODE",
        help="with --audio: the spoken language's code as the tokenizer names it (default en)",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="transcribe",
        help="with --audio: transcribe, or translate into English (multilingual models)",
    )
    parser.add_argument(
        "--timestamps",
        action="store_true",
        help="with --audio: one line per segment, `[start -> end] text` (seconds)",
    )
    parser.add_argument(
        "--format",
        choices=tuple(MEDIA_TYPES),
        default="text",
        help="with --audio: the transcript as serve's response_format writes it (default text)",
    )
    parser.add_argument(
        "--raw", action="store_true", help="feed the prompt as is, without the chat template"
    )
    guided = parser.add_mutually_exclusive_group()
    guided.add_argument(
        "--json-schema",
        metavar="SCHEMA",
        help="the reply is JSON matching this JSON schema (its text, or a file holding it)",
    )
    guided.add_argument("--regex", metavar="PATTERN", help="the reply matches this regex")
    add_sampling_arguments(
        parser,
        max_new_tokens=_NEW_TOKENS,
        default_help=f"{_NEW_TOKENS}; a Whisper bundle's transcript: each 30 s window up to the "
        "decoder's context",
    )
    add_max_length_argument(parser)
    add_threads_argument(parser)
    add_adapter_argument(parser)
    add_no_mtp_argument(parser)
    parser.add_argument(
        "--ep",
        help="run on this execution provider instead of the one the bundle names (the bundle "
        "is not changed); e.g. --ep cpu runs a GPU bundle here, on the CPU provider",
    )


def run(args: argparse.Namespace) -> int:
    """Print the text as it is generated (or the audio's transcript), then the speed on
    stderr."""
    require_bundle(args.folder)
    config = read_genai_config(Path(args.folder))
    require_audio_bundle(args.folder, config, args.audio is not None)
    speech = args.audio is not None and has_audio(config)
    prompt = None if speech else _prompt(args)
    if args.timestamps and not speech:
        raise OptionError(
            "--timestamps times a transcript; accepted: with --audio FILE on a speech bundle"
        )
    if args.format != "text" and not (speech and not args.timestamps):
        raise OptionError(
            f"--format {args.format} writes a transcript; accepted: with --audio FILE on a "
            "speech bundle, without --timestamps"
        )
    options = search_options(args)
    guidance = _guidance(args)
    clip = None if args.audio is None else Clip.read(args.audio)
    bundle = open_bundle(
        args.folder,
        command="run",
        provider=None if args.ep is None else provider_of(args.ep),
        threads=args.threads,
        adapter=args.adapter,
        search=options,
        mtp=not args.no_mtp,
    )
    if prompt is None:
        pieces = _transcript(args, bundle, clip)
    else:
        pieces = _text(args, bundle, prompt, guidance, clip)
    speed = Speed()
    for piece in speed.timed(pieces):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    speed.report(args.quiet)
    return 0


def _text(
    args: argparse.Namespace,
    bundle: OpenBundle,
    prompt: str,
    guidance: Guidance | None,
    clip: Clip | None,
):
    """The generated text of a text (or vision-language) bundle, piece by piece."""
    return stream_text(
        bundle,
        prompt,
        max_new_tokens=args.max_new_tokens or _NEW_TOKENS,
        max_length=max_length(args, bundle),
        use_chat_template=not args.raw,
        images=args.image,
        audio=clip,
        guidance=guidance,
        note=say,
    )


def _transcript(args: argparse.Namespace, bundle: OpenBundle, clip: Clip) -> Iterator[str]:
    """A piece per token decoded ("": run's speed line counts them); the text (or with
    --timestamps, a line per segment) as each window's segments are found, so a long clip's
    transcript shows while the rest is decoded; srt, vtt and the JSON formats whole at the end."""
    request = TranscriptRequest(
        language=args.language,
        task=args.task,
        timestamps=args.timestamps or args.format in TIMED_FORMATS,
        prompt=_prompt(args) if (args.prompt, args.prompt_option) != (None, None) else None,
        window_tokens=args.max_new_tokens,
    )
    streamed = args.timestamps or args.format == "text"
    found: list[TimedSegment] = []
    steps = transcript_steps(bundle, clip, request, on_segment=found.append if streamed else None)
    shown, piece = 0, None
    try:
        while True:
            next(steps)
            if piece is not None:  # a piece a token: the last one's is the rest of the text
                yield piece
            piece = "".join(_shown(args, found[n], n) for n in range(shown, len(found)))
            shown = len(found)
    except StopIteration as done:
        transcript = done.value
    except RuntimeError as error:
        raise bundle.failure("transcribe the audio", error) from error
    rest = "".join(_shown(args, found[n], n) for n in range(shown, len(found)))
    if not streamed:
        body = transcript_body(transcript, args.format)
        # srt's and vtt's last cue ends in a blank line, which run's line break closes
        rest = (
            json.dumps(body, ensure_ascii=False)
            if isinstance(body, dict)
            else body.removesuffix("\n")
        )
    yield (piece or "") + rest


def _shown(args: argparse.Namespace, segment: TimedSegment, index: int) -> str:
    """How `run` prints a found segment: its text, or with --timestamps its line (the lines
    joined by line breaks; run's own line break ends the last)."""
    if not args.timestamps:
        return segment.text
    return ("\n" if index else "") + str(Segment(segment.start, segment.end, segment.text))


def _prompt(args: argparse.Namespace) -> str:
    """The prompt, given once: as PROMPT or as --prompt."""
    given = [text for text in (args.prompt, args.prompt_option) if text is not None]
    if len(given) != 1:
        what = "given twice" if given else "missing"
        raise OptionError(
            f"the prompt is {what}; accepted: one prompt, as `run DIR PROMPT` or "
            "`run DIR --prompt PROMPT`"
        )
    return given[0]


def _guidance(args: argparse.Namespace) -> Guidance | None:
    """onnxruntime-genai's guidance of --json-schema or --regex; None without either."""
    if args.regex is not None:
        return "regex", args.regex
    if args.json_schema is None:
        return None
    path = Path(args.json_schema)
    try:
        schema = path.read_text(encoding="utf-8") if path.is_file() else args.json_schema
        json.loads(schema)
    except (OSError, ValueError) as error:
        raise OptionError(
            f"--json-schema {args.json_schema}: not a JSON schema ({error}); accepted: a JSON "
            "schema's text, or a file holding it"
        ) from error
    return "json_schema", schema
