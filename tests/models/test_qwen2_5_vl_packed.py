"""Qwen2.5-VL's vision attention as com.microsoft::PackedMultiHeadAttention: kept where the EP's
capabilities say `supports_packed_multi_head_attention`, expanded to its standard body
elsewhere, and equal to transformers' image features either way."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import InlinePass

from mobius_genai.build import build
from mobius_genai.components import attention_bodies
from tests._qwen_vl import TEXT_HIDDEN, patches
from tests.models.test_qwen2_5_vl import TOLERANCE, _image, _reference_features

PACKED = ("com.microsoft", "PackedMultiHeadAttention")
DEPTH = 3  # the tiny tower's blocks: windowed, full, windowed
NAME_WIDTH = 26


@pytest.fixture(scope="module")
def qwen(qwen2_5_vl_checkpoint):
    return qwen2_5_vl_checkpoint


def _ops(model: ir.Model) -> list[tuple[str, str]]:
    return [(node.domain or "", node.op_type) for node in model.graph.all_nodes()]


def _session(model: ir.Model) -> ort.InferenceSession:
    proto = ir.serde.serialize_model(model).SerializeToString()
    return ort.InferenceSession(proto, providers=["CPUExecutionProvider"])


def _features(model: ir.Model, pixel_values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    feeds = {"pixel_values": pixel_values, "image_grid_thw": grid}
    return _session(model).run(["image_features"], feeds)[0]


@pytest.mark.parametrize(
    ("ep", "packed"),
    [("cuda", DEPTH), ("cpu", 0), ("dml", 0), ("webgpu", 0), ("onnx-standard", 0)],
)
def test_vision_attention_is_packed_only_where_the_ep_has_the_kernel(qwen, ep, packed):
    _, folder = qwen
    package = build(folder, ep, load_weights=False, progress=False)
    vision = _ops(package["vision"])
    assert vision.count(PACKED) == packed
    assert vision.count(("", "Attention")) == DEPTH - packed
    for key in ("embedding", "decoder"):
        assert PACKED not in _ops(package[key]), key
    if ep == "onnx-standard":
        for key, model in package.items():
            assert {domain for domain, _ in _ops(model)} <= {"", "ai.onnx"}, key
    else:  # the decoder is what it was: GQA, no packed attention
        assert ("com.microsoft", "GroupQueryAttention") in _ops(package["decoder"])


def _cuda_vision(folder) -> ir.Model:
    """The vision graph built for cuda in fp32 (its PackedMultiHeadAttention nodes kept)."""
    model = build(folder, "cuda", "fp32", progress=False)["vision"]
    assert _ops(model).count(PACKED) == DEPTH
    return model


@pytest.mark.parametrize("chunk", [1024, 7])
@pytest.mark.parametrize("size", [(40, 56), (32, 32), (16, 48)])
def test_packed_body_matches_transformers(qwen, size, chunk, monkeypatch):
    """The cuda graph with its functions inlined (the body onnxruntime's kernel replaces), run
    by onnxruntime on CPU: 5 x 7 merged tokens in 3 x 4 windows (partial ones at the edges),
    4 x 4 in 2 x 2 and 2 x 6 in 1 x 3, block 1 attending to the whole frame. Also with the
    body's queries taken 7 at a time (windows of 16 and frames of 140, 64 or 48 patches in
    uneven chunks)."""
    monkeypatch.setattr(attention_bodies, "_QUERY_CHUNK", chunk)
    model, folder = qwen
    vision = _cuda_vision(folder)
    InlinePass(criteria=lambda function: function.name == PACKED[1])(vision)
    assert PACKED not in _ops(vision)
    pixel_values, grid = patches(_image(*size))
    features = _features(vision, pixel_values, grid)
    reference = _reference_features(model, pixel_values, grid)
    assert features.shape == reference.shape == (int(grid.prod()) // 4, TEXT_HIDDEN)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)


def test_onnxruntime_has_no_cpu_kernel_and_does_not_fall_back_to_the_body(qwen):
    """What a cuda bundle's vision graph needs: the CUDA provider. onnxruntime's CPU provider
    has no PackedMultiHeadAttention kernel, and does not expand the model's own function for
    an op whose contrib schema it knows, so the graph does not load on CPU."""
    _, folder = qwen
    with pytest.raises(Exception, match="implementation for PackedMultiHeadAttention"):
        _session(_cuda_vision(folder))


def test_off_by_one_windows_are_caught(qwen, monkeypatch):
    """The mutant: every window (and frame) boundary after the first moved one patch on, so
    cumulative_sequence_length and token_offset disagree with transformers' cu_seqlens."""
    from mobius_genai.components import qwen_vision

    original = qwen_vision._run_starts

    def shifted(op, groups):
        starts = original(op, groups)
        moved = op.Add(starts, op.Constant(value_int=1))
        return op.Where(op.Greater(starts, op.Constant(value_int=0)), moved, starts)

    monkeypatch.setattr(qwen_vision, "_run_starts", shifted)
    model, folder = qwen
    vision = _cuda_vision(folder)
    InlinePass(criteria=lambda function: function.name == PACKED[1])(vision)
    pixel_values, grid = patches(_image(40, 56))
    error = np.abs(
        _features(vision, pixel_values, grid) - _reference_features(model, pixel_values, grid)
    )
    assert error.max() > 100 * TOLERANCE


