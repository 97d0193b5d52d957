"""INT4 graphs in onnxruntime (CPU EP): logits of a prefill and 3 cached decode steps.

Three comparisons, each with its tolerance:

1. Weights on an int4 grid (`write_grid_checkpoint`): quantization is lossless there, so the
   int4 graph must reproduce the float32 graph, max abs diff <= 1e-4 (measured ~2e-6). This is
   the check against the original weights: a wrong layout, transposition, scale or a wrongly
   shared table is off by whole grid steps.
2. Random weights, accuracy_level 0: the int4 graph vs the same graph with every int4 weight
   dequantized in numpy (`dequantized_reference`), <= 1e-4 (float rounding; measured 0 for
   qwen2, up to 3e-5 for other families). With the CPU default accuracy_level 4 (int8
   activations) the difference is reported and bounded by 15% of the largest logit (measured
   5-9%).
3. vs the float32 graph (`mild_ckpt`, block 32, CPU defaults): the quantization error itself,
   printed; sanity bounds: relative RMS error of the logits < 0.25 (measured 0.15 symmetric,
   0.13 asymmetric; uncorrelated logits would give ~1.4) and top-1 agreement >= 80% (measured
   98-100%).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import mobius_genai
from mobius_genai.ep import get_ep
from mobius_genai.quantize import QUALITIES, Int4Options, quantize_int4
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, run_like_reference
from tests.quantize._reference import dequantized_reference

F32_TOLERANCE = 1e-4


@functools.cache
def _reference_run(ckpt: Path):
    """transformers' prefill + 3 greedy decode steps (inputs and f32 logits), once per ckpt."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    return hf_reference_logits(ckpt, ids, decode_steps=3)


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # Keep onnxruntime from fusing DequantizeLinear + MatMul into an int8-compute MatMulNBits.
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _logits(ckpt, ep, directory, run, **options):
    """Logits of the (optionally int4) f32 graph for `ep`, and the int4 report."""
    caps = get_ep(ep)
    package = mobius_genai.build(ckpt, caps, "f32")
    if options:
        options.setdefault("quality", "builder")
    report = quantize_int4(package["model"], Int4Options(**options), caps) if options else None
    package.save(directory, progress=False)
    return run_like_reference(_session(directory / "model.onnx"), run), report


@pytest.fixture(scope="module")
def float_logits(tmp_path_factory):
    """(checkpoint, EP) → logits of the f32 graph without quantization, computed once."""

    @functools.cache
    def compute(ckpt: Path, ep: str) -> list[np.ndarray]:
        directory = tmp_path_factory.mktemp("f32")
        return _logits(ckpt, ep, directory, _reference_run(ckpt))[0]

    return compute


def _relative_rms(ours, reference) -> float:
    error = sum(float(((a - b) ** 2).sum()) for a, b in zip(ours, reference, strict=True))
    return (error / sum(float((b**2).sum()) for b in reference)) ** 0.5


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(
    ("ep", "embedding"),
    [("cpu", "int4"), ("dml", "float"), ("onnx-standard", "float"), ("default", "float")],
)
def test_int4_graph_reproduces_float_graph_on_grid_weights(
    ep, embedding, symmetric, tied, grid_ckpts, float_logits, tmp_path
):
    """cpu: MatMulNBits + GatherBlockQuantized (shared when tied); dml (f32 build, runs on
    CPU): float lookup with a separate int4 lm_head; onnx-standard and default:
    DequantizeLinear."""
    ckpt = grid_ckpts[tied]
    run = _reference_run(ckpt)
    reference = float_logits(ckpt, ep)
    assert max_abs_diff(reference, run.logits) <= F32_TOLERANCE  # the float graph itself
    ours, report = _logits(
        ckpt, ep, tmp_path / "int4", run, block_size=16, symmetric=symmetric, accuracy_level=0
    )
    expected = "int4-shared" if tied and embedding == "int4" else embedding
    assert report.embedding == expected
    assert max_abs_diff(ours, reference) <= F32_TOLERANCE


