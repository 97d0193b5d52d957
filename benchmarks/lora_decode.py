"""CPU decode with a LoRA adapter active (og.Adapters) against the same adapter merged into the
weights: what feeding the adapter as graph inputs costs per token.

Both bundles come from one random-weight checkpoint in the Qwen2.5-0.5B shape
(make_qwen25_05b_shape.py) and one random PEFT LoRA adapter on every projection (q/k/v/o,
gate/up/down; `--rank`, written here with numpy in PEFT's layout): `package --adapter` of the
base (LoRA inputs in the graph, `adapters/bench.onnx_adapter`), and `package` of the checkpoint
with the adapter merged (W + alpha/r * B @ A, what `merge_and_unload` gives). One process loads
both on the CPU provider (`--threads`) and times generations as `mobius-genai bench` does
(mobius_genai/bench/speed.py), alternating bundles between rounds: the LoRA bundle with the
adapter active, with none active, and the merged bundle.

    python benchmarks/lora_decode.py [--precision fp32|int4] [--rank 16] [--rounds 5]

Prints the median decode tokens/s of each and the ratios to the merged bundle (below 1: slower
than merged). Numbers depend on the machine's load; say it next to them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from make_qwen25_05b_shape import WORK, make_checkpoint

PROJECTIONS = {
    "self_attn.q_proj": ("hidden", "q"),
    "self_attn.k_proj": ("hidden", "kv"),
    "self_attn.v_proj": ("hidden", "kv"),
    "self_attn.o_proj": ("q", "hidden"),
    "mlp.gate_proj": ("hidden", "intermediate"),
    "mlp.up_proj": ("hidden", "intermediate"),
    "mlp.down_proj": ("intermediate", "hidden"),
}


def make_adapter(checkpoint: Path, out: Path, rank: int, seed: int = 0) -> Path:
    """A PEFT LoRA folder for `checkpoint` with random A and B (float32), alpha = 2 * rank."""
    from safetensors.numpy import save_file

    config = json.loads((checkpoint / "config.json").read_text())
    head = config["hidden_size"] // config["num_attention_heads"]
    sizes = {
        "hidden": config["hidden_size"],
        "q": config["num_attention_heads"] * head,
        "kv": config["num_key_value_heads"] * head,
        "intermediate": config["intermediate_size"],
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in PROJECTIONS.items():
            name = f"base_model.model.model.layers.{layer}.{module}"
            a = rng.normal(0, 0.02, (rank, sizes[fan_in])).astype(np.float32)
            b = rng.normal(0, 0.02, (sizes[fan_out], rank)).astype(np.float32)
            tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = a, b
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    targets = sorted({module.rsplit(".", 1)[-1] for module in PROJECTIONS})
    settings = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets}
    (out / "adapter_config.json").write_text(json.dumps(settings))
    return out


def merge(checkpoint: Path, adapter: Path, out: Path) -> Path:
    """`checkpoint` with `adapter` merged into its weights (bf16, as stored), in `out`."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, out, dirs_exist_ok=True)
    weights = load_file(str(checkpoint / "model.safetensors"))
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    settings = json.loads((adapter / "adapter_config.json").read_text())
    scale = settings["lora_alpha"] / settings["r"]
    for key, a in lora.items():
        if ".lora_A." not in key:
            continue
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        merged = weights[name].float() + scale * (b @ a)
        weights[name] = merged.to(torch.bfloat16)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def time_bundles(lora: Path, merged: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Decode tokens/s of each configuration by wall clock and by the thread's CPU time, round
    by round (runs in a process of its own)."""
    from mobius_genai.bench.speed import load, random_prompt, time_generation
    from mobius_genai.runtime.adapters import load_adapter

    lora_model = load(lora, cpu=True, threads=args.threads)
    merged_model = load(merged, cpu=True, threads=args.threads)
    adapter = load_adapter(lora, lora_model, "bench")
    runs = {
        "adapter active": (lora_model, adapter),
        "no adapter": (lora_model, None),
        "merged": (merged_model, None),
    }
    prompt = random_prompt(1, args.prompt, 151936)
    for model, active in runs.values():
        time_generation(model, prompt, 4, active)  # warm-up
    rates: dict[str, dict[str, list[float]]] = {label: {} for label in runs}
    for index in range(args.rounds):
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        for label in order:
            model, active = runs[label]
            timed = time_generation(model, prompt, args.new, active)
            for clock in ("decode", "decode_cpu"):
                rates[label].setdefault(clock, []).append(timed[clock])
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "int4"], default="fp32")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--reuse", action="store_true", help="time the bundles a previous run left in _work"
    )
    args = parser.parse_args()
    if args.time:
        print(json.dumps(time_bundles(*args.time, args)))
        return
    import mobius_genai

    checkpoint = make_checkpoint("0.5b")
    adapter, merged = WORK / f"lora-r{args.rank}", WORK / f"qwen2.5-0.5b-merged-r{args.rank}"
    if not (args.reuse and merged.is_dir()):
        merge(checkpoint, make_adapter(checkpoint, adapter, args.rank), merged)
    bundles = {label: WORK / f"lora-bench-{label}-{args.precision}" for label in ("lora", "merged")}
    sources = {"lora": (checkpoint, {"bench": adapter}), "merged": (merged, None)}
    for label, (source, adapters) in sources.items():
        if args.reuse and bundles[label].is_dir():
            continue
        mobius_genai.package(
            source,
            "cpu",
            bundles[label],
            precision=args.precision,
            adapters=adapters,
            force=True,
            quiet=True,
            smoke_test=False,
        )
    argv = [sys.executable, __file__, "--time", str(bundles["lora"]), str(bundles["merged"])]
    argv += [f"--{key}={getattr(args, key)}" for key in ("prompt", "new", "rounds", "threads")]
    rates = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    print(f"Qwen2.5-0.5B shape, cpu {args.precision}, LoRA rank {args.rank} on every projection")
    print(
        f"{args.threads} thread(s), prompt {args.prompt}, {args.new} new tokens, medians of "
        f"{args.rounds} rounds; decode tok/s by wall clock and by thread CPU time"
    )
    for clock in ("decode", "decode_cpu"):
        merged_rate = statistics.median(rates["merged"][clock])
        for label, values in rates.items():
            rate = statistics.median(values[clock])
            print(
                f"  {clock:10s} {label:15s} {rate:7.2f} tok/s   ratio to merged "
                f"{rate / merged_rate:.3f}"
            )


if __name__ == "__main__":
    main()
