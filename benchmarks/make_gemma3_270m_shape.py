"""A bf16 checkpoint with random weights in the real Gemma 3 270M shape, made locally.

Written and cached by _random_checkpoint.py, like make_qwen25_05b_shape.py: the
architecture of google/gemma-3-270m (18 layers, hidden 640, 4 heads and 1 kv head of 256, per-head
q/k norms, 5 sliding layers per global one, a tied 262,144-token embedding), ~540 MB of bf16,
cached in benchmarks/_work/gemma3-270m-shape.

    python benchmarks/make_gemma3_270m_shape.py
"""

from __future__ import annotations

from pathlib import Path

from _random_checkpoint import BOS, EOS, WORK, Spec, cached_checkpoint

FOLDER = WORK / "gemma3-270m-shape"
LAYERS = 18
SLIDING_PATTERN = 6  # every sixth layer attends globally

#: config.json of google/gemma-3-270m as transformers 5 writes it (token ids aside).
CONFIG: dict = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "layer_types": [
        "full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
        for i in range(LAYERS)
    ],
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": 0,
    "dtype": "bfloat16",
}


def tensor_specs() -> list[Spec]:
    """(name, shape, kind) of every checkpoint tensor; kind is "matrix" or "norm"."""
    hidden, inter, head_dim = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["head_dim"]
    q, kv = CONFIG["num_attention_heads"] * head_dim, CONFIG["num_key_value_heads"] * head_dim
    specs = [("model.embed_tokens.weight", (CONFIG["vocab_size"], hidden), "matrix")]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        norms = ("input", "post_attention", "pre_feedforward", "post_feedforward")
        specs += [(f"{p}{n}_layernorm.weight", (hidden,), "norm") for n in norms]
        specs += [
            (p + "self_attn.q_proj.weight", (q, hidden), "matrix"),
            (p + "self_attn.k_proj.weight", (kv, hidden), "matrix"),
            (p + "self_attn.v_proj.weight", (kv, hidden), "matrix"),
            (p + "self_attn.o_proj.weight", (hidden, q), "matrix"),
            (p + "self_attn.q_norm.weight", (head_dim,), "norm"),
            (p + "self_attn.k_norm.weight", (head_dim,), "norm"),
            (p + "mlp.gate_proj.weight", (inter, hidden), "matrix"),
            (p + "mlp.up_proj.weight", (inter, hidden), "matrix"),
            (p + "mlp.down_proj.weight", (hidden, inter), "matrix"),
        ]
    specs.append(("model.norm.weight", (hidden,), "norm"))
    return specs


def make_checkpoint(out: Path | None = None, seed: int = 0) -> Path:
    """The checkpoint folder, generated unless a matching one is already there."""
    return cached_checkpoint(Path(out) if out is not None else FOLDER, CONFIG, tensor_specs(), seed)


if __name__ == "__main__":
    print(make_checkpoint())
