"""Hybrid decoders on the CPU EP (issue 16): fused recurrent kernels, their bodies, the builder.

Prefill and decode speed of the fused recurrent kernels against their function bodies and
against onnxruntime-genai's builder.

Two checkpoints of random bf16 weights in real hub shapes (written by _random_checkpoint.py
from transformers' own model classes, cached under benchmarks/_work/):

- `lfm2-350m`: LiquidAI/LFM2-350M (16 layers: 10 short-convolution layers and 6 attention
  layers at 2, 5, 8, 10, 12, 14; hidden 1024, MLP 4608, 16 heads / 8 KV heads, a 3-tap conv,
  vocabulary 65536, tied embeddings);
- `qwen3.5-0.8b`: the text decoder of Qwen/Qwen3.5-0.8B (hidden 1024, MLP 3584; gated delta nets
  of 16 key / 16 value heads of 128 with a 4-tap conv; attention with an output gate, 8 heads /
  2 KV heads of 256, rotary on a quarter of each head; vocabulary 248320, tied), its first
  `--layers` layers (default 8: 6 delta nets, 2 attention layers, the model's 3:1 pattern);
- `lfm2-8b-a1b`: LiquidAI/LFM2-8B-A1B (LFM2-MoE: hidden 2048, 32 heads / 8 KV heads, dense
  MLPs of 7168 in the first 2 layers, then 32 experts of 1792, 4 per token, sigmoid routing
  with expert_bias; vocabulary 65536, tied), its first `--layers` layers (default 4: 2 dense,
  2 MoE, one attention layer), the experts stored per expert as the hub has them.

For each precision (fp32, int4), three bundles of the same checkpoint, built in the same run:

- `fused`: `mobius-genai package --ep cpu` (com.microsoft CausalConvWithState and
  LinearAttention run by onnxruntime's kernels);
- `bodies`: the same EP with the CausalConvWithState and LinearAttention kernels off
  (`with_kernels`), so the two Tier-1 functions are inlined into their standard-ONNX bodies (a Scan over the
  tokens for the delta rule) and nothing else changes: the same math (tests/models/families/
  test_qwen3_5.py and test_hybrid.py check both graphs against transformers);
- `builder`: `python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p P -e cpu -c CACHE`.
  Where it fails, its error goes into the table. It refuses a Qwen3.5 text checkpoint
  (Qwen3_5ForCausalLM: "not currently supported"; it reads only the hub's vision-language
  layout, which mobius-genai does not read), so for Qwen3.5 its column is the same decoder
  (config and tensor shapes) in the hub layout, with Qwen3.5-0.8B's vision tower beside it.

Speed: onnxruntime-genai on the CPU EP with one intra-op thread, `--processes` processes per
bundle (one bundle each, taking turns, as compare_builder.py does), `--rounds` rounds of a
`--prompt`-token prefill and `--new` new tokens each after a warm-up; medians of the rounds, by
thread CPU time and wall clock; each ratio is the median of the per-round ratios.

    python benchmarks/hybrid_cpu.py                  # both models, fp32 and int4
    python benchmarks/hybrid_cpu.py --quick          # a few layers, short runs: checks it works
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
from collections import Counter
from pathlib import Path

from _measure import run_measured
from _random_checkpoint import BOS, EOS, WORK, cached_checkpoint, transformers_specs
from compare_builder import builder_command, speed

LFM2_LAYER_TYPES = ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]
QWEN3_5_LAYER_TYPES = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)]
LFM2_MOE_LAYER_TYPES = [
    "full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)
]

#: The keys LFM2's and LFM2-MoE's hub config.json share (token ids: the tiny tokenizer's).
_LFM2_HUB_KEYS = {
    "conv_L_cache": 3,
    "conv_bias": False,
    "norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 128000,
    "tie_embedding": True,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}
#: config.json of each model, as the hub writes it (token ids: the tiny tokenizer's).
CONFIGS: dict[str, dict] = {
    "lfm2-350m": {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "vocab_size": 65536,
        "hidden_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "block_ff_dim": 6656,
        "intermediate_size": 6656,
        "block_auto_adjust_ff_dim": True,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
        "layer_types": LFM2_LAYER_TYPES,
        **_LFM2_HUB_KEYS,
    },
    "qwen3.5-0.8b": {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_act": "silu",
        "attention_bias": False,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "layer_types": QWEN3_5_LAYER_TYPES,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "dtype": "bfloat16",
    },
    "lfm2-8b-a1b": {
        "architectures": ["Lfm2MoeForCausalLM"],
        "model_type": "lfm2_moe",
        "vocab_size": 65536,
        "hidden_size": 2048,
        "intermediate_size": 7168,
        "moe_intermediate_size": 1792,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_dense_layers": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "norm_topk_prob": True,
        "use_expert_bias": True,
        "routed_scaling_factor": 1.0,
        "layer_types": LFM2_MOE_LAYER_TYPES,
        **_LFM2_HUB_KEYS,
    },
}
#: The vision tower of Qwen/Qwen3.5-0.8B's config.json (Qwen3_5VisionConfig's other defaults).
QWEN3_5_0_8B_VISION = {
    "depth": 12,
    "hidden_size": 768,
    "num_heads": 12,
    "intermediate_size": 3072,
    "out_hidden_size": 1024,
    "num_position_embeddings": 2304,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
}


def qwen3_5_hub_layout(text: dict) -> dict:
    """The hub's config.json of Qwen3.5 (model_type qwen3_5, a vision-language model) around the
    text decoder `text`: the layout onnxruntime-genai's builder reads (it refuses
    Qwen3_5ForCausalLM), its decoder's tensors under model.language_model."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {k: v for k, v in text.items() if k != "architectures"},
        "vision_config": {"model_type": "qwen3_5_vision", **QWEN3_5_0_8B_VISION},
        "tie_word_embeddings": text["tie_word_embeddings"],
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
    }


