"""Write ``tests/data/tiny-qwen2/``: a tiny random-weight Qwen2 checkpoint in hub layout.

The output mirrors what a real hub checkpoint (e.g. Qwen2.5-0.5B-Instruct) ships:

- ``config.json`` in the transformers-4 hub layout (``torch_dtype``, ``rope_theta``,
  ``rope_scaling: null``), written by hand rather than by transformers 5's ``save_pretrained``
  (which writes ``dtype`` and ``rope_parameters`` instead);
- ``model.safetensors`` in bfloat16 with tied embeddings (no ``lm_head.weight``);
- a ByteLevel BPE tokenizer trained here with ``tokenizers`` (Qwen2 pre-tokenizer regex), written
  as ``tokenizer.json``, ``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` (with a Qwen
  chat template) and ``special_tokens_map.json``;
- ``generation_config.json`` (greedy, eos is a list like the Instruct models).

Two deliberate traps, both valid hub values: ``sliding_window`` is set (32, below the context
length) while ``use_sliding_window`` is false, so a converter that applies the window without
checking the flag produces wrong logits past 32 tokens; and the special tokens sit at the *end*
of the vocabulary (as in Qwen), so eos/pad ids are large, not 0/1/2.

Everything is seeded; rerunning the script rewrites byte-identical files. Needs numpy, torch,
safetensors and tokenizers; ``--check`` (the default) also loads the result with transformers.

Usage: ``python tests/data/make_tiny_model.py [--out DIR] [--no-check]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

SEED = 20240601
DEFAULT_OUT = Path(__file__).resolve().parent / "tiny-qwen2"

HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 128
SLIDING_WINDOW = 32  # a trap: use_sliding_window is false, so it must be ignored
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6

VOCAB_SIZE = 384
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

PROJ_STD = 0.5
EMBED_STD = 0.5
BIAS_STD = 0.5
NORM_STD = 0.1

# The pre-tokenizer regex of Qwen2's tokenizer.json.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_BASE_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello to the world.
Once upon a time there was a little robot who liked to count: one, two, three, four, five.
ONNX Runtime GenAI loads a decoder, runs the prompt, and then generates one token at a time.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 2))
The weather today is sunny with a light breeze; tomorrow it may rain in the afternoon.
Questions? Answers! Numbers like 42, 3.14 and 1000 appear in text, and so do dates: 2024-06-01.
Café, naïve, jalapeño, 東京, Ελληνικά and emoji 🙂 are all just bytes to a byte-level tokenizer.
User: What is the capital of France?
Assistant: The capital of France is Paris.
"""

_SUBJECTS = ("the cat", "a model", "my friend", "the server", "this token", "our team")
_VERBS = ("reads", "writes", "sees", "builds", "tests", "likes")
_OBJECTS = ("the book", "a graph", "some code", "the answer", "many numbers", "a story")


def corpus() -> list[str]:
    """A small deterministic training corpus (English, code, numbers, a little non-ASCII)."""
    lines = _BASE_TEXT.splitlines(keepends=True)
    for i in range(216):
        s = _SUBJECTS[i % len(_SUBJECTS)]
        v = _VERBS[(i // len(_SUBJECTS)) % len(_VERBS)]
        o = _OBJECTS[(i * 5 + 1) % len(_OBJECTS)]
        lines.append(f"{s.capitalize()} {v} {o} {i} times.\n")
    return lines


def build_tokenizer() -> Tokenizer:
    """Train a Qwen2-style ByteLevel BPE; special tokens are appended last, as in Qwen."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Map each special token to its id."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise RuntimeError(f"special tokens missing from the vocabulary: {missing}")
    return ids  # type: ignore[return-value]


def weight_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Qwen2ForCausalLM parameter names and shapes, in module order (tied: no lm_head)."""
    kv = KV_HEADS * HEAD_DIM
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (VOCAB_SIZE, HIDDEN))
    ]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.q_proj.bias", (HEADS * HEAD_DIM,)),
            (f"{p}.self_attn.k_proj.weight", (kv, HIDDEN)),
            (f"{p}.self_attn.k_proj.bias", (kv,)),
            (f"{p}.self_attn.v_proj.weight", (kv, HIDDEN)),
            (f"{p}.self_attn.v_proj.bias", (kv,)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
            (f"{p}.input_layernorm.weight", (HIDDEN,)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,)),
        ]
    shapes.append(("model.norm.weight", (HIDDEN,)))
    return shapes


def build_weights(seed: int = SEED) -> dict[str, torch.Tensor]:
    """Random bf16 weights: N(0, 0.5) projections/biases, norms N(1, 0.1)."""
    rng = np.random.default_rng(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if "norm" in name:
            values = 1.0 + NORM_STD * noise
        elif name.endswith(".bias"):
            values = BIAS_STD * noise
        elif "embed_tokens" in name:
            values = EMBED_STD * noise
        else:
            values = PROJ_STD * noise
        out[name] = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
    return out


def _added_token(content: str) -> dict[str, object]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def hub_files(ids: dict[str, int]) -> dict[str, dict[str, object]]:
    """The JSON files (other than tokenizer.json) in the layout the hub has them."""
    bos, eos_base, eos_chat = ids["<|endoftext|>"], ids["<|endoftext|>"], ids["<|im_end|>"]
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos_chat,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": 1,
        "model_type": "qwen2",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": RMS_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "sliding_window": SLIDING_WINDOW,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }
    generation_config = {
        "bos_token_id": bos,
        "do_sample": False,
        "eos_token_id": [eos_chat, eos_base],
        "pad_token_id": eos_base,
        "transformers_version": "4.43.1",
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[t]): _added_token(t) for t in SPECIAL_TOKENS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    special = {k: v for k, v in _added_token("").items() if k != "special"}
    special_tokens_map = {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": {**special, "content": "<|im_end|>"},
        "pad_token": {**special, "content": "<|endoftext|>"},
    }
    return {
        "config.json": config,
        "generation_config.json": generation_config,
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special_tokens_map,
    }


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tiny_qwen2(out: Path = DEFAULT_OUT, seed: int = SEED) -> Path:
    """Write the whole checkpoint folder to ``out`` and return it."""
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(out / "tokenizer.json"), pretty=True)
    tok.model.save(str(out))  # vocab.json + merges.txt, as hub Qwen2 repos also ship them
    for name, data in hub_files(special_ids(tok)).items():
        _write_json(out / name, data)
    weights = out / "model.safetensors"
    save_file(build_weights(seed), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it owner-only
    return out


def check(out: Path) -> None:
    """Load the result with transformers and print a short summary; raise on any problem."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"loading reported problems: {bad}")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("lm_head is not tied to embed_tokens")
    tok = AutoTokenizer.from_pretrained(out)
    text = "Hello world! The capital of France is Paris. 東京 🙂"
    ids = tok(text)["input_ids"]
    if tok.decode(ids) != text:
        raise RuntimeError(f"tokenizer does not round-trip: {tok.decode(ids)!r}")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    prompt = torch.tensor([tok(chat)["input_ids"]])
    with torch.no_grad():
        new = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, prompt.shape[1] :]
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {total} bytes, vocab {len(tok)}, {len(ids)} tokens for {len(text)} chars")
    print(f"greedy after chat prompt: {new.tolist()} -> {tok.decode(new)!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--no-check", dest="check", action="store_false")
    args = parser.parse_args()
    out = write_tiny_qwen2(args.out, args.seed)
    if args.check:
        check(out)


if __name__ == "__main__":
    main()
