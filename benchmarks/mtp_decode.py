"""CPU decode with a bundle's multi-token-prediction head (og.MtpGenerator) against without it
(og.Generator), and onnxruntime-genai's builder's MTP bundle of the same checkpoint.

The checkpoint is Qwen3.5-shaped (Qwen3_5ForConditionalGeneration, the hub layout: three gated
delta nets per attention layer, gated attention with q/k norms, partial rotary; `--layers`
layers of hidden 1024, intermediate 3584, 8 query and 2 KV heads of 256, 16 + 16 delta-net heads
of 128, vocabulary 32,768) with random weights, and an MTP head made to copy the main model
(tests/_hf.py `add_mtp_head(copy=True)`: every residual branch writes zero, so each draft is the
token the model will produce and every draft is accepted). That is the runtime's ceiling: the
speed-up og.MtpGenerator gives when the head is always right; a real head accepts less (og's
notes report ~88% for Qwen3.6). The prompt repeats four tokens.

    python benchmarks/mtp_decode.py [--layers 12] [--new-tokens 64] [--rounds 5] [--threads 1]

One process loads the bundle once (main model and head, `--threads` onnxruntime threads) and
times generations as `mobius-genai bench` does (mobius_genai/bench/speed.py), alternating with
and without the head between rounds; it prints medians of decode tokens/s by wall clock and by
the thread's CPU time, the ratio to og.Generator, and the head's acceptance. The builder's
bundle (`-p fp32 -e cpu`; it builds the head of a checkpoint that declares one) is loaded the
same way and its failure, if any, printed in one line. Numbers depend on the machine's load;
say it next to them.
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
sys.path.insert(0, str(HERE.parent))  # the repository root: tests/ is a package

WORK = HERE / "_work" / "mtp"
PROMPT = [17, 92, 250, 33] * 8
VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
          "out_hidden_size": 1024, "patch_size": 2, "temporal_patch_size": 2,
          "spatial_merge_size": 2, "num_position_embeddings": 16}  # fmt: skip


def make_checkpoint(folder: Path, layers: int) -> Path:
    """The random Qwen3.5-shaped checkpoint with a copying MTP head (reused when present)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from tests._hf import add_mtp_head, randomize_weights
    from tests.conftest import TINY_QWEN2
    from tests.models.families.test_bundles import TOKENIZER_FILES

    text = {
        "vocab_size": 32_768,
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "layer_types": [
            "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
        ],
        "max_position_embeddings": 4096,
        "bos_token_id": 381,
        "eos_token_id": 383,
    }
    config = Qwen3_5Config(text_config=text, vision_config=VISION)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32)
    randomize_weights(model, seed=0)
    model.save_pretrained(folder)
    del model
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, folder / name)
    return add_mtp_head(folder, copy=True)


def time_bundle(folder: Path, new_tokens: int, rounds: int, threads: int) -> dict:
    """Medians of decode tok/s (wall, thread CPU) with and without the head, and acceptance."""
    from mobius_genai.bench.speed import time_generation
    from mobius_genai.runtime.generate import load_model
    from mobius_genai.runtime.opening import thread_options

    options = thread_options(threads)  # og's own errors (no validate: the builder's bundle too)
    model = load_model(folder, session_options=options)
    head = load_model(folder, session_options=options, mtp_head=True)
    runs: dict[str, list[dict]] = {"og.Generator": [], "og.MtpGenerator": []}
    time_generation(model, PROMPT, 4)  # warm-up
    time_generation(model, PROMPT, 4, head=head)
    for _ in range(rounds):
        runs["og.Generator"].append(time_generation(model, PROMPT, new_tokens))
        runs["og.MtpGenerator"].append(time_generation(model, PROMPT, new_tokens, head=head))
    return {
        name: {
            key: statistics.median(run[key] for run in results)
            for key in ("decode", "decode_cpu", "acceptance")
            if key in results[0]
        }
        for name, results in runs.items()
    }


def builder_bundle(checkpoint: Path, out: Path) -> Path | str:
    """onnxruntime-genai's builder's fp32 CPU bundle of `checkpoint`, or why it did not build."""
    if not (out / "genai_config.json").is_file():
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint)]
        command += ["-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(WORK / "builder-cache")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return f"the builder failed: {lines[-1] if lines else done.returncode}"
    return out


def without_shared_initializers(bundle: Path, out: Path) -> Path:
    """`bundle` with genai_config's shared_initializers left out (og's CPU path refuses them:
    "GetMemoryInfo for CPU should not be used"); its other files linked, not copied."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in bundle.iterdir():
        if path.name != "genai_config.json":
            (out / path.name).symlink_to(path.resolve())
    config = json.loads((bundle / "genai_config.json").read_text())
    for section in config["model"].values():
        if isinstance(section, dict):
            section.pop("shared_initializers", None)
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    return out


def _timed(folder: Path, args: argparse.Namespace) -> dict | str:
    try:
        return time_bundle(folder, args.new_tokens, args.rounds, args.threads)
    except Exception as error:  # og's error in one line: the row says why
        return str(error).splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from mobius_genai import packager

    checkpoint = make_checkpoint(WORK / f"qwen3_5-{args.layers}l-copy-head", args.layers)
    ours = WORK / f"mobius-{args.layers}l"
    if not (ours / "genai_config.json").is_file():
        packager.package(checkpoint, "cpu", ours, smoke_test=False, quiet=True, force=True)
    results = {"mobius-genai": time_bundle(ours, args.new_tokens, args.rounds, args.threads)}
    theirs = builder_bundle(checkpoint, WORK / f"builder-{args.layers}l")
    results["builder"] = _timed(theirs, args) if isinstance(theirs, Path) else theirs
    if isinstance(theirs, Path):
        edited = without_shared_initializers(theirs, WORK / f"builder-{args.layers}l-unshared")
        results["builder, shared_initializers left out"] = _timed(edited, args)
    print(json.dumps(results, indent=2))
    for bundle, rows in results.items():
        if isinstance(rows, str):
            print(f"| {bundle} | {rows} |")
            continue
        base = rows["og.Generator"]
        for name, row in rows.items():
            accepted = f"{row['acceptance']:.0%}" if "acceptance" in row else "-"
            print(
                f"| {bundle} | {name} | {row['decode']:.2f} | {row['decode'] / base['decode']:.2f} "
                f"| {row['decode_cpu']:.2f} | {row['decode_cpu'] / base['decode_cpu']:.2f} "
                f"| {accepted} |"
            )


if __name__ == "__main__":
    main()
