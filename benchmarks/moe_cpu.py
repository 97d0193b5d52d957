"""CPU MoE speed: the fused com.microsoft::MoE / QMoE graph against the decomposed one.

The checkpoint: random bf16 weights in OLMoE-1B-7B's MoE shapes (hidden 2048, 16 heads of 128,
64 experts of intermediate 1024, 8 per token, q/k norms), `--layers` layers (default 1) and the
384-token vocabulary of tests/data/tiny-qwen2 (the real 50304-token vocabulary would add an
embedding and an lm_head that are not what this measures). Written once under
benchmarks/_work/ by _random_checkpoint.py, a layer per shard (~0.8 GB of bf16 per layer).

For each precision, two bundles of it: the cpu EP (fp32: MoE nodes run by onnxruntime's kernel;
int4: QMoE) and the cpu EP with `supports_fused_moe=False` (the MoE body inlined: every expert
on every token, weighted by exact zeros; its int4 bundle keeps the experts float, QMoE needing
the MoE node). Processes that each load one bundle as a plain onnxruntime session (one thread)
take turns timing a `--prompt`-token prefill and decode steps after a `--prompt`-token KV cache,
by CPU time of the calling thread.

    python benchmarks/moe_cpu.py [--precisions fp32,int4] [--layers 1] [--processes 2]

Memory: the fp32 decomposed session holds the experts twice (onnxruntime folds the body's
transposes of the expert weights at load), ~3.3 GB per layer; hence one layer by default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _random_checkpoint import WORK, Spec, cached_checkpoint

SHAPE = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "intermediate_size": 1024,
    "vocab_size": 384,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "norm_topk_prob": False,
    "tie_word_embeddings": False,
    "bos_token_id": 381,
    "eos_token_id": 383,
    "pad_token_id": 0,
    "model_type": "olmoe",
    "architectures": ["OlmoeForCausalLM"],
}


def _layer_specs(layer: int) -> list[Spec]:
    h, inter = SHAPE["hidden_size"], SHAPE["intermediate_size"]
    p = f"model.layers.{layer}."
    specs: list[Spec] = [
        (p + "input_layernorm.weight", (h,), "norm"),
        (p + "post_attention_layernorm.weight", (h,), "norm"),
        (p + "self_attn.q_norm.weight", (h,), "norm"),
        (p + "self_attn.k_norm.weight", (h,), "norm"),
        (p + "mlp.gate.weight", (SHAPE["num_experts"], h), "matrix"),
    ]
    specs += [(f"{p}self_attn.{n}_proj.weight", (h, h), "matrix") for n in "qkvo"]
    for e in range(SHAPE["num_experts"]):
        specs += [
            (f"{p}mlp.experts.{e}.gate_proj.weight", (inter, h), "matrix"),
            (f"{p}mlp.experts.{e}.up_proj.weight", (inter, h), "matrix"),
            (f"{p}mlp.experts.{e}.down_proj.weight", (h, inter), "matrix"),
        ]
    return specs


def make_checkpoint(layers: int) -> Path:
    """The OLMoE-shaped checkpoint with `layers` layers (cached while its stamp matches)."""
    h, vocab = SHAPE["hidden_size"], SHAPE["vocab_size"]
    shards = {
        "model-embed.safetensors": [
            ("model.embed_tokens.weight", (vocab, h), "matrix"),
            ("lm_head.weight", (vocab, h), "matrix"),
            ("model.norm.weight", (h,), "norm"),
        ]
    }
    shards.update({f"model-layer{i}.safetensors": _layer_specs(i) for i in range(layers)})
    config = {**SHAPE, "num_hidden_layers": layers, "torch_dtype": "bfloat16"}
    return cached_checkpoint(WORK / f"olmoe-shape-{layers}l", config, shards)


def package_both(checkpoint: Path, precision: str) -> dict[str, Path]:
    """The cpu bundle (fused MoE / QMoE) and the cpu bundle with the MoE body inlined."""
    import mobius_genai

    fused = mobius_genai.get_ep("cpu")
    decomposed = dataclasses.replace(fused, name="cpu-decomposed-moe", supports_fused_moe=False)
    bundles = {}
    for label, caps in (("decomposed", decomposed), ("fused", fused)):
        out = WORK / f"moe-{label}-{precision}"
        mobius_genai.package(
            checkpoint, caps, out, precision=precision, force=True, quiet=True, smoke_test=False
        )
        bundles[label] = out
    return bundles


def _feeds(session, prompt: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    heads, head = SHAPE["num_key_value_heads"], SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, SHAPE["vocab_size"], (1, prompt))
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, past + prompt), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(past, past + prompt)[None]
        else:
            feeds[value.name] = rng.standard_normal((1, heads, past, head)).astype(np.float32)
    return feeds


def time_bundle(folder: str, prompt: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Per round: prefill tokens/s and decode tokens/s (thread CPU time, one thread)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(Path(folder) / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    prefill, decode = _feeds(session, prompt, 0), _feeds(session, 1, prompt)
    session.run(None, prefill)
    session.run(None, decode)
    result: dict[str, list[float]] = {"prefill": [], "decode": []}
    for _ in range(rounds):
        started = time.thread_time()
        session.run(None, prefill)
        result["prefill"].append(prompt / (time.thread_time() - started))
        started = time.thread_time()
        for _ in range(steps):
            session.run(None, decode)
        result["decode"].append(steps / (time.thread_time() - started))
    return result


def _rows(precision: str, pooled: dict[str, dict[str, list[float]]]) -> list[str]:
    rows = []
    for metric in ("prefill", "decode"):
        decomposed, fused = pooled["decomposed"][metric], pooled["fused"][metric]
        ratio = statistics.median(f / d for d, f in zip(decomposed, fused, strict=True))
        rows.append(
            f"| {precision} | {metric} | {statistics.median(decomposed):.2f} | "
            f"{statistics.median(fused):.2f} | {ratio:.2f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2, help="processes per bundle")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    parser.add_argument("--prompt", type=int, default=64, help="prefill tokens = KV cache")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(time_bundle(args.child, args.prompt, args.rounds, args.steps)))
        return
    checkpoint = make_checkpoint(args.layers)
    print("| precision | metric | decomposed (tokens/s) | fused (tokens/s) | fused / decomposed |")
    print("|---|---|--:|--:|--:|")
    for precision in args.precisions.split(","):
        bundles = package_both(checkpoint, precision)
        pooled: dict[str, dict[str, list[float]]] = {
            label: {"prefill": [], "decode": []} for label in bundles
        }
        labels = list(bundles)
        for index in range(args.processes):
            for label in labels if index % 2 == 0 else list(reversed(labels)):
                command = [sys.executable, __file__, "--child", str(bundles[label])]
                command += ["--prompt", str(args.prompt), "--rounds", str(args.rounds)]
                command += ["--steps", str(args.steps)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                for key, values in json.loads(done.stdout.splitlines()[-1]).items():
                    pooled[label][key].extend(values)
        print("\n".join(_rows(precision, pooled)), flush=True)
        if not args.keep:
            for folder in bundles.values():
                shutil.rmtree(folder)


if __name__ == "__main__":
    main()
