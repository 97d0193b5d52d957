"""A bf16 checkpoint with random weights in the real Qwen2.5-0.5B (or 7B) shapes, made locally.

The benchmark needs a checkpoint of a real size without downloading one. This writes
`model.safetensors` (bf16, deterministic for a seed), `config.json`, `generation_config.json`
and the tokenizer files of tests/data/tiny-qwen2 (384 tokens: speed does not depend on the
tokenizer, and both builders only need one that loads). Tensors are written one after another
in chunks of rows, so generating even the 7B shape (~15 GB) needs a few tens of MB of memory.

The result is cached: a folder whose `stamp.json` matches the requested shape and seed is reused.

    python benchmarks/make_qwen25_05b_shape.py                # -> benchmarks/_work/qwen2.5-0.5b-shape
    python benchmarks/make_qwen25_05b_shape.py --shape 7b --out /tmp/qwen7b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
TOKENIZER = HERE.parent / "tests" / "data" / "tiny-qwen2"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
)
#: Token ids of the tiny tokenizer's <|endoftext|> and <|im_end|>.
BOS, EOS = 381, 383
GENERATOR_VERSION = 1

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

#: Elements generated at a time: bounds the generator's own memory.
_CHUNK_ELEMENTS = 1 << 22


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


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
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


def _bf16_chunks(
    shape: tuple[int, ...], kind: str, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """The tensor's bf16 bits (uint16, little-endian), a few million elements at a time.

    Matrices and biases are N(0, 0.02); norm weights are 1 + N(0, 0.02). bf16 is the top half
    of the float32 (truncation; the weights are random anyway).
    """
    total = int(np.prod(shape))
    for start in range(0, total, _CHUNK_ELEMENTS):
        count = min(_CHUNK_ELEMENTS, total - start)
        values = rng.standard_normal(count, dtype=np.float32)
        values *= np.float32(0.02)
        if kind == "norm":
            values += np.float32(1.0)
        yield (values.view(np.uint32) >> 16).astype("<u2")


def write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...], str]], seed: int) -> None:
    """Write every tensor of `specs` as BF16 into one safetensors file, streaming."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in specs:
        size = int(np.prod(shape)) * 2
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as stream:
        stream.write(len(encoded).to_bytes(8, "little"))
        stream.write(encoded)
        for index, (_, shape, kind) in enumerate(specs):
            rng = np.random.default_rng([seed, index])
            for chunk in _bf16_chunks(shape, kind, rng):
                stream.write(chunk.tobytes())
    os.replace(partial, path)


def _stamp(shape: str, seed: int) -> dict:
    config = hf_config(shape)
    digest = hashlib.sha256(json.dumps([config, seed], sort_keys=True).encode()).hexdigest()
    return {"generator_version": GENERATOR_VERSION, "shape": shape, "seed": seed, "config": digest}


def make_checkpoint(shape: str = "0.5b", out: Path | None = None, seed: int = 0) -> Path:
    """The checkpoint folder for `shape`, generated unless a matching one is already there."""
    folder = Path(out) if out is not None else DEFAULT_FOLDERS[shape]
    stamp = _stamp(shape, seed)
    stamp_file = folder / "stamp.json"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    config = hf_config(shape)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, folder / name)
    write_safetensors(folder / "model.safetensors", tensor_specs(config), seed)
    stamp_file.write_text(json.dumps(stamp) + "\n")  # last: marks the folder complete
    return folder


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
