"""Whisper on the CPU EP: mobius-genai's bundle against onnxruntime-genai's builder output for
the same checkpoint (issue 33): real-time factor and peak memory, fp32 and int4.

The checkpoints: random float32 weights (transformers' initialisation) in the real Whisper-tiny
and Whisper-base shapes (multilingual vocabulary, 80 mel bins), with the test suite's Whisper
tokenizer (tests/models/whisper/_whisper.py; speed does not depend on it). Both tools convert
them for cpu:

    mobius-genai package CKPT --ep cpu --precision P -o OUT --force --quiet --no-smoke-test
        (int4: --int4-quality builder, the builder's own recipe, so both do the same work)
    python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p P -e cpu -c CACHE

Each bundle transcribes a 30 s generated tone (og's processor, the encoder, then exactly
`--new` tokens) in processes of its own (`_whisper_speed.py`: one thread, a warm-up, then
`--rounds` rounds), the two tools' processes taking turns, the order alternating. RTF = the
median round's seconds / 30 s of audio (below 1: faster than the audio plays); peak = the
process's peak RSS (VmHWM, load included), median over its processes. Ratios are mobius-genai /
builder, medians of the per-process ratios.

    python benchmarks/whisper_cpu.py                  # tiny and base, fp32 and int4
    python benchmarks/whisper_cpu.py --shapes tiny --precisions fp32 --processes 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "whisper_cpu"
PYTHON = sys.executable
AUDIO_SECONDS = 30.0
#: The released models' dimensions (openai/whisper-tiny and -base config.json).
SHAPES = {
    "tiny": {"d_model": 384, "layers": 4, "heads": 6, "ffn": 1536},
    "base": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048},
}


def checkpoint(shape: str) -> Path:
    """The random checkpoint of `shape`, written once (its stamp says which shape)."""
    folder = WORK / f"ckpt-{shape}"
    stamp = json.dumps(SHAPES[shape])
    if (folder / "stamp.json").is_file() and (folder / "stamp.json").read_text() == stamp:
        return folder
    sys.path.insert(0, str(HERE.parent))  # the repository root: tests/ is a package
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from tests.models.whisper._whisper import write_whisper_tokenizer

    dims = SHAPES[shape]
    config = WhisperConfig(
        d_model=dims["d_model"],
        encoder_layers=dims["layers"],
        decoder_layers=dims["layers"],
        encoder_attention_heads=dims["heads"],
        decoder_attention_heads=dims["heads"],
        encoder_ffn_dim=dims["ffn"],
        decoder_ffn_dim=dims["ffn"],
        vocab_size=51_865,
        num_mel_bins=80,
    )
    torch.manual_seed(0)
    shutil.rmtree(folder, ignore_errors=True)
    WhisperForConditionalGeneration(config).save_pretrained(folder)
    write_whisper_tokenizer(folder, "multilingual")
    (folder / "stamp.json").write_text(stamp)
    return folder


def build_commands(ckpt: Path, out: Path, precision: str) -> dict[str, list[str]]:
    """Tool → the command that converts `ckpt` into `out/tool`."""
    ours = [str(Path(PYTHON).parent / "mobius-genai"), "package", str(ckpt), "--ep", "cpu"]
    ours += ["--precision", precision, "-o", str(out / "mobius"), "--force", "--quiet"]
    ours += ["--no-smoke-test"] + (["--int4-quality", "builder"] if precision == "int4" else [])
    builder = [PYTHON, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt)]
    builder += ["-o", str(out / "builder"), "-p", precision, "-e", "cpu", "-c", str(WORK / "c")]
    return {"mobius": ours, "builder": builder}


def build(ckpt: Path, out: Path, precision: str) -> dict[str, Path]:
    """Both bundles of `ckpt` at `precision` (built anew each run)."""
    bundles = {}
    for tool, command in build_commands(ckpt, out, precision).items():
        shutil.rmtree(out / tool, ignore_errors=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{tool} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        bundles[tool] = out / tool
    return bundles


def speed(bundle: Path, audio: Path, args: argparse.Namespace) -> dict[str, float]:
    """One process's median round (seconds) and peak RSS (MiB, its VmHWM)."""
    command = [PYTHON, str(HERE / "_whisper_speed.py"), str(bundle), str(audio)]
    command += ["--new", str(args.new), "--rounds", str(args.rounds), "--threads", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{bundle}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": statistics.median(result["seconds"]), "peak_mib": result["peak_mib"]}


def compare(bundles: dict[str, Path], audio: Path, args: argparse.Namespace) -> dict:
    """Each tool's processes taking turns; medians and the per-process ratios' medians."""
    runs: dict[str, list[dict[str, float]]] = {tool: [] for tool in bundles}
    for index in range(args.processes):
        order = list(bundles) if index % 2 == 0 else list(reversed(bundles))
        for tool in order:
            runs[tool].append(speed(bundles[tool], audio, args))
    row = {}
    for tool, found in runs.items():
        row[f"{tool}_rtf"] = statistics.median(r["seconds"] for r in found) / AUDIO_SECONDS
        row[f"{tool}_peak_mib"] = statistics.median(r["peak_mib"] for r in found)
    for key in ("seconds", "peak_mib"):
        pairs = zip(runs["mobius"], runs["builder"], strict=True)
        row[f"{key}_ratio"] = statistics.median(ours[key] / theirs[key] for ours, theirs in pairs)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int4"])
    parser.add_argument("--new", type=int, default=64, help="decoder tokens per transcription")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE.parent))
    from tests.models.whisper._whisper import tone, write_wav

    audio = write_wav(WORK / "tone30.wav", tone(AUDIO_SECONDS))
    rows = []
    for shape in args.shapes:
        ckpt = checkpoint(shape)
        for precision in args.precisions:
            bundles = build(ckpt, WORK / f"{shape}-{precision}", precision)
            row = {"shape": shape, "precision": precision, **compare(bundles, audio, args)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(
        "| shape | precision | RTF mobius | RTF builder | time ratio | peak MiB mobius | "
        "peak MiB builder | peak ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| Whisper-{r['shape']} | {r['precision']} | {r['mobius_rtf']:.4f} | "
            f"{r['builder_rtf']:.4f} | {r['seconds_ratio']:.2f} | {r['mobius_peak_mib']:.0f} | "
            f"{r['builder_peak_mib']:.0f} | {r['peak_mib_ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
