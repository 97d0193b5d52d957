"""Mamba2 + MoE and latent-attention + MoE decoders to cpu int4 (issue 35): packaging peak RSS,
bundle size and onnxruntime-genai's decode speed, against onnxruntime-genai's builder where it
builds the same checkpoint.

Three checkpoints of random bf16 weights in real widths, fewer layers, with the hub's tensor
names (written by _random_checkpoint.py from transformers' model class for the config, its
names mapped back to the ones the hub's safetensors use; cached under benchmarks/_work/):

- `granite-4.0-h-tiny`: ibm-granite/granite-4.0-h-tiny's config.json (hidden 1536; Mamba2
  layers of 48 heads of 64 over one group of a 128-wide state, a 4-tap conv; attention layers
  of 12 heads / 4 KV heads without rotary; 64 experts of 512, 6 per token, beside a shared MLP
  of 1024; granite's multipliers; vocabulary 100352, tied), its first `--layers` layers
  (default 6: five Mamba2 layers, then its first attention layer). Hub names: the experts as
  `block_sparse_moe.input_linear` / `output_linear`, the router as `router.layer`.
- `deepseek-v2-lite`: deepseek-ai/DeepSeek-V2-Lite's config.json (hidden 2048; multi-head
  latent attention of 16 heads, a 512-wide latent, rotary on 64 of each head's 192 q/k
  channels, yarn x40; the first layer dense (10944), then MoE: 64 experts of 1408, 6 per token,
  softmax, 2 shared experts; vocabulary 102400, untied), its first `--layers` layers (default
  2: the dense one and one MoE layer). Hub names: one tensor per expert and projection.
- `nemotron-3-nano`: NVIDIA-Nemotron-3-Nano-30B-A3B's widths (hidden 2688; the 52-layer pattern
  of 23 Mamba2, 23 MoE and 6 attention layers; Mamba2 layers of 64 heads of 64 over 8 groups of
  a 128-wide state; 128 relu2 experts of 1856, 6 per token, sigmoid routing with the
  correction bias scaled by 2.5, a relu2 shared expert of 3712; attention of 32 heads / 2 KV
  heads of 128; vocabulary 131072, untied), its first `--layers` layers (default 6: three
  Mamba2 layers, two MoE layers, its first attention layer; og's decoder needs one layer with
  a KV cache). Hub names: under `backbone.`, one tensor per expert and projection, the
  router's `e_score_correction_bias` (a buffer, not a parameter, in transformers' class).

Per checkpoint: `mobius-genai package CKPT --ep cpu --precision int4 --int4-quality builder
--no-smoke-test` (the builder's RTN recipe: the same work as the builder's int4) and
`python -m onnxruntime_genai.models.builder -i CKPT -p int4 -e cpu`, each timed with the peak
RSS of its process tree (_measure.py); where the builder fails, its last line is printed and
the speed table has our bundle alone. Speed: compare_builder.py's `speed` (onnxruntime-genai,
one intra-op thread, `--processes` processes per bundle taking turns, `--rounds` rounds of a
`--prompt`-token prefill and `--new` new tokens; medians, CPU time of the generating thread).

    python benchmarks/hybrid_moe_int4.py                  # all three, ~40 minutes on a loaded machine
    python benchmarks/hybrid_moe_int4.py --models granite-4.0-h-tiny --layers 2
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
from pathlib import Path

from _measure import folder_mib, run_measured
from _random_checkpoint import BOS, EOS, WORK, Spec, cached_checkpoint, transformers_specs
from compare_builder import builder_command, ours_command, speed

_TOKENS = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": 0}
_GRANITE_LAYERS = ["attention" if i % 10 == 5 else "mamba" for i in range(40)]

#: config.json of each model as the hub has it (token ids: the tiny tokenizer's).
CONFIGS: dict[str, dict] = {
    "granite-4.0-h-tiny": {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_multiplier": 0.0078125,
        "embedding_multiplier": 12.0,
        "hidden_act": "silu",
        "hidden_size": 1536,
        "intermediate_size": 512,
        "layer_types": _GRANITE_LAYERS,
        "logits_scaling": 6.0,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_d_conv": 4,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_expand": 2,
        "mamba_n_groups": 1,
        "mamba_n_heads": 48,
        "mamba_proj_bias": False,
        "max_position_embeddings": 131072,
        "normalization_function": "rmsnorm",
        "num_attention_heads": 12,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 40,
        "num_key_value_heads": 4,
        "num_local_experts": 64,
        "position_embedding_type": "nope",
        "residual_multiplier": 0.22,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000,
        "shared_intermediate_size": 1024,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 100352,
        **_TOKENS,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 102400,
        **_TOKENS,
    },
}
CONFIGS["nemotron-3-nano"] = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "attention_bias": False,
    "chunk_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "head_dim": 128,
    "hidden_size": 2688,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 64,
    "max_position_embeddings": 262144,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1,
    "n_groups": 8,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 52,
    "num_key_value_heads": 2,
    "routed_scaling_factor": 2.5,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_conv_bias": True,
    "vocab_size": 131072,
    **_TOKENS,
}
DEFAULT_LAYERS = {"granite-4.0-h-tiny": 6, "deepseek-v2-lite": 2, "nemotron-3-nano": 6}

#: transformers 5's parameter names → the hub's, where they differ (its conversion mapping,
#: undone): Granite's fused experts and router.
_GRANITE_HUB = (
    (r"\.experts\.gate_up_proj$", ".input_linear.weight"),
    (r"\.experts\.down_proj$", ".output_linear.weight"),
    (r"\.block_sparse_moe\.router\.weight$", ".block_sparse_moe.router.layer.weight"),
)


def granite_hub_specs(specs: list[Spec]) -> list[Spec]:
    """Granite-4.0-H's tensors under the names its hub checkpoints use."""
    renamed = []
    for name, shape, kind in specs:
        for pattern, replacement in _GRANITE_HUB:
            name = re.sub(pattern, replacement, name)
        renamed.append((name, shape, kind))
    return renamed