@pytest.mark.parametrize("ckpt_name", ["untied_ckpt", "tied_ckpt"])
@pytest.mark.parametrize(
    ("symmetric", "quality"),
    [
        (True, "builder"),
        (False, "builder"),
        (None, "search"),
        (None, "balanced"),
        (True, "balanced"),
        (None, "mixed"),
    ],
)
def test_int4_graph_matches_numpy_dequantized_graph(
    ckpt_name, symmetric, quality, float_logits, request, tmp_path
):
    """onnxruntime runs each recipe's graph (4- and 8-bit weights) as numpy dequantizes it."""
    ckpt = request.getfixturevalue(ckpt_name)
    run = _reference_run(ckpt)
    float_32 = float_logits(ckpt, "cpu")
    options = {"symmetric": symmetric, "quality": quality}
    int4, report = _logits(ckpt, "cpu", tmp_path / "q", run, accuracy_level=0, **options)
    width = "int8" if "embedding" in QUALITIES[quality].wide_roles else "int4"
    assert report.embedding == (f"{width}-shared" if ckpt_name == "tied_ckpt" else width)
    reference_path = dequantized_reference(tmp_path / "q" / "model.onnx", tmp_path / "deq")
    dequantized = run_like_reference(_session(reference_path), run)
    assert max_abs_diff(int4, dequantized) <= F32_TOLERANCE

    fast, _ = _logits(ckpt, "cpu", tmp_path / "q4", run, **options)  # level 4
    scale = max(float(np.abs(x).max()) for x in float_32)
    level4 = max_abs_diff(fast, dequantized)
    print(
        f"\n{ckpt_name} symmetric={symmetric}: int4 vs dequantized "
        f"{max_abs_diff(int4, dequantized):.1e}; accuracy_level 4 vs dequantized {level4:.3f} "
        f"(max |logit| {scale:.2f})"
    )
    assert level4 <= 0.15 * scale


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_error_against_the_float32_graph(symmetric, mild_ckpt, float_logits, tmp_path):
    run = _reference_run(mild_ckpt)
    float_32 = float_logits(mild_ckpt, "cpu")
    int4, report = _logits(mild_ckpt, "cpu", tmp_path / "q", run, symmetric=symmetric)
    assert report.options.accuracy_level == 4 and report.embedding == "int4-shared"
    relative = _relative_rms(int4, float_32)
    top1 = float(
        np.mean(
            [(a.argmax(-1) == b.argmax(-1)).mean() for a, b in zip(int4, float_32, strict=True)]
        )
    )
    print(
        f"\nint4 (block 32, symmetric={symmetric}, accuracy_level 4) vs f32: max abs "
        f"{max_abs_diff(int4, float_32):.3f} (max |logit| "
        f"{max(float(np.abs(x).max()) for x in float_32):.2f}), relative RMS {relative:.3f}, "
        f"top-1 agreement {top1:.0%}"
    )
    assert relative < 0.25
    assert top1 >= 0.8


@pytest.mark.parametrize("family", ["gpt2", "phi", "gemma2"])
def test_other_families_int4_graph_matches_numpy_dequantized_graph(family, tmp_path):
    """gpt2 (fc MLP, learned position embeddings: left float), phi (partial rotary, dense),
    gemma2 (softcaps, scaled embedding): the same <= 1e-4 against the dequantized graph."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    run = _reference_run(ckpt)
    int4, report = _logits(ckpt, "cpu", tmp_path / "q", run, block_size=16, accuracy_level=0)
    assert report.op_counts["GatherBlockQuantized"] == 1  # the token embedding only
    if family == "gpt2":
        assert [reason for _, reason in report.declined] == [
            "lookup not indexed by input_ids (not the token embedding)"
        ]
    reference_path = dequantized_reference(tmp_path / "q" / "model.onnx", tmp_path / "deq")
    dequantized = run_like_reference(_session(reference_path), run)
    assert max_abs_diff(int4, dequantized) <= F32_TOLERANCE


def test_recipes_bring_the_logits_closer_to_transformers(mild_ckpt, tmp_path):
    """CPU defaults (block 32, accuracy level 4): the per-block search brings the int4 logits
    closer to transformers' float32 logits than the builder's round-to-nearest, and `mixed`'s
    8-bit weights closer still."""
    run = _reference_run(mild_ckpt)
    errors = {
        quality: _relative_rms(
            _logits(mild_ckpt, "cpu", tmp_path / quality, run, quality=quality)[0], run.logits
        )
        for quality in ("builder", "search", "mixed")
    }
    print(f"\nrelative RMS error vs transformers: {errors}")
    assert errors["mixed"] < errors["search"] < errors["builder"]
