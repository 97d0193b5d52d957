"""Tiny GGUFs written by the tests (tests/checkpoint/gguf/_tiny.py) packaged for cpu, compared with
transformers loading the same file (which dequantizes it to float32).

At MatMulNBits accuracy level 0 the kernels dequantize each block exactly as transformers does,
so the logits agree to float32 summation order: the bundles are packaged as `package` does by
default (the cpu EP's level 4) and their graph is run at level 0 (`_exact_session`). The integers are checked too: the embedding's
GatherBlockQuantized data is the GGUF's Q8_0 bytes (int8 + 128).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from onnx import numpy_helper
from transformers import AutoModelForCausalLM

import mobius_genai
from mobius_genai.quantize import Int4Options
from tests._hf import hf_reference_logits
from tests._ort import run_like_reference
from tests.checkpoint.gguf._tiny import (
    holds_rows,
    matmul_nbits_weights,
    unpermute_rows,
    write_tiny_gguf,
)

PROMPT = np.array([[5, 17, 33, 8, 200, 91, 383]])
LOGITS_ATOL = 1e-4

CASES = {
    # tied Q8_0 embedding (lookup and lm_head from one 8-bit copy), permuted Q/K rows
    "llama": {"family": "llama", "tie": True},
    # untied Q8_0 output, Q4_0 embedding (4-bit lookup), q/k/v biases, an 8-bit Q5_0
    "qwen2": {"family": "qwen2", "tie": False, "types": {"token_embd": "Q4_0", "attn_v": "Q5_0"}},
    # gemma3: four norms per layer stored as 1 + w, q/k norms, sqrt(hidden) embedding scale,
    # sliding layers (window 4, 1 in 6 global), local rope base 10000 and global 1e6 (the GGUF
    # stores neither the pattern nor the local base: llama.cpp and transformers' defaults);
    # query_pre_attn_scalar = head_dim = 256, as in gemma3 1B-12B (the GGUF does not store it)
    "gemma3": {
        "family": "gemma3_text",
        "architecture": "gemma3",
        "tie": True,
        "layers": 6,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4,
        "sliding_window_pattern": 6,
        "rope_theta": 1e6,
        "rope_local_base_freq": 10000.0,
        "final_logit_softcapping": None,
    },
    # phi3: fused attn_qkv and ffn_up ([gate; up]) matrices
    "phi3": {"family": "phi3", "tie": False},
    # k-quants (K a multiple of 256): Q6_K 8-bit in blocks of 16 (permuted Q rows, the MLP's
    # down projection, a tied Q6_K embedding: lookup and lm_head), Q4_K, an 8-bit Q5_K gate
    # (float zero points: integer ones plus block mins)
    "kquants": {
        "family": "llama",
        "tie": True,
        "hidden_size": 256,
        "intermediate_size": 256,
        "types": {
            "token_embd": "Q6_K",
            "attn_q": "Q6_K",
            "attn_k": "Q4_K",
            "attn_v": "Q5_0",
            "ffn_gate": "Q5_K",
            "ffn_down": "Q6_K",
        },
    },
    # per-head q/k norms; head_dim 128 (transformers' Qwen3 default: it reads no key_length)
    "qwen3": {"family": "qwen3", "tie": True, "head_dim": 128},
    # float zero points on every projection: gate and up share their input's block sums
    "q4_1": {
        "family": "llama",
        "tie": True,
        "types": {"attn_q": "Q4_1", "attn_v": "Q4_1", "ffn_up": "Q4_1"},
    },
}


def _bits(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "bits")


@pytest.fixture(scope="module")
def packaged_gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """The case's GGUF and its default cpu bundle, packaged once for this module (the tests
    only read them): no int4 request (which would quantize what is read as float,
    tests/checkpoint/gguf/test_requantize.py), the EP's accuracy level 4."""
    cache: dict[str, tuple[Path, Path]] = {}

    def make(case: str) -> tuple[Path, Path]:
        if case not in cache:
            folder = tmp_path_factory.mktemp(case)
            gguf = write_tiny_gguf(folder / f"{case}.gguf", **CASES[case])
            bundle = mobius_genai.package(gguf, "cpu", folder / "bundle", quiet=True)
            cache[case] = gguf, bundle
        gguf, bundle = cache[case]
        assert _summary(bundle)["accuracy_level"] == 4
        return gguf, bundle

    return make


