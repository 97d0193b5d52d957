"""A bf16 checkpoint with random weights in the real Qwen2.5-0.5B (or 7B) shapes, made locally.

The benchmark needs a checkpoint of a real size without downloading one. This writes
`model.safetensors` (bf16, deterministic for a seed), `config.json`, `generation_config.json`
and the tokenizer files of tests/data/tiny-qwen2, streaming and cached as _random_checkpoint.py
does (generating even the 7B shape, ~15 GB, needs a few tens of MB of memory).

    python benchmarks/make_qwen25_05b_shape.py                # -> benchmarks/_work/qwen2.5-0.5b-shape
    python benchmarks/make_qwen25_05b_shape.py --shape 7b --out /tmp/qwen7b
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _random_checkpoint import BOS, EOS, WORK, Spec, cached_checkpoint

#: The architectures of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-7B (their config.json, token ids aside).
SHAPES: dict[str, dict] = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_window_layers": 24,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "max_window_layers": 28,
    },
}
DEFAULT_FOLDERS = {"0.5b": WORK / "qwen2.5-0.5b-shape", "7b": WORK / "qwen2.5-7b-shape"}


def hf_config(shape: str) -> dict:
    """config.json of the shape (Qwen2ForCausalLM, bf16, rope_theta 1e6, 32K positions)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "model_type": "qwen2",
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        **SHAPES[shape],
    }


def tensor_specs(config: dict) -> list[Spec]:
    """(name, shape, kind) of every checkpoint tensor; kind is "matrix", "bias" or "norm"."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    specs = [("model.embed_tokens.weight", (config["vocab_size"], hidden), "matrix")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (hidden,), "norm"),
            (p + "self_attn.q_proj.weight", (q, hidden), "matrix"),
            (p + "self_attn.q_proj.bias", (q,), "bias"),
            (p + "self_attn.k_proj.weight", (kv, hidden), "matrix"),
            (p + "self_attn.k_proj.bias", (kv,), "bias"),
            (p + "self_attn.v_proj.weight", (kv, hidden), "matrix"),
            (p + "self_attn.v_proj.bias", (kv,), "bias"),
            (p + "self_attn.o_proj.weight", (hidden, q), "matrix"),
            (p + "post_attention_layernorm.weight", (hidden,), "norm"),
            (p + "mlp.gate_proj.weight", (inter, hidden), "matrix"),
            (p + "mlp.up_proj.weight", (inter, hidden), "matrix"),
            (p + "mlp.down_proj.weight", (hidden, inter), "matrix"),
        ]
    specs.append(("model.norm.weight", (hidden,), "norm"))
    if not config["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (config["vocab_size"], hidden), "matrix"))
    return specs


def make_checkpoint(shape: str = "0.5b", out: Path | None = None, seed: int = 0) -> Path:
    """The checkpoint folder for `shape`, generated unless a matching one is already there."""
    folder = Path(out) if out is not None else DEFAULT_FOLDERS[shape]
    config = hf_config(shape)
    generation = {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False}
    return cached_checkpoint(
        folder, config, tensor_specs(config), seed, {"generation_config.json": generation}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder (default: benchmarks/_work/...)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_checkpoint(args.shape, args.out, args.seed))


if __name__ == "__main__":
    main()
