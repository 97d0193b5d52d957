"""Weights: sharded and single safetensors, lazy loading, casting, and clear errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import WeightsError
from mobius_genai.checkpoint.weights import Checkpoint
from tests.conftest import TINY_QWEN2


def _copy_tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY_QWEN2, folder)
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
    package = mobius_genai.build(TINY_QWEN2, "default", dtype)
    weight = package["model"].graph.initializers["model.layers.0.mlp.up_proj.weight"]
    array = weight.const_value.numpy()
    assert array.dtype.name == numpy_name
    # Linear weights are stored [in, out]: the transpose of the checkpoint's [out, in].
    original = Checkpoint(TINY_QWEN2).read("model.layers.0.mlp.up_proj.weight").astype(np.float32)
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
    package = mobius_genai.build(TINY_QWEN2)
    assert reads == []
    package.save(tmp_path, progress=False)
    # each tensor read once while saving (the tiny tensors fit one block each); none twice
    assert len(reads) == len(set(reads)) == len(Checkpoint(TINY_QWEN2))


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


@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "/etc/passwd",
        "sub/../../outside.safetensors",
        "..\\outside.safetensors",
        "C:outside.safetensors",
        "C:\\outside.safetensors",
        "\\\\server\\share\\outside.safetensors",
    ],
)
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


def _index(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def _write_index(folder: Path, index: object) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_shard_named_through_a_subfolder_stays_inside(tmp_path):
    """Containment is judged on the name: a name that climbs out and back in is inside."""
    folder = _copy_tiny(tmp_path)
    _shard(folder)
    index = _index(folder)
    first = "model-00001-of-00002.safetensors"
    (folder / "sub").mkdir()
    index["weight_map"] = {
        name: f"sub/../{shard}" if shard == first else shard
        for name, shard in index["weight_map"].items()
    }
    _write_index(folder, index)
    checkpoint = Checkpoint(folder)
    assert len(checkpoint) == len(Checkpoint(TINY_QWEN2))


@pytest.mark.parametrize("listed", [1, 2])
def test_the_index_decides_which_shard_holds_a_tensor(tmp_path, listed: int):
    """A tensor present in both shards is read from the shard the weight_map names, whichever
    of the two it is (not from whichever file comes last)."""
    folder = _copy_tiny(tmp_path)
    _shard(folder)
    index = _index(folder)
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    name = next(n for n, shard in index["weight_map"].items() if shard == shards[0])
    first = load_file(folder / shards[0])
    second = load_file(folder / shards[1])
    second[name] = np.full_like(first[name], 7.0)
    save_file(second, folder / shards[1])
    index["weight_map"][name] = shards[listed - 1]
    _write_index(folder, index)
    expected = first[name] if listed == 1 else second[name]
    np.testing.assert_array_equal(Checkpoint(folder).read(name), expected)


def test_a_tensor_the_index_places_in_a_shard_that_lacks_it_is_named(tmp_path):
    folder = _copy_tiny(tmp_path)
    _shard(folder)
    index = _index(folder)
    name = next(n for n, s in index["weight_map"].items() if s.startswith("model-00001"))
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    _write_index(folder, index)
    with pytest.raises(
        WeightsError, match=rf"'{re.escape(name)}'.*model-00002-of-00002\.safetensors"
    ):
        Checkpoint(folder)


def test_tensors_a_shard_holds_beyond_the_weight_map_are_not_read(tmp_path):
    folder = _copy_tiny(tmp_path)
    _shard(folder)
    shard = folder / "model-00002-of-00002.safetensors"
    tensors = load_file(shard)
    tensors["extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, shard)
    checkpoint = Checkpoint(folder)
    assert "extra.weight" not in checkpoint
    assert set(checkpoint) == set(_index(folder)["weight_map"])


@pytest.mark.parametrize(
    ("index", "found"),
    [
        ([], "list"),
        ({"metadata": {}}, "has no weight_map"),
        ({"weight_map": []}, r"\[\]"),
        ({"weight_map": "model.safetensors"}, "'model.safetensors'"),
        ({"weight_map": {"model.norm.weight": 3}}, "3"),
        ({"weight_map": {"model.norm.weight": None}}, "None"),
        ({"weight_map": {"model.norm.weight": ["model.safetensors"]}}, "model.safetensors"),
    ],
)
def test_a_malformed_weight_map_is_a_clear_error(tmp_path, index: object, found: str):
    folder = _copy_tiny(tmp_path)
    _write_index(folder, index)
    with pytest.raises(WeightsError, match=rf"model\.safetensors\.index\.json: .*{found}") as info:
        mobius_genai.build(folder)
    assert "\n" not in str(info.value)


def test_without_an_index_a_tensor_in_two_files_is_refused(tmp_path):
    folder = _copy_tiny(tmp_path)
    save_file({"model.norm.weight": np.zeros(64, np.float32)}, folder / "extra.safetensors")
    with pytest.raises(
        WeightsError, match=r"'model.norm.weight'.*extra\.safetensors.*model\.safetensors"
    ):
        Checkpoint(folder)