def _exact_session(bundle: Path) -> ort.InferenceSession:
    """The bundle's graph with every MatMulNBits at accuracy level 0 (float dot products:
    `package --precision int4 --int4-accuracy-level 0` without re-quantizing float reads)."""
    model = onnx.load(bundle / "model.onnx")
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers(packaged_gguf, case: str):
    gguf, bundle = packaged_gguf(case)
    run = hf_reference_logits(gguf, PROMPT, decode_steps=4)
    session = _exact_session(bundle)
    ours = run_like_reference(session, run)
    for step, (logits, reference) in enumerate(zip(ours, run.steps, strict=True)):
        diff = np.abs(logits[:, -1] - reference.logits[:, -1]).max()
        assert diff <= LOGITS_ATOL, (step, diff)
    ops = {
        node.op_type
        for node in onnx.load(bundle / "model.onnx", load_external_data=False).graph.node
    }
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops
    assert "Gather" not in ops  # the embedding lookup reads the stored integers


def test_8_bit_weights_are_gguf_dequantized_exactly(packaged_gguf):
    """The Q5_0 / Q6_K tensors become 8-bit MatMulNBits with uint8 zero points whose weights
    are gguf.quants.dequantize's values bit for bit (rows in HuggingFace's order: the Q6_K
    attn_q's rows are un-permuted, so compare with the dequantized tensor un-permuted by the
    test's own inverse of llama.cpp's permutation); the Q5_K ones, with their block mins,
    within float32 rounding of the offsets' split."""
    gguf, bundle = packaged_gguf("kquants")
    model = onnx.load(bundle / "model.onnx")
    weights = matmul_nbits_weights(model)
    reader = GGUFReader(gguf)
    checked = 0
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in ("Q5_0", "Q6_K", "Q5_K"):
            continue
        expected = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        if tensor.name.endswith("attn_q.weight"):
            expected = unpermute_rows(expected, 4)
        atol = 1e-6 * np.abs(expected).max() if kind == "Q5_K" else 0.0
        assert any(holds_rows(weight, expected, atol) for weight in weights), tensor.name
        checked += 1
    assert checked == 4 * 3 + 1  # q, v, gate, down per layer, the embedding (tied lm_head)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits" and _bits(n) == 8]
    assert all(len(n.input) == 4 for n in nbits)  # uint8 zero points: 16 / 32, Q5_K's round(z)
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["prequantized"]["dequantized"] == []


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
_GEMMA3 = {
    k: v for k, v in CASES["gemma3"].items() if k not in ("rope_theta", "rope_local_base_freq")
}

