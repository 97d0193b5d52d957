"""Test-only: tiny GGUF files written with the gguf package's GGUFWriter from a tiny random
transformers model (tests/_hf.py), laid out as llama.cpp's convert_hf_to_gguf.py writes them.

Written independently of mobius_genai.checkpoint.gguf: llama.cpp's tensor names, its Q/K row permutation
for llama (`_permute`, convert_hf_to_gguf.py's LlamaModel.permute), metadata keys through
GGUFWriter's own add_* methods. The tokenizer is tests/data/tiny-qwen2's byte-level BPE
(384 tokens), so the model's vocabulary is 384.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFWriter,
    RopeScalingType,
    TokenType,
)
from gguf.quants import quantize
from onnx import numpy_helper
from transformers import AutoModelForCausalLM

from tests._hf import hf_reference_logits, randomize_weights, tiny_config
from tests._ort import run_like_reference
from tests.conftest import TINY_QWEN2

VOCAB = 384
BOS, EOS = 381, 383

#: HuggingFace parameter name (after "model.layers.{i}.") → llama.cpp tensor name.
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
#: Per llama.cpp architecture: the layer names that differ (gemma's four norms, phi3's fused
#: projections: attn_qkv [q; k; v] rows, ffn_up [gate; up] rows).
_ARCH_NAMES = {
    "gemma3": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}
#: Architectures whose converter stores norm weights as 1 + w (gemma's RMSNorm scale).
_NORM_PLUS_ONE = {"gemma3"}
_GLOBAL_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}

#: Default types: a Q8_0 embedding (and output), 4-bit attention and MLP, float norms and biases.
DEFAULT_TYPES = {
    "token_embd": "Q8_0",
    "output": "Q8_0",
    "attn_q": "Q4_0",
    "attn_k": "Q4_1",
    "attn_v": "Q4_0",
    "attn_output": "Q4_1",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_0",
    "ffn_down": "Q4_1",
    "attn_qkv": "Q4_1",  # phi3's fused [q; k; v]
}


#: Types written from a numpy dtype (gguf has no quantizer for them).
_NUMPY_TYPES = {"F64": np.float64, "I32": np.int32}

#: Block types written as random bytes (gguf has no quantizer for the k-quants): per type its
#: fp16 fields as (byte offset, low, high), ranges giving weights of about WEIGHT_STD / 2; the
#: other bytes (integers, packed sub-block scales) are uniform.
_RANDOM_FIELDS = {
    "Q4_K": [(0, 5e-4, 1e-3), (2, 5e-4, 1.5e-3)],
    "Q5_K": [(0, 2e-4, 4e-4), (2, 3e-3, 6e-3)],
    "Q6_K": [(208, 5e-5, 1.5e-4)],
    "Q5_0": [(0, 2.5e-3, 5e-3)],
    "Q3_K": [(108, 2e-3, 4e-3)],
}


def matmul_nbits_weights(model: onnx.ModelProto) -> list[np.ndarray]:
    """The [N, K] float weight of each MatMulNBits, dequantized as its kernel defines it, plus
    its block mins (the MatMul named after it + "_mins": float zero points' rest) if any."""
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    mins = {
        n.name.removesuffix("_mins"): initializers[n.input[1]]
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name.endswith("_mins")
    }
    weights = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attributes = {a.name: a.i for a in node.attribute}
        bits, size, n = attributes["bits"], attributes["block_size"], attributes["N"]
        data = initializers[node.input[1]].reshape(n, -1, size * bits // 8)
        if bits == 4:
            data = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(n, -1, size)
        scales = initializers[node.input[2]].reshape(n, -1, 1).astype(np.float32)
        zeros = np.full(scales.shape, 2 ** (bits - 1), np.float32)
        if len(node.input) > 3 and node.input[3]:
            zeros = initializers[node.input[3]].reshape(n, -1)
            if bits == 4 and zeros.dtype == np.uint8:
                zeros = np.stack([zeros & 0x0F, zeros >> 4], axis=-1).reshape(n, -1)
            zeros = zeros[:, : scales.shape[1], None].astype(np.float32)
        weight = ((data.astype(np.float32) - zeros) * scales).reshape(n, -1)
        if node.name in mins:
            weight += np.repeat(mins[node.name].T.astype(np.float32), size, axis=1)
        weights.append(weight)
    return weights


def last_logit_diffs(gguf: Path, bundle: Path, prompt: list[int], steps: int) -> list[float]:
    """Per step (the prefill of `prompt`, then `steps` greedy decode steps), the largest
    difference between the last position's logits of `bundle` (run by onnxruntime's cpu EP)
    and of transformers loading `gguf`."""
    run = hf_reference_logits(gguf, np.array([prompt]), decode_steps=steps)
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    ours = run_like_reference(session, run)
    pairs = zip(ours, run.steps, strict=True)
    return [float(np.abs(o[:, -1] - r.logits[:, -1]).max()) for o, r in pairs]


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of llama.cpp's Q/K row permutation (`_permute`) for `heads` heads."""
    n = rows.shape[0]
    return rows.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def holds_rows(weight: np.ndarray, expected: np.ndarray, atol: float = 0.0) -> bool:
    """`expected` [n, K] is a run of rows of `weight` [N, K] (bit for bit unless `atol`)."""
    if weight.shape[1] != expected.shape[1]:
        return False
    for start in range(weight.shape[0] - expected.shape[0] + 1):
        rows = weight[start : start + expected.shape[0]]
        if np.allclose(rows, expected, rtol=0, atol=atol):  # atol 0: equal
            return True
    return False


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, row bytes] uniform random blocks of `kind` with fp16 scales in a sane range."""
    qtype = GGMLQuantizationType[kind]
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset, low, high in _RANDOM_FIELDS[kind]:
        scale = rng.uniform(low, high, size=(rows, cols // block)).astype(np.float16)
        raw[..., offset : offset + 2] = scale[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary row order for Q (n_head) and K (n_head_kv) of a llama GGUF."""
    shape = weights.shape
    return (
        weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def _llama3_rope_factors(rope: Mapping, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs of a llama3-scaled rope (convert_hf_to_gguf.py's LlamaModel:
    1 for short wavelengths, `factor` for long ones, smoothed in between)."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, np.float32)


def _add_longrope(
    writer: GGUFWriter, rope: Mapping, context: int, replace: Mapping[str, np.ndarray]
) -> None:
    """Phi-3 128k's longrope as convert_hf_to_gguf.py's Phi3MiniModel writes it: no scaling
    type, the original context length, attn_factor sqrt(1 + ln(s) / ln(original)) for
    s = context / original, and the factor lists as two float32 tensors."""
    original = rope["original_max_position_embeddings"]
    scale = context / original
    attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_scaling_attn_factors(attn)
    for name in ("long", "short"):
        tensor = f"rope_factors_{name}.weight"
        factors = replace.get(tensor, rope[f"{name}_factor"])
        writer.add_tensor(tensor, np.asarray(factors, np.float32))


def _gguf_name(name: str, arch: str) -> tuple[str, str]:
    """(llama.cpp name, its base) of a HuggingFace parameter name."""
    stem, kind = name.rsplit(".", 1)
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}", _GLOBAL_NAMES[stem]
    _, _, layer, rest = stem.split(".", 3)
    base = {**_LAYER_NAMES, **_ARCH_NAMES.get(arch, {})}[rest]
    return f"blk.{layer}.{base}.{kind}", base


def tiny_model(family: str, *, tie: bool, seed: int = 0, **overrides) -> torch.nn.Module:
    config = tiny_config(
        family,
        vocab_size=VOCAB,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=BOS,
        tie_word_embeddings=tie,
        **overrides,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    return model


def write_tiny_gguf(
    path: Path,
    family: str,
    *,
    tie: bool = True,
    types: Mapping[str, str] | None = None,
    architecture: str | None = None,
    extra_layers: int = 0,
    layers: int = 3,
    tokenizer: str = "gpt2",
    seed: int = 0,
    metadata: Mapping[str, float | str] | None = None,
    rope_tensors: Mapping[str, np.ndarray] | None = None,
    **overrides,
) -> Path:
    """A GGUF of `family`'s tiny random model at `path`.

    `types`: llama.cpp tensor base name → GGML type (DEFAULT_TYPES for the others, F32 for
    norms and biases; k-quants are random blocks, see `random_blocks`). `architecture`
    overrides general.architecture. `extra_layers` writes the tensors of that many more
    layers than block_count (`layers`) says. `tokenizer`: "gpt2" (tests/data/tiny-qwen2's) or
    "llama" (a SentencePiece vocabulary, `_add_spm_tokenizer`). `overrides` go to the config.
    `metadata` (full key → float or string) and `rope_tensors` (name → values) replace what the
    converter would write, for values transformers' config refuses.
    """
    types = {**DEFAULT_TYPES, **(types or {})}
    layers += extra_layers
    model = tiny_model(family, tie=tie, seed=seed, num_hidden_layers=layers, **overrides)
    config = model.config
    arch = architecture or family
    writer = GGUFWriter(str(path), arch)
    rng = np.random.default_rng(seed)
    writer.add_block_count(config.num_hidden_layers - extra_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)  # gemma3: per layer type; the local base is fixed
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(int(head_dim * (partial or 1.0)))  # Phi-4-mini: 0.75
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(VOCAB)
    if tokenizer == "llama":
        _add_spm_tokenizer(writer, spaces=arch == "gemma3")
    else:
        _add_tokenizer(writer)
    if rope.get("rope_type") == "llama3":  # no metadata: a tensor of factors
        writer.add_tensor("rope_freqs.weight", _llama3_rope_factors(rope, head_dim))
    if rope.get("rope_type") == "linear":  # gemma3 4B-27B: the global layers' scaling
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    if rope.get("rope_type") == "longrope":
        _add_longrope(writer, rope, config.max_position_embeddings, rope_tensors or {})
    for key, value in (metadata or {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32)(key, value)
    for name, tensor in model.state_dict().items():
        if tie and name == "lm_head.weight":
            continue
        array = tensor.numpy().astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = _permute(array, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = _permute(array, config.num_key_value_heads)
        if arch in _NORM_PLUS_ONE and name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        gguf_name, base = _gguf_name(name, arch)
        kind = types.get(base, "F32") if array.ndim == 2 else "F32"
        if kind in _NUMPY_TYPES:  # no gguf quantizer: numpy's dtype says the type
            writer.add_tensor(gguf_name, array.astype(_NUMPY_TYPES[kind]))
        elif kind in _RANDOM_FIELDS and kind != "Q5_0":  # no gguf quantizer: random blocks
            qtype = GGMLQuantizationType[kind]
            raw = random_blocks(kind, *array.shape, rng)
            writer.add_tensor(gguf_name, raw, raw_dtype=qtype)
        else:
            qtype = GGMLQuantizationType[kind]
            writer.add_tensor(gguf_name, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


#: Words of the SentencePiece test vocabulary: ▁ + each prefix of each, and single letters.
_SPM_WORDS = ("the", "cat", "sat", "on", "mat", "hello", "world", "two", "spaces", "and")


def _add_spm_tokenizer(writer: GGUFWriter, spaces: bool) -> None:
    """A SentencePiece BPE vocabulary as llama.cpp writes one (tokens, scores, types, no
    merges): <unk> <s> </s>, the 256 byte pieces, pieces of `_SPM_WORDS` scored by length,
    and filler pieces up to VOCAB. `spaces`: all-space pieces stored as spaces (gemma)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    pieces = ["\u2581", *"abcdefghijklmnopqrstuvwxyz"]
    pieces += ["  " if spaces else "\u2581\u2581"]
    for word in _SPM_WORDS:
        pieces += [word[:end] for end in range(2, len(word) + 1)]
        pieces += ["\u2581" + word[:end] for end in range(1, len(word) + 1)]
    pieces = list(dict.fromkeys(pieces))
    pieces += [f"<filler{i}>" for i in range(VOCAB - len(tokens) - len(pieces))]
    scores = [0.0] * len(tokens) + [-float(len(p)) - i / 1000 for i, p in enumerate(pieces)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens + pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types + [TokenType.NORMAL] * len(pieces))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def _add_tokenizer(writer: GGUFWriter) -> None:
    tokenizer = json.loads((TINY_QWEN2 / "tokenizer.json").read_text())
    added = {token["id"]: token["content"] for token in tokenizer["added_tokens"]}
    vocab = {index: token for token, index in tokenizer["model"]["vocab"].items()} | added
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([vocab[index] for index in range(VOCAB)])
    writer.add_token_types(
        [TokenType.CONTROL if index in added else TokenType.NORMAL for index in range(VOCAB)]
    )
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    )
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_pad_token_id(BOS)
    writer.add_add_bos_token(False)
    template = json.loads((TINY_QWEN2 / "tokenizer_config.json").read_text())["chat_template"]
    writer.add_chat_template(template)