#: Where the builder refuses a model's text checkpoint: the layout it reads instead, with the
#: same decoder (config.json from the text one, and the Auto class transformers builds it with).
BUILDER_LAYOUTS = {"qwen3.5-0.8b": (qwen3_5_hub_layout, "AutoModelForImageTextToText")}
#: Layers benchmarked by default (LFM2-350M whole; Qwen3.5-0.8B's first 8 of 24, same ratio).
DEFAULT_LAYERS = {"lfm2-350m": 16, "qwen3.5-0.8b": 8, "lfm2-8b-a1b": 4}
#: --quick: the first layers, both kinds present.
QUICK_LAYERS = {"lfm2-350m": 3, "qwen3.5-0.8b": 4, "lfm2-8b-a1b": 3}
#: The Tier-1 recurrent ops whose kernels are compared with their bodies.
RECURRENT_OPS = ("CausalConvWithState", "LinearAttention")
METRICS = {
    "prefill_cpu": "prefill tokens/s (CPU time)",
    "decode_cpu": "decode tokens/s (CPU time)",
    "prefill": "prefill tokens/s (wall)",
    "decode": "decode tokens/s (wall)",
}


def make_checkpoint(model: str, layers: int, builder_layout: bool = False) -> Path:
    """The model's checkpoint with its first `layers` layers (cached while its stamp matches);
    `builder_layout`: the same decoder in the layout of BUILDER_LAYOUTS."""
    config = dict(CONFIGS[model])
    config["num_hidden_layers"] = layers
    config["layer_types"] = config["layer_types"][:layers]
    folder = WORK / f"{model}-shape-{layers}l"
    if not builder_layout:
        return cached_checkpoint(folder, config, _per_expert(transformers_specs(config)))
    layout, auto_class = BUILDER_LAYOUTS[model]
    config = layout(config)
    specs = transformers_specs(config, auto_class)
    return cached_checkpoint(folder.with_name(folder.name + "-hub-layout"), config, specs)


