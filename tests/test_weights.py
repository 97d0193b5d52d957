"""Weights: sharded and single safetensors, lazy loading, casting, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.weights import Checkpoint

TINY = Path(__file__).parent / "data" / "tiny-qwen2"


def _copy_tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY, folder)
    return folder


def _shard(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def _initializer_arrays(package) -> dict[str, np.ndarray]:
    return {
        name: value.const_value.numpy()
        for name, value in package["model"].graph.initializers.items()
        if value.const_value is not None
    }


def test_sharded_checkpoint_gives_the_same_weights(tmp_path):
    folder = _copy_tiny(tmp_path)
    single = _initializer_arrays(mobius_genai.build(folder))
    _shard(folder)
    assert len(Checkpoint(folder).files()) == 2
    sharded = _initializer_arrays(mobius_genai.build(folder))
    assert single.keys() == sharded.keys()
    for name in single:
        np.testing.assert_array_equal(single[name], sharded[name])


@pytest.mark.parametrize(
    ("dtype", "numpy_name"), [("f32", "float32"), ("f16", "float16"), ("bf16", "bfloat16")]
)
def test_weights_are_cast_to_the_build_dtype(dtype, numpy_name):
    package = mobius_genai.build(TINY, "default", dtype)
    weight = package["model"].graph.initializers["model.layers.0.mlp.up_proj.weight"]
    array = weight.const_value.numpy()
    assert array.dtype.name == numpy_name
    # Linear weights are stored [in, out]: the transpose of the checkpoint's [out, in].
    original = Checkpoint(TINY).read("model.layers.0.mlp.up_proj.weight").astype(np.float32)
    np.testing.assert_array_equal(
        array.astype(np.float32), original.T.astype(array.dtype).astype(np.float32)
    )


def test_build_reads_no_tensor_until_save(tmp_path, monkeypatch):
    reads = []
    original = Checkpoint.read
    monkeypatch.setattr(
        Checkpoint,
        "read",
        lambda self, name, index=None: reads.append(name) or original(self, name, index),
    )
    package = mobius_genai.build(TINY)
    assert reads == []
    package.save(tmp_path, progress=False)
    # each tensor read once while saving (the tiny tensors fit one block each); none twice
    assert len(reads) == len(set(reads)) == len(Checkpoint(TINY))


def test_truncated_safetensors_is_refused_before_anything_is_built(tmp_path):
    folder = _copy_tiny(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(WeightsError, match=r"model\.safetensors: truncated"):
        mobius_genai.build(folder)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    folder = _copy_tiny(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(WeightsError, match=r"pytorch_model\.bin.*accepted: \*\.safetensors"):
        mobius_genai.build(folder)


def test_missing_tensor_is_named(tmp_path):
    folder = _copy_tiny(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(WeightsError, match="model.layers.1.mlp.down_proj.weight"):
        mobius_genai.build(folder)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
    folder = _copy_tiny(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        WeightsError, match=r"gate_proj.weight' has shape \[128, 64\].*needs \[96, 64\]"
    ):
        mobius_genai.build(folder)


def test_missing_shard_named_by_index(tmp_path):
    folder = _copy_tiny(tmp_path)
    _shard(folder)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsError, match="model-00002-of-00002.safetensors"):
        mobius_genai.build(folder)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd"])
def test_an_index_naming_files_outside_the_checkpoint_is_refused(tmp_path, shard: str):
    folder = _copy_tiny(tmp_path / "ckpt")
    _shard(folder)
    shutil.copyfile(folder / "model-00001-of-00002.safetensors", tmp_path / "outside.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="names shards outside the checkpoint folder"):
        mobius_genai.build(folder)


def test_an_integer_tensor_for_a_float_parameter_is_refused(tmp_path):
    folder = _copy_tiny(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(
        WeightsError, match=r"'model.norm.weight' is stored as I32; .*accepted: BF16, F16, F32, F64"
    ):
        mobius_genai.build(folder)
