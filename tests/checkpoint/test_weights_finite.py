"""NaN or Inf weights are refused while they stream into the bundle, naming the tensor.

Every way a checkpoint tensor reaches the saved model is covered: matrices saved a block of
rows at a time, tensors read whole, tensors a family preprocesses, bf16 matrices widened to
float32 in row blocks, and INT4 weights quantized from blocks of checkpoint rows.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.checkpoint import weights
from mobius_genai.packager import package
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2

DOWN = "model.layers.0.mlp.down_proj.weight"  # a Linear weight: saved transposed, in blocks
EMBED = "model.embed_tokens.weight"  # saved as stored, in blocks; tied LM head
NORM = "model.norm.weight"  # 1-D: read whole


def _poisoned(tmp_path: Path, name: str, values: dict[tuple[int, ...], float]) -> Path:
    """A copy of the tiny checkpoint whose tensor `name` holds `values` at their indices."""
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY_QWEN2, folder)
    _poison(folder, name, values)
    return folder


def _poison(folder: Path, name: str, values: dict[tuple[int, ...], float]) -> None:
    tensors = load_file(folder / "model.safetensors")
    array = tensors[name].astype(np.float32)
    for index, value in values.items():
        array[index] = value
    tensors[name] = array.astype(tensors[name].dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _entries(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@pytest.mark.parametrize(
    ("name", "precision"),
    [(DOWN, "fp32"), (DOWN, "fp16"), (EMBED, "fp32"), (NORM, "fp32"), (DOWN, "int4")],
)
def test_a_bundle_with_nan_or_inf_weights_is_refused_and_nothing_is_left(
    tmp_path: Path, name: str, precision: str
):
    index = (1,) * len(load_file(TINY_QWEN2 / "model.safetensors")[name].shape)
    other = (2,) * len(index)
    last = (-1,) * len(index)
    ckpt = _poisoned(tmp_path, name, {index: np.nan, other: np.inf, last: np.nan})
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    with pytest.raises(WeightsError) as caught:
        package(ckpt, "cpu", out_parent / "bundle", precision=precision, quiet=True)
    message = str(caught.value)
    assert f"'{name}'" in message
    assert "2 NaN" in message and "1 Inf" in message
    assert "\n" not in message
    assert _entries(out_parent) == []  # no bundle, no staging folder


def test_the_error_names_the_checkpoint_tensor_not_only_the_graph_parameter(tmp_path: Path):
    """gpt_neox stores `gpt_neox.layers.0.mlp.dense_4h_to_h.weight`, the graph parameter is
    `model.layers.0.mlp.fc2.weight`: the error names both."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_neox")
    stored = "gpt_neox.layers.0.mlp.dense_4h_to_h.weight"
    _poison(ckpt, stored, {(0, 0): np.inf})
    with pytest.raises(WeightsError, match=re.escape(f"'{stored}'")) as caught:
        mobius_genai.build(ckpt, "cpu", "f32").save(tmp_path / "graph", progress=False)
    assert "'model.layers.0.mlp.fc2.weight'" in str(caught.value)
    assert "1 Inf" in str(caught.value)


def test_a_tensor_the_family_preprocesses_is_checked(tmp_path: Path):
    """gemma's norm weights are read whole and stored as 1 + weight."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gemma")
    _poison(ckpt, "model.layers.1.input_layernorm.weight", {(3,): np.nan})
    built = mobius_genai.build(ckpt, "cpu", "f32")
    with pytest.raises(WeightsError, match=r"'model\.layers\.1\.input_layernorm\.weight'.*1 NaN"):
        built.save(tmp_path / "graph", progress=False)


def test_bf16_matrices_widened_in_row_blocks_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(weights, "STREAM_ELEMENTS", 1000)  # every matrix streams
    ckpt = _poisoned(tmp_path, DOWN, {(63, 127): -np.inf})
    built = mobius_genai.build(ckpt, "cpu", "f32")
    tensor = built["model"].graph.initializers[DOWN].const_value
    with pytest.raises(WeightsError, match=re.escape(f"'{DOWN}'") + r".*1 Inf"):
        tensor.numpy()


def test_values_beyond_the_build_dtype_are_named_as_such(tmp_path: Path):
    """A finite bf16 value of 1e6 is Inf in float16: refused, saying what to build instead."""
    ckpt = _poisoned(tmp_path, DOWN, {(0, 0): 1e6, (5, 7): -3e5})
    built = mobius_genai.build(ckpt, "cpu", "f16")
    with pytest.raises(WeightsError) as caught:
        built.save(tmp_path / "graph", progress=False)
    message = str(caught.value)
    assert f"'{DOWN}'" in message and "2 values" in message and "float16" in message
    assert "f32" in message  # what is accepted instead


def test_finite_weights_save_as_before(tmp_path: Path):
    """The check never refuses finite values: the largest bf16 value below float16's largest,
    the smallest normal bf16 value."""
    tiny = float(ml_dtypes.finfo(ml_dtypes.bfloat16).tiny)
    ckpt = _poisoned(tmp_path, DOWN, {(0, 0): 65280.0, (0, 1): -65280.0, (0, 2): tiny})
    mobius_genai.build(ckpt, "cpu", "f16").save(tmp_path / "graph", progress=False)
    assert (tmp_path / "graph" / "model.onnx.data").is_file()