def _trace(folder, ep: str, dtype: str | None = None):
    package = build(folder, ep, dtype, load_weights=False, progress=False)
    return package, package.reports


def test_the_trace_shows_the_packed_attention_kept_or_expanded(qwen):
    _, folder = qwen
    _, reports = _trace(folder, "cuda")
    vision = reports["vision"]
    line = f"  {'PackedMHA':<{NAME_WIDTH}}: kept {DEPTH} PackedMultiHeadAttention"
    assert f"{line} (the EP's fused kernel)" in vision.trace_lines
    assert vision.rules["InlinePass"].removed[PACKED[1]] == 0
    assert reports["decoder"].skipped["PackedMHA"] == (
        "role 'decoder' (PackedMultiHeadAttention is for vision towers)"
    )
    _, reports = _trace(folder, "cpu")
    vision = reports["vision"]
    assert vision.skipped["PackedMHA"] == "supports_packed_multi_head_attention=False"
    (line,) = [
        line for line in vision.trace_lines if "not for this target" in line and "Packed" in line
    ]
    assert "PackedMHA (supports_packed_multi_head_attention=False)" in line
    assert vision.rules["InlinePass"].removed[PACKED[1]] == DEPTH


def test_bfloat16_has_no_kernel_and_is_expanded(qwen):
    """onnxruntime's kernel takes float and float16 only: a bf16 cuda vision graph gets the
    body."""
    _, folder = qwen
    package, reports = _trace(folder, "cuda", "bf16")
    assert PACKED not in _ops(package["vision"])
    assert reports["vision"].skipped["PackedMHA"] == (
        "BFLOAT16 not in PackedMultiHeadAttention's types"
    )
    assert reports["vision"].rules["InlinePass"].removed[PACKED[1]] == DEPTH


@pytest.mark.parametrize("ep", ["cuda", "dml"])
def test_float16_vision_graph_matches_transformers_to_float16_rounding(qwen, ep):
    """Each EP's default fp16 vision graph (cuda's packed attention inlined; dml's inlined by
    the pipeline) on CPU: og feeds pixel_values in the graph's input type."""
    model, folder = qwen
    vision = build(folder, ep, progress=False)["vision"]
    assert vision.graph.inputs[0].dtype == ir.DataType.FLOAT16
    InlinePass(criteria=lambda function: function.name == PACKED[1])(vision)
    pixel_values, grid = patches(_image(40, 56))
    features = _features(vision, pixel_values.astype(np.float16), grid).astype(np.float32)
    reference = _reference_features(model, pixel_values, grid)
    assert np.abs(features - reference).max() <= 3e-3 * np.abs(reference).max()


@pytest.mark.parametrize("chunk", [1024, 7])
def test_packed_body_matches_transformers_over_several_frames(qwen, chunk, monkeypatch):
    """A clip of 3 frames (grid 3 x 10 x 14): the full-attention block attends within each
    frame, three sequences of 140 patches, and the windows never cross frames."""
    monkeypatch.setattr(attention_bodies, "_QUERY_CHUNK", chunk)
    model, folder = qwen
    vision = _cuda_vision(folder)
    InlinePass(criteria=lambda function: function.name == PACKED[1])(vision)
    grid = np.array([[3, 10, 14]], np.int64)
    rng = np.random.default_rng(0)
    pixel_values = rng.standard_normal((int(grid.prod()), 3 * 2 * 4 * 4), np.float32)
    features = _features(vision, pixel_values, grid)
    reference = _reference_features(model, pixel_values, grid)
    assert features.shape == reference.shape == (int(grid.prod()) // 4, TEXT_HIDDEN)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)
