"""Checkpoints with random weights in the real shapes of two MoE models, fewer layers, made locally.

- `qwen3-30b-a3b`: Qwen/Qwen3-30B-A3B's config.json (hidden 2048, 128 experts of intermediate
  768, 8 per token renormalized, 32 query heads and 4 KV heads of 128 with q/k norms, vocab
  151936, untied; 48 layers). bf16, as published: ~1.2 GiB per layer, 1.2 GiB of embedding and
  LM head.
- `gpt-oss-20b`: openai/gpt-oss-20b's config.json (hidden 2880, 32 experts of intermediate 2880,
  4 per token, 64 query heads and 8 KV heads of 64 with sinks and biases, layers alternating
  sliding (window 128) and full attention from a sliding one, yarn rope, vocab 201088, untied;
  24 layers). Experts in MXFP4 blocks as published (`quant_method: mxfp4`: the builder's int4
  path reads those blocks), the rest bf16: ~0.4 GiB per layer, 2.2 GiB of embedding and LM head.

`layers` is the number of layers written (config.json says so); each layer is a shard of its own
(written by _random_checkpoint.py, with tests/data/tiny-qwen2's 384-token tokenizer), cached under
benchmarks/_work/ while its stamp matches.

`--sparse-experts N` (qwen3-30b-a3b only) draws the first N experts of each layer at random and
leaves the others' tensors as zeros in file holes (sparse files: ~0.19 GiB of disk per layer for
N=16 instead of 1.13), so all 48 layers fit a disk that the dense checkpoint does not. Reading a
hole fills page cache pages with zeros like reading data does (measured: benchmarks/README.md),
so packaging it costs the same memory; only the zero experts' values differ.

    python benchmarks/make_moe_shape.py qwen3-30b-a3b --layers 6
    python benchmarks/make_moe_shape.py qwen3-30b-a3b --layers 48 --sparse-experts 16
    python benchmarks/make_moe_shape.py gpt-oss-20b --layers 2 --vocab 32000

`--vocab N` writes N tokens of embedding and LM head instead of the model's vocabulary (the
tokenizer's 384 ids stay valid for N >= 384): the real layer shapes with smaller files, bundles
and builder memory (gpt-oss-20b's 201088 x 2880 tables are 2.2 GiB each at float32).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _random_checkpoint import BOS, EOS, HOLE, WORK, Spec, cached_checkpoint

#: config.json of each model (token ids aside: the tiny tokenizer's), num_hidden_layers set later.
CONFIGS: dict[str, dict] = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "experts_per_token": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 2880,
        "max_position_embeddings": 131072,
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_key_value_heads": 8,
        "num_local_experts": 32,
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 201088,
    },
}
#: The number of layers of the published models.
FULL_LAYERS = {"qwen3-30b-a3b": 48, "gpt-oss-20b": 24}


def hf_config(shape: str, layers: int, vocab: int | None = None) -> dict:
    """The config.json with `layers` layers (and `vocab` tokens when given, else the model's)."""
    config = {**CONFIGS[shape], "num_hidden_layers": layers, "bos_token_id": BOS}
    if vocab is not None:
        config["vocab_size"] = vocab
    config |= {"eos_token_id": EOS, "pad_token_id": EOS}
    if shape == "gpt-oss-20b":
        kinds = ("sliding_attention", "full_attention")
        config["layer_types"] = [kinds[i % 2] for i in range(layers)]
    return config


def _attention(config: dict, p: str, bias: bool) -> list[Spec]:
    hidden, head = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    specs: list[Spec] = []
    for name, rows, columns in (("q", q, hidden), ("k", kv, hidden), ("v", kv, hidden)):
        specs.append((f"{p}self_attn.{name}_proj.weight", (rows, columns), "matrix"))
        if bias:
            specs.append((f"{p}self_attn.{name}_proj.bias", (rows,), "bias"))
    specs.append((f"{p}self_attn.o_proj.weight", (hidden, q), "matrix"))
    if bias:
        specs.append((f"{p}self_attn.o_proj.bias", (hidden,), "bias"))
    return specs


def _qwen3_moe_layer(config: dict, p: str, random_experts: int | None) -> list[Spec]:
    """One layer; experts from `random_experts` on (all drawn when None) are holes."""
    hidden, inter, experts = (
        config["hidden_size"],
        config["moe_intermediate_size"],
        config["num_experts"],
    )
    specs: list[Spec] = [(p + "input_layernorm.weight", (hidden,), "norm")]
    specs += _attention(config, p, bias=False)
    specs += [(f"{p}self_attn.{n}_norm.weight", (config["head_dim"],), "norm") for n in "qk"]
    specs += [
        (p + "post_attention_layernorm.weight", (hidden,), "norm"),
        (p + "mlp.gate.weight", (experts, hidden), "matrix"),
    ]
    for e in range(experts):
        kind = HOLE if random_experts is not None and e >= random_experts else "matrix"
        specs += [
            (f"{p}mlp.experts.{e}.gate_proj.weight", (inter, hidden), kind),
            (f"{p}mlp.experts.{e}.up_proj.weight", (inter, hidden), kind),
            (f"{p}mlp.experts.{e}.down_proj.weight", (hidden, inter), kind),
        ]
    return specs


def _gpt_oss_layer(config: dict, p: str, random_experts: int | None) -> list[Spec]:
    hidden, inter, experts = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_local_experts"],
    )
    if random_experts is not None:
        raise ValueError("sparse experts: qwen3-30b-a3b only (gpt-oss-20b's are MXFP4 bytes)")
    x = p + "mlp.experts."
    specs: list[Spec] = [(p + "input_layernorm.weight", (hidden,), "norm")]
    specs += _attention(config, p, bias=True)
    specs += [
        (p + "self_attn.sinks", (config["num_attention_heads"],), "bias"),
        (p + "post_attention_layernorm.weight", (hidden,), "norm"),
        (p + "mlp.router.weight", (experts, hidden), "matrix"),
        (p + "mlp.router.bias", (experts,), "bias"),
        (x + "gate_up_proj_blocks", (experts, 2 * inter, hidden // 32, 16), "fp4"),
        (x + "gate_up_proj_scales", (experts, 2 * inter, hidden // 32), "e8m0"),
        (x + "gate_up_proj_bias", (experts, 2 * inter), "bias"),
        (x + "down_proj_blocks", (experts, hidden, inter // 32, 16), "fp4"),
        (x + "down_proj_scales", (experts, hidden, inter // 32), "e8m0"),
        (x + "down_proj_bias", (experts, hidden), "bias"),
    ]
    return specs


_LAYERS = {"qwen3-30b-a3b": _qwen3_moe_layer, "gpt-oss-20b": _gpt_oss_layer}


def shards(config: dict, shape: str, sparse_experts: int | None = None) -> dict[str, list[Spec]]:
    """The checkpoint's shards: embedding, final norm and LM head, then one per layer (only the
    first `sparse_experts` experts of each drawn, when given; the others are holes)."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    result: dict[str, list[Spec]] = {
        "model-embed.safetensors": [
            ("model.embed_tokens.weight", (vocab, hidden), "matrix"),
            ("model.norm.weight", (hidden,), "norm"),
            ("lm_head.weight", (vocab, hidden), "matrix"),
        ]
    }
    for i in range(config["num_hidden_layers"]):
        layer = _LAYERS[shape](config, f"model.layers.{i}.", sparse_experts)
        result[f"model-layer{i:02d}.safetensors"] = layer
    return result


def folder_for(
    shape: str, layers: int, sparse_experts: int | None = None, vocab: int | None = None
) -> Path:
    sparse = "" if sparse_experts is None else f"-sparse{sparse_experts}"
    tokens = "" if vocab is None else f"-vocab{vocab}"
    return WORK / f"{shape}-shape-{layers}l{sparse}{tokens}"


def make_checkpoint(
    shape: str,
    layers: int,
    out: Path | None = None,
    seed: int = 0,
    sparse_experts: int | None = None,
    vocab: int | None = None,
) -> Path:
    """The checkpoint folder, generated unless a matching one is already there."""
    config = hf_config(shape, layers, vocab)
    generation = {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False}
    folder = Path(out) if out is not None else folder_for(shape, layers, sparse_experts, vocab)
    extra = {"generation_config.json": generation}
    specs = shards(config, shape, sparse_experts)
    return cached_checkpoint(folder, config, specs, seed, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sparse-experts",
        type=int,
        default=None,
        metavar="N",
        help="draw only the first N experts of each layer, the rest zeros in file holes",
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=None,
        metavar="N",
        help="N tokens in the embedding and LM head instead of the model's (smaller files)",
    )
    args = parser.parse_args()
    print(
        make_checkpoint(
            args.shape, args.layers, args.out, args.seed, args.sparse_experts, args.vocab
        )
    )


if __name__ == "__main__":
    main()