def deepseek_hub_specs(specs: list[Spec]) -> list[Spec]:
    """DeepSeek-V2's tensors as its hub checkpoints store them: one tensor per expert and
    projection (transformers 5 fuses each layer's experts into gate_up_proj and down_proj)."""
    split: list[Spec] = []
    for name, shape, kind in specs:
        base, _, part = name.rpartition(".experts.")
        if part == "gate_up_proj":
            experts, rows, hidden = shape
            for e in range(experts):
                split += [
                    (f"{base}.experts.{e}.{p}_proj.weight", (rows // 2, hidden), kind)
                    for p in ("gate", "up")
                ]
        elif part == "down_proj":
            experts, hidden, inter = shape
            split += [
                (f"{base}.experts.{e}.down_proj.weight", (hidden, inter), kind)
                for e in range(experts)
            ]
        else:
            split.append((name, shape, kind))
    return split


def nemotron_hub_specs(specs: list[Spec]) -> list[Spec]:
    """Nemotron-H's tensors as its hub checkpoints store them: under `backbone.`, one tensor
    per expert and projection (transformers 5 stacks `experts.up_proj` [E, I, H] and
    `experts.down_proj` [E, H, I]), and each router's correction bias."""
    hub: list[Spec] = []
    for name, shape, kind in specs:
        name = re.sub(r"^model\.", "backbone.", name)
        base, _, part = name.rpartition(".experts.")
        if part in ("up_proj", "down_proj"):
            hub += [(f"{base}.experts.{e}.{part}.weight", shape[1:], kind) for e in range(shape[0])]
            continue
        hub.append((name, shape, kind))
        if name.endswith(".mixer.gate.weight"):
            hub.append((name.replace(".weight", ".e_score_correction_bias"), shape[:1], kind))
    return hub


HUB_SPECS = {
    "granite-4.0-h-tiny": granite_hub_specs,
    "deepseek-v2-lite": deepseek_hub_specs,
    "nemotron-3-nano": nemotron_hub_specs,
}


def make_checkpoint(model: str, layers: int) -> Path:
    """The model's first `layers` layers with the hub's tensor names (cached)."""
    config = {**CONFIGS[model], "num_hidden_layers": layers}
    for key in ("layer_types", "hybrid_override_pattern"):
        if key in config:
            config[key] = config[key][:layers]
    specs = HUB_SPECS[model](transformers_specs(config))
    return cached_checkpoint(WORK / f"{model}-shape-{layers}l", config, specs)


def _build(label: str, command: list[str], out: Path) -> tuple[Path | None, str]:
    """(the bundle, or None and the tool's last line) and a line of time, RSS and size."""
    shutil.rmtree(out, ignore_errors=True)
    done = run_measured(command, cwd=WORK)
    line = f"{label}: {done.wall_s:.0f} s, peak RSS {done.peak_rss_mib:,.0f} MiB"
    if done.returncode == 0:
        return out, f"{line}, bundle {folder_mib(out):,.0f} MiB"
    lines = [text.strip() for text in done.output.splitlines() if text.strip()]
    shutil.rmtree(out, ignore_errors=True)
    return None, f"{line}, failed: {lines[-1] if lines else done.returncode}"


def run_model(model: str, layers: int, args: argparse.Namespace) -> list[str]:
    checkpoint = make_checkpoint(model, layers)
    print(f"{model}: {checkpoint} ({layers} layers, {folder_mib(checkpoint):,.0f} MiB)")
    ours, note = _build(
        "mobius-genai",
        ours_command(checkpoint, WORK / f"{model}-ours", "int4", False),
        WORK / f"{model}-ours",
    )
    print(f"  {note}", flush=True)
    if ours is None:
        return [f"| {model} | {note} | | | |"]
    builder, builder_note = _build(
        "builder",
        builder_command(checkpoint, WORK / f"{model}-builder", "int4"),
        WORK / f"{model}-builder",
    )
    print(f"  {builder_note}", flush=True)
    bundles = [ours] if builder is None else [ours, builder]
    pooled = speed(bundles, args)
    lines = []
    for metric, label in (("prefill_cpu", "prefill"), ("decode_cpu", "decode")):
        values = [pooled[str(folder)][metric] for folder in bundles]
        cells = [f"{statistics.median(v):.1f}" for v in values] + [""] * (2 - len(values))
        ratio = ""
        if builder is not None:
            ratio = f"{statistics.median(a / b for a, b in zip(*values, strict=True)):.2f}"
        lines.append(f"| {model} | {label} tokens/s | " + " | ".join([*cells, ratio]) + " |")
    if builder is None:
        lines.append(f"| {model} | {builder_note} | | | |")
    if not args.keep:
        for folder in bundles:
            shutil.rmtree(folder)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument("--layers", type=int, help="layers of every model (default: per model)")
    parser.add_argument("--processes", type=int, default=2, help="speed processes per bundle")
    parser.add_argument("--rounds", type=int, default=2, help="speed rounds per process")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens (prefill)")
    parser.add_argument("--new", type=int, default=32, help="new tokens (decode)")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    args = parser.parse_args()
    lines = []
    for model in args.models.split(","):
        lines += run_model(model, args.layers or DEFAULT_LAYERS[model], args)
    print(
        f"\nprompt {args.prompt}, {args.new} new tokens, 1 thread, {args.processes} x "
        f"{args.rounds} rounds per bundle (CPU time)"
    )
    print("| model | metric | mobius-genai int4 | builder int4 | ours / builder |")
    print("|---|---|--:|--:|--:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