#: case → (write_tiny_gguf arguments, the rope_parameters of the checkpoint it came from)
ROPE_CASES = {
    # llama.cpp stores Llama 3's scaling as a rope_freqs.weight tensor (a factor per
    # frequency), no metadata; this tiny model's wavelengths (head_dim 16) fall in all three bands
    "llama3": ({"family": "llama"}, _LLAMA3_ROPE),
    # gemma3 4B-27B: rope.scaling.type linear, factor 8, for the global layers only (the
    # sliding layers' base 10000 is unscaled)
    "gemma3 linear": (
        _GEMMA3,
        {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    # Phi-3 128k: rope_factors_long / rope_factors_short tensors and the original context
    # length; the prompt (7) stays within the original 8 positions, the decode steps go past it
    # (transformers then switches to the long factors)
    "phi3 longrope": (
        {"family": "phi3", "tie": False, "max_position_embeddings": 64},
        {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "long_factor": np.linspace(1.0, 6.0, 8).tolist(),
            "short_factor": np.linspace(1.0, 2.5, 8).tolist(),
            "original_max_position_embeddings": 8,
        },
    ),
    # Phi-4-mini: architecture phi3 rotating 3/4 of each head, said only by rope.dimension_count
    "phi3 partial rotary": (
        {"family": "phi3", "tie": False},
        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
    ),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_scaling_matches_transformers(tmp_path: Path, case: str):
    """transformers' GGUF loader ignores llama.cpp's rope scaling (metadata and factor
    tensors alike), so the reference is transformers' model loaded from the same GGUF with the
    rope_parameters the checkpoint had; the scaling must matter at these positions (a bundle
    ignoring it fails)."""
    arguments, rope = ROPE_CASES[case]
    gguf = write_tiny_gguf(tmp_path / "scaled.gguf", **arguments, rope_parameters=rope)
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    config.rope_parameters = rope
    reference_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    reference_model.load_state_dict(loaded.state_dict())
    reference_model.save_pretrained(tmp_path / "reference")
    unscaled = hf_reference_logits(gguf, PROMPT, decode_steps=4)
    run = hf_reference_logits(tmp_path / "reference", PROMPT, decode_steps=4)
    bundle = mobius_genai.package(
        gguf,
        "cpu",
        tmp_path / "bundle",
        precision="int4",
        int4=Int4Options(accuracy_level=0),
        quiet=True,
    )
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    ours = run_like_reference(session, run)
    diffs = [np.abs(o[:, -1] - r.logits[:, -1]).max() for o, r in zip(ours, run.steps, strict=True)]
    assert max(diffs) <= LOGITS_ATOL, diffs
    scaling = max(
        np.abs(u.logits - r.logits).max() for u, r in zip(unscaled.steps, run.steps, strict=True)
    )
    assert scaling > 1e-2  # the scaling matters at these positions


def test_tied_q8_0_embedding_keeps_its_bytes(packaged_gguf):
    """One 8-bit copy: the lookup's data and the lm_head's B are the Q8_0 int8 values + 128."""
    gguf, bundle = packaged_gguf("llama")
    tensor = next(t for t in GGUFReader(gguf).tensors if t.name == "token_embd.weight")
    rows = np.asarray(tensor.data).reshape(-1, 34)  # per block: fp16 scale, 32 int8
    stored = (rows[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    model = onnx.load(bundle / "model.onnx")
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    lm_head = [n for n in model.graph.node if n.op_type == "MatMulNBits" and _bits(n) == 8]
    assert len(lm_head) == 1
    initializers = {t.name: t for t in model.graph.initializer}
    data = numpy_helper.to_array(initializers[lm_head[0].input[1]])
    np.testing.assert_array_equal(data.reshape(-1, 32), stored)
    producer = {out: node for node in model.graph.node for out in node.output}
    view = producer[gather.input[0]]  # Reshape of the lm_head's B: the same bytes
    assert view.op_type == "Reshape" and view.input[0] == lm_head[0].input[1]


def test_float_zero_points_are_integer_zeros_plus_block_mins(packaged_gguf):
    """onnxruntime's cpu MatMulNBits dequantizes the whole weight on every call when its zero
    points are float (Q4_1's and Q4_K's mins): ~50x slower than with integer ones. They are
    written as integer zero points (test_float_zero_points_round_to_the_nearest_code) and a
    MatMul of the activations' block sums by the block mins (logits equal transformers':
    test_logits_equal_transformers)."""
    _, bundle = packaged_gguf("llama")
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    zero_points = [n.input[3] for n in nbits if len(n.input) > 3 and n.input[3]]
    assert {dtypes[name] for name in zero_points} == {onnx.TensorProto.UINT8}
    mins = [n for n in model.graph.node if n.op_type == "MatMul" and n.name.endswith("_mins")]
    assert len(mins) == _summary(bundle)["zero_points"]["float"] > 0
    assert all(dtypes[n.input[1]] == onnx.TensorProto.FLOAT for n in mins)


def test_float_zero_points_round_to_the_nearest_code(packaged_gguf):
    """Q4_1's float offsets z: each MatMulNBits' uint8 zero points are round(z), its block mins
    the rest (within half a step), and ``(q - round(z)) * scale + mins`` is gguf's dequantized
    weight. At accuracy level 4 the activations meet the centred integers (q - round(z)); with
    zero points 0 the whole offset went through the int8 activations, and SmolLM2's Q4_1
    bundle was 4x further from the GGUF's float weights (benchmarks/README.md)."""
    gguf, bundle = packaged_gguf("llama")
    model = onnx.load(bundle / "model.onnx")
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    mins = {
        n.name.removesuffix("_mins"): initializers[n.input[1]]
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name.endswith("_mins")
    }
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    weights = []
    for weight, node in zip(matmul_nbits_weights(model), nodes, strict=True):
        if node.name not in mins:
            continue
        scales = initializers[node.input[2]].astype(np.float32)
        rest = mins[node.name].T  # [N, K / 32]
        assert np.all(np.abs(rest) <= np.abs(scales) * (0.5 + 1e-6)), node.name
        weights.append(weight)  # the block mins included
    checked = 0
    for tensor in GGUFReader(gguf).tensors:
        if tensor.tensor_type.name != "Q4_1" or tensor.name.endswith("attn_k.weight"):
            continue  # attn_k: rows permuted, and checked through the logits
        expected = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        tolerance = 1e-6 * np.abs(expected).max()
        assert any(
            w.shape == expected.shape and np.allclose(w, expected, rtol=0, atol=tolerance)
            for w in weights
        ), tensor.name
        checked += 1
    assert checked == 3 * 3  # o, gate and down per layer


def test_weights_that_share_an_input_share_its_block_sums(packaged_gguf):
    """The block sums the mins multiply are computed once per input: 4 per layer (attention
    norm, attention output, MLP norm, MLP product) for its 5 MatMulNBits (packed q/k/v, o,
    gate, up, down), each a Reshape to a constant [0, 0, K/bs, bs] and a ReduceSum (exact:
    test_logits_equal_transformers[q4_1])."""
    _, bundle = packaged_gguf("q4_1")
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    producers = {out: node for node in model.graph.node for out in node.output}
    mins = [n for n in model.graph.node if n.op_type == "MatMul" and n.name.endswith("_mins")]
    sums = {n.input[0] for n in mins}
    assert (len(mins), len(sums)) == (5 * 3, 4 * 3)
    assert {producers[name].op_type for name in sums} == {"ReduceSum"}
    grouped = {producers[producers[name].input[0]].input[1] for name in sums}
    assert all(name not in producers for name in grouped)  # constant shapes: no Shape nodes


def _levels(bundle: Path) -> dict[int, set[int]]:
    """bits → the accuracy levels of the bundle's MatMulNBits of those bits (0: no attribute)."""
    levels: dict[int, set[int]] = {}
    for node in onnx.load(bundle / "model.onnx", load_external_data=False).graph.node:
        if node.op_type == "MatMulNBits":
            found = [a.i for a in node.attribute if a.name == "accuracy_level"]
            levels.setdefault(_bits(node), set()).add(found[0] if found else 0)
    return levels


def _summary(bundle: Path) -> dict:
    return json.loads((bundle / "mobius_manifest.json").read_text())["build"]["prequantized"]


def test_stored_weights_take_the_eps_accuracy_level(tmp_path: Path):
    """Like any int4 bundle, a GGUF's takes the EP's accuracy level (cpu: 4, int8 activations,
    as llama.cpp computes its dot products), its 8-bit weights too: at level 0 onnxruntime has
    no fast 8-bit kernel. `--int4-accuracy-level 0` (with `--precision int4`) gives exact dot
    products. Every node has the manifest's level, and the card says it and what the other
    level would cost."""
    gguf = write_tiny_gguf(tmp_path / "llama.gguf", "llama")
    default = mobius_genai.package(gguf, "cpu", tmp_path / "default", quiet=True)
    assert _levels(default) == {4: {4}, 8: {4}}
    assert _summary(default)["accuracy_level"] == 4
    card = (default / "README.md").read_text()
    assert "accuracy level 4: activations rounded to int8" in card
    assert "`--int4-accuracy-level 0`" in card
    exact = mobius_genai.package(
        gguf,
        "cpu",
        tmp_path / "exact",
        precision="int4",
        int4=Int4Options(accuracy_level=0),
        quiet=True,
    )
    assert _levels(exact) == {4: {0}, 8: {0}}
    assert _summary(exact)["accuracy_level"] == 0
    assert "accuracy level 0: dot products in float" in (exact / "README.md").read_text()


#: What the packager does with each GGUF type (for a matrix; vectors are read as float).
_OUTCOME = {
    "Q4_0": "kept 4-bit",
    "Q4_1": "kept 4-bit",
    "Q4_K": "kept 4-bit",
    "Q5_0": "kept 8-bit",
    "Q6_K": "kept 8-bit",
    "Q8_0": "kept 8-bit",
    "Q5_K": "kept 8-bit",
    "F32": "float (fp32)",
}


@pytest.mark.parametrize("case", ["kquants", "phi3"])
def test_manifest_says_what_happened_to_each_tensor_kind(packaged_gguf, case: str):
    """Per GGUF type, what became of its tensors; phi3's fused attn_qkv and ffn_up keep
    their integers too (each part reads its rows of the stored blocks)."""
    gguf, bundle = packaged_gguf(case)
    expected: dict[str, dict[str, int]] = {}
    for tensor in GGUFReader(gguf).tensors:
        kind = tensor.tensor_type.name
        outcome = expected.setdefault(kind, {})
        outcome[_OUTCOME[kind]] = outcome.get(_OUTCOME[kind], 0) + 1
    assert _summary(bundle)["tensors"] == expected
    if case == "kquants":
        card = (bundle / "README.md").read_text()
        assert "Q6_K: 7 kept 8-bit" in card and "Q5_K: 3 kept 8-bit" in card


def test_a_slice_of_a_dequantized_matrix_dequantizes_only_its_rows(tmp_path: Path, monkeypatch):
    """Weights stream a block of rows at a time: each read must not dequantize the whole
    matrix again (a 152k-row Q6_K output would be dequantized once per block)."""
    from mobius_genai.checkpoint.gguf import checkpoint as module

    gguf = write_tiny_gguf(tmp_path / "q5.gguf", "llama", types={"attn_v": "Q5_0"})
    ckpt = module.GgufCheckpoint(gguf)
    name = "model.layers.0.self_attn.v_proj.weight"
    whole = ckpt.read(name)
    seen = []
    real = module.dequantize
    monkeypatch.setattr(module, "dequantize", lambda d, t: seen.append(d.shape[0]) or real(d, t))
    part = ckpt.read(name, (slice(8, 24), slice(None)))
    np.testing.assert_array_equal(part, whole[8:24])
    assert seen == [16]