def _per_expert(specs: list) -> list:
    """LFM2-MoE's experts as the hub stores them (`experts.{e}.w1` / `w3` / `w2` and the
    routing's `expert_bias`) in place of transformers' fused in-memory parameters."""
    out = []
    for name, shape, kind in specs:
        base, _, part = name.rpartition(".experts.")
        if part == "gate_up_proj":
            experts, rows, hidden = shape
            out += [(f"{base}.expert_bias", (experts,), "matrix")]
            out += [
                (f"{base}.experts.{e}.{w}.weight", (rows // 2, hidden), kind)
                for e in range(experts)
                for w in ("w1", "w3")
            ]
        elif part == "down_proj":
            out += [(f"{base}.experts.{e}.w2.weight", shape[1:], kind) for e in range(shape[0])]
        else:
            out.append((name, shape, kind))
    return out


def recurrent_op_counts(bundle: Path) -> dict[str, int]:
    """How many nodes of each Tier-1 recurrent op the bundle's graph has (weights not loaded)."""
    import onnx

    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in RECURRENT_OPS}


def build_ours(checkpoint: Path, precision: str, prefix: str) -> dict[str, Path]:
    """The cpu bundle (fused kernels) and the same EP with the recurrent bodies inlined."""
    import mobius_genai

    fused = mobius_genai.get_ep("cpu")
    bodies = dataclasses.replace(
        fused.with_kernels({"CausalConvWithState": False, "LinearAttention": False}),
        name="cpu-recurrent-bodies",
    )
    bundles = {}
    for label, caps in (("fused", fused), ("bodies", bodies)):
        out = WORK / f"{prefix}-{label}-{precision}"
        mobius_genai.package(
            checkpoint, caps, out, precision=precision, force=True, quiet=True, smoke_test=False
        )
        print(f"  {label}: {recurrent_op_counts(out)}", flush=True)
        bundles[label] = out
    return bundles


def build_builder(checkpoint: Path, precision: str, prefix: str) -> Path | str:
    """onnxruntime-genai's builder's bundle, or its error (the last line it printed)."""
    out = WORK / f"{prefix}-builder-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    done = run_measured(builder_command(checkpoint, out, precision), cwd=WORK)
    if done.returncode == 0:
        print(
            f"  builder: {recurrent_op_counts(out)}; {done.wall_s:.0f} s, peak RSS "
            f"{done.peak_rss_mib:,.0f} MiB",
            flush=True,
        )
        return out
    lines = [line.strip() for line in done.output.splitlines() if line.strip()]
    shutil.rmtree(out, ignore_errors=True)
    error = lines[-1] if lines else f"exit code {done.returncode}"
    return error.replace(str(checkpoint), checkpoint.name)


def _ratio(ours: list[float], reference: list[float]) -> str:
    return f"{statistics.median(a / b for a, b in zip(ours, reference, strict=True)):.2f}"


def rows(model: str, precision: str, pooled: dict[str, dict], builder_note: str) -> list[str]:
    """Table rows of one model and precision: medians and the ratios of fused to the others."""
    lines = []
    for key, label in METRICS.items():
        values = {name: pooled[name][key] for name in pooled}
        cells = [f"{statistics.median(values[name]):.1f}" for name in ("fused", "bodies")]
        cells.append(f"{statistics.median(values['builder']):.1f}" if "builder" in values else "")
        cells.append(_ratio(values["fused"], values["bodies"]))
        cells.append(_ratio(values["fused"], values["builder"]) if "builder" in values else "")
        lines.append(f"| {model} | {precision} | {label} | " + " | ".join(cells) + " |")
    if builder_note:
        lines.append(f"| {model} | {precision} | builder: {builder_note} | | | | | |")
    return lines


def run_model(model: str, layers: int, args: argparse.Namespace) -> list[str]:
    checkpoint = make_checkpoint(model, layers)
    print(f"{model}: {checkpoint} ({layers} layers)", flush=True)
    lines = []
    for precision in args.precisions.split(","):
        print(f"{model} {precision}: building", flush=True)
        bundles = build_ours(checkpoint, precision, model)
        builder, note = build_builder(checkpoint, precision, model), ""
        if isinstance(builder, str):
            print(f"  builder failed: {builder}", flush=True)
            note = f"failed on this checkpoint: `{builder}`"
            if model in BUILDER_LAYOUTS:
                hub = make_checkpoint(model, layers, builder_layout=True)
                builder = build_builder(hub, precision, model)
                note += f"; its column: the same decoder in the hub layout ({hub.name})"
                if isinstance(builder, str):
                    print(f"  builder failed: {builder}", flush=True)
                    note += f", which failed too: `{builder}`"
        if not isinstance(builder, str):
            bundles["builder"] = builder
        print(f"{model} {precision}: running ({args.processes} x {args.rounds} rounds)", flush=True)
        results = speed(list(bundles.values()), args)
        pooled = {label: results[str(folder)] for label, folder in bundles.items()}
        lines += rows(model, precision, pooled, note)
        print("\n".join(lines[-len(METRICS) - bool(note) :]), flush=True)
        if not args.keep:
            for folder in bundles.values():
                shutil.rmtree(folder)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument("--precisions", default="fp32,int4", help="comma-separated: fp32,int4")
    parser.add_argument(
        "--layers",
        action="append",
        default=[],
        metavar="MODEL=N",
        help="the model's first N layers (default: lfm2-350m=16, qwen3.5-0.8b=8, lfm2-8b-a1b=4)",
    )
    parser.add_argument("--processes", type=int, default=2, help="speed processes per bundle")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds per process")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (prefill)")
    parser.add_argument("--new", type=int, default=64, help="new tokens (decode)")
    parser.add_argument("--quick", action="store_true", help="few layers, short runs")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    args = parser.parse_args()
    layers = dict(QUICK_LAYERS if args.quick else DEFAULT_LAYERS)
    layers.update({k: int(v) for k, _, v in (item.partition("=") for item in args.layers)})
    if args.quick:
        args.processes, args.rounds, args.prompt, args.new = 1, 1, 16, 4
    lines = []
    for model in args.models.split(","):
        lines += run_model(model, layers[model], args)
    print(
        f"\nprompt {args.prompt} tokens, {args.new} new tokens, 1 thread, "
        f"{args.processes} x {args.rounds} rounds per bundle; layers {layers}"
    )
    print(
        "| model | precision | metric | fused | bodies | builder | fused / bodies | fused / builder |"
    )
    print("|---|---|---|--:|--:|--:|--:|--:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
