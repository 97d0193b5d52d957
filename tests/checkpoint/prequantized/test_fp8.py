"""FP8 checkpoints (quant_method "fp8", block-wise F8_E4M3 weights with `weight_scale_inv`):
tiny float checkpoints quantized block by block here with ml_dtypes, as transformers'
Fp8Quantize does (ragged last blocks included), and their transformers reference: the same
weights dequantized by transformers (its own loader with `dequantize=True` where the blocks
divide the sizes; its `_dequantize_fp8_weight` where they are ragged, which its loader does
not take) in an fp32 checkpoint of the same model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
import safetensors.torch
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

import mobius_genai
from mobius_genai import packager
from mobius_genai.checkpoint import weights
from mobius_genai.checkpoint.prequantized.fp8 import Fp8Checkpoint, Fp8Scheme
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.cli import main as cli_main
from mobius_genai.errors import ConfigError, WeightsError
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import hf_greedy_tokens, hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
#: The layer left in float as a checkpoint's modules_to_not_convert does.
NOT_CONVERTED = "model.layers.0.self_attn.o_proj"


def _quantize(weight: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
    """(F8_E4M3 values, float32 scale_inv) of `weight` [..., rows, columns], one scale per
    block of `block` (None: the whole axis), the last block of each axis ragged:
    transformers' Fp8Quantize math (compressed-tensors' too, whose scale is this scale_inv)."""
    *lead, rows, columns = weight.shape
    br, bc = block[0] or rows, block[1] or columns
    grid = (-(-rows // br), -(-columns // bc))
    padded = np.zeros((*lead, grid[0] * br, grid[1] * bc), np.float32)
    padded[..., :rows, :columns] = weight
    tiles = padded.reshape(*lead, grid[0], br, grid[1], bc)
    largest = np.abs(tiles).max(axis=(-3, -1))
    scale_inv = np.where(largest > 0, largest / E4M3_MAX, 1.0).astype(np.float32)
    scaled = (tiles / scale_inv[..., :, None, :, None]).reshape(padded.shape)
    values = np.clip(scaled[..., :rows, :columns], -E4M3_MAX, E4M3_MAX)
    return values.astype(ml_dtypes.float8_e4m3fn), scale_inv


def _transformers_dequantized(values: np.ndarray, scale_inv: np.ndarray, block) -> np.ndarray:
    """transformers' dequantization; a per-channel or per-tensor scale broadcast (its
    block_size None)."""
    weight = torch.from_numpy(values.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    block_size = None if block[1] is None else list(block)
    return _dequantize_fp8_weight(
        weight, torch.from_numpy(scale_inv), block_size, torch.float32
    ).numpy()


def _quantized_name(name: str) -> bool:
    """The tensors a tiny checkpoint stores in FP8: every projection but NOT_CONVERTED's
    (embeddings, lm_head, norms and the router stay float)."""
    return name.endswith("proj.weight") and not name.startswith(NOT_CONVERTED)


def _fp8_pair(folder: Path, family: str, block, ckpt: Path | None = None, compressed=None):
    """An fp32 checkpoint of `family` holding transformers' dequantization of FP8 weights
    (`dense`), and the same checkpoint storing them as FP8 (`packed`); `ckpt` (a float
    checkpoint) is used instead of a new tiny one. With `compressed` (its
    quantization_config), in compressed-tensors' layout: X.weight_scale, one [1] per tensor."""
    suffix = "_scale_inv" if compressed is None else "_scale"
    source = ckpt or write_tiny_checkpoint(folder / "float", family, seed=1)
    dense, packed = folder / "dense", folder / "fp8"
    shutil.copytree(source, dense)
    shutil.copytree(source, packed)
    tensors = load_file(source / "model.safetensors")
    stored = {}
    for name, weight in tensors.items():
        if not _quantized_name(name):
            stored[name] = weight
            continue
        values, scale = _quantize(weight, block)
        per_tensor = compressed is not None and block == (None, None)
        stored[name], stored[name + suffix] = values, scale.reshape(1) if per_tensor else scale
        tensors[name] = _transformers_dequantized(values, stored[name + suffix], block)
    save_file(stored, packed / "model.safetensors", metadata={"format": "pt"})
    if compressed is not None:
        _with_quantization(packed, compressed, replace=True)
        save_file(tensors, dense / "model.safetensors", metadata={"format": "pt"})
        return dense, packed
    _with_quantization(packed, {"weight_block_size": list(block)})
    quantized = [stored[name].shape[-2:] for name in tensors if _quantized_name(name)]
    if all(
        size % part == 0 for shape in quantized for size, part in zip(shape, block, strict=True)
    ):
        tensors = _loaded_by_transformers(packed, block)
    save_file(tensors, dense / "model.safetensors", metadata={"format": "pt"})
    return dense, packed


def _loaded_by_transformers(packed: Path, block) -> dict[str, np.ndarray]:
    """The state of the FP8 checkpoint `packed` as transformers' FP8 loader dequantizes it."""
    quantization = FineGrainedFP8Config(dequantize=True, weight_block_size=list(block))
    model = AutoModelForCausalLM.from_pretrained(
        packed, dtype=torch.float32, quantization_config=quantization
    )
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


def _with_quantization(ckpt: Path, changes: dict, *, replace: bool = False) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"] = (
        changes
        if replace
        else {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": [NOT_CONVERTED, "lm_head"],
            **changes,
        }
    )
    (ckpt / "config.json").write_text(json.dumps(config))


def _rewrite(ckpt: Path, change) -> None:
    """Apply `change` to the checkpoint's tensors (torch's: numpy's safetensors reads no FP8)."""
    tensors = safetensors.torch.load_file(ckpt / "model.safetensors")
    change(tensors)
    safetensors.torch.save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_reads_dequantize_only_the_blocks_asked_for(tmp_path, monkeypatch):
    """Whole, a band of rows, a window of columns, one expert: each equals transformers'
    dequantization of that part, and reads only the scale blocks the part touches."""
    rng = np.random.default_rng(0)
    block = (128, 128)
    weights = {
        "a.weight": rng.normal(0, 0.02, (300, 260)).astype(np.float32),
        "experts.gate_up_proj": rng.normal(0, 1.0, (3, 200, 130)).astype(np.float32),
    }
    stored = {}
    for name, weight in weights.items():
        stored[name], stored[f"{name}_scale_inv"] = _quantize(weight, block)
    save_file(stored, tmp_path / "model.safetensors")
    reads = []
    original = Checkpoint.read
    monkeypatch.setattr(
        Checkpoint, "read", lambda self, n, i=None: reads.append((n, i)) or original(self, n, i)
    )
    checkpoint = Fp8Checkpoint(Checkpoint(tmp_path), Fp8Scheme(block))
    assert sorted(checkpoint) == sorted(weights)  # the scales are part of their weights
    assert checkpoint.dtype("a.weight") == "F32" and checkpoint.kind("a.weight") == "F8_E4M3"
    for name in weights:
        reference = _transformers_dequantized(stored[name], stored[f"{name}_scale_inv"], block)
        np.testing.assert_array_equal(checkpoint.read(name), reference)
        assert np.abs(reference - weights[name]).max() > 0  # FP8 rounding: not the float input
    a = _transformers_dequantized(stored["a.weight"], stored["a.weight_scale_inv"], block)
    reads.clear()
    np.testing.assert_array_equal(checkpoint.read("a.weight", (slice(130, 140),)), a[130:140])
    assert reads[-1] == ("a.weight_scale_inv", (slice(1, 2), slice(0, 3)))
    window = (slice(None), slice(100, 257))
    np.testing.assert_array_equal(checkpoint.read("a.weight", window), a[window])
    assert reads[-1] == ("a.weight_scale_inv", (slice(0, 3), slice(0, 3)))
    experts = _transformers_dequantized(
        stored["experts.gate_up_proj"], stored["experts.gate_up_proj_scale_inv"], block
    )
    one = checkpoint.read("experts.gate_up_proj", (slice(2, 3),))
    np.testing.assert_array_equal(one, experts[2:3])
    assert reads[-1] == ("experts.gate_up_proj_scale_inv", (slice(2, 3), slice(0, 2), slice(0, 2)))


def test_power_of_two_scales_dequantize_like_transformers(tmp_path):
    """scale_fmt "ue8m0": scales stored as F8_E8M0 (powers of two), DeepSeek-V3.2's."""
    rng = np.random.default_rng(2)
    block = (16, 16)
    values, _ = _quantize(rng.normal(0, 0.02, (40, 24)).astype(np.float32), block)
    scales = torch.from_numpy(np.exp2(rng.integers(-14, -6, size=(3, 2))).astype(np.float32))
    fp8 = torch.from_numpy(values.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    ue8m0 = scales.to(torch.float8_e8m0fnu)
    tensors = {"w.weight": fp8, "w.weight_scale_inv": ue8m0}
    safetensors.torch.save_file(tensors, tmp_path / "model.safetensors")
    checkpoint = Fp8Checkpoint(Checkpoint(tmp_path), Fp8Scheme(block))
    expected = _dequantize_fp8_weight(fp8, ue8m0, list(block), torch.float32).numpy()
    np.testing.assert_array_equal(checkpoint.read("w.weight"), expected)


#: family → weight_block_size: blocks that divide every size (transformers' own loader is the
#: reference), and ragged blocks over latent attention and MoE experts.
CASES = {"qwen2": (32, 32), "deepseek_v3": (16, 24)}


@pytest.mark.parametrize("family", sorted(CASES))
def test_fp8_checkpoint_builds_the_model_transformers_runs(family, tmp_path):
    dense, packed = _fp8_pair(tmp_path, family, CASES[family])
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(dense, ids, decode_steps=3)
    for ep in ("cpu", "onnx-standard"):
        package = mobius_genai.build(packed, ep, "f32", progress=False)
        ours = run_like_reference(ort_session(package, tmp_path / ep), reference)
        assert max_abs_diff(ours, reference.logits) <= TOLERANCE, ep
    float_build = mobius_genai.build(tmp_path / "float", "cpu", "f32", progress=False)
    unquantized = run_like_reference(ort_session(float_build, tmp_path / "f"), reference)
    assert max_abs_diff(unquantized, reference.logits) > 10 * TOLERANCE  # FP8 moved the logits


def _with_changes(tmp_path, change) -> Path:
    _, packed = _fp8_pair(tmp_path, "llama", (32, 32))
    _rewrite(packed, change)
    return packed


SCALE = "model.layers.1.mlp.down_proj.weight_scale_inv"
WEIGHT = "model.layers.1.mlp.down_proj.weight"

#: case → (a change of the tensors, the error's words)
BAD_TENSORS = {
    "missing scale": (lambda t: t.pop(SCALE), f"'{WEIGHT}' is stored as F8_E4M3 without its"),
    "scale shape": (
        lambda t: t.update({SCALE: t[SCALE][:, :1].contiguous()}),
        rf"'{SCALE}' has shape \[2, 1\]; weight '{WEIGHT}' \[64, 96\] in blocks of \[32, 32\] "
        r"\(weight_block_size\) needs \[2, 3\]",
    ),
    "scale dtype": (
        lambda t: t.update({SCALE: t[SCALE].to(torch.int32)}),
        f"'{SCALE}' is stored as I32; accepted: F32, BF16, F16, F8_E8M0",
    ),
    "scale of a float weight": (
        lambda t: t.update({WEIGHT: t[WEIGHT].to(torch.float32)}),
        f"'{SCALE}' scales no F8_E4M3 weight",
    ),
    "fp8 vector": (
        lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(t[WEIGHT].dtype)}),
        r"'model.norm.weight' of shape \[64\] is stored as F8_E4M3; accepted: FP8 matrices",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_bad_fp8_tensors_are_named(case, tmp_path):
    change, words = BAD_TENSORS[case]
    packed = _with_changes(tmp_path, change)
    with pytest.raises(WeightsError, match=words):
        mobius_genai.build(packed, "cpu", "f32", progress=False)


def test_nan_fp8_code_is_named(tmp_path):
    """E4M3's byte 0x7F is NaN: the weight holding it is named when it is read."""
    packed = _with_changes(tmp_path, lambda t: t[WEIGHT].view(torch.uint8)[3, 5].fill_(0x7F))
    with pytest.raises(WeightsError, match=f"'{WEIGHT}'.* holds 1 NaN and 0 Inf values"):
        mobius_genai.build(packed, "cpu", "f32", progress=False).save(tmp_path / "out")


#: case → (quantization_config changes, the error's words)
BAD_CONFIGS = {
    "fmt": ({"fmt": "e5m2"}, r"quantization_config.fmt is 'e5m2' \(fp8\); accepted: 'e4m3'"),
    "static activations": (
        {"activation_scheme": "static"},
        r"activation_scheme is 'static' \(fp8\); accepted: 'dynamic' \(static activation",
    ),
    "per-tensor scales": (
        {"weight_block_size": None},
        r"weight_block_size is None \(fp8\); accepted: two positive integers",
    ),
    "three block sizes": (
        {"weight_block_size": [128, 128, 1]},
        r"weight_block_size is \[128, 128, 1\] \(fp8\)",
    ),
    "fp4 experts": ({"expert_dtype": "fp4"}, "expert_dtype is 'fp4' \\(fp8\\); accepted: 'fp8'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_fp8_configs_are_one_line(case, tmp_path, capsys):
    changes, words = BAD_CONFIGS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "llama")
    _with_quantization(ckpt, changes)
    with pytest.raises(ConfigError, match=words):
        mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    out = tmp_path / "bundle"
    assert cli_main(["package", str(ckpt), "--ep", "cpu", "-o", str(out)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "fp8" in lines[0], lines
    assert not out.exists()


#: family → weight_block_size of its bundle test: DeepSeek's 128 x 128 (every block ragged
#: at these sizes), and blocks ragged over MoE experts and latent attention.
BUNDLES = {"llama": (128, 128), "deepseek_v3": (16, 24)}


@pytest.mark.parametrize("family", sorted(BUNDLES))
def test_fp8_bundle_generates_like_transformers_and_in_int4(family, tmp_path):
    """A cpu bundle of an FP8 checkpoint: onnxruntime-genai's greedy tokens are
    transformers'; its int4 bundle runs and is the int4 bundle of the dequantized weights
    stored as float (the search saw the same values)."""
    ckpt = bundle_checkpoint(tmp_path / "float", family)
    dense, packed = _fp8_pair(tmp_path, family, BUNDLES[family], ckpt=ckpt)
    bundle = packager.package(packed, "cpu", tmp_path / "bundle", quiet=True)
    ours = greedy_tokens(load_model(bundle), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(dense, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS  # no early eos: every step compared
    int4 = {}
    for name, source in (("fp8", packed), ("dense", dense)):
        folder = packager.package(
            source, "cpu", tmp_path / f"int4-{name}", precision="int4", quiet=True
        )
        tokens = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
        ops = {node.op_type for node in onnx.load(str(folder / "model.onnx")).graph.node}
        int4[name] = (tokens, ops, (folder / "model.onnx.data").read_bytes())
    # eos may end the int4 reply early (DeepSeek-V3's float32 router left float picks other
    # experts than a 4-bit one would): the steps before it are compared
    assert len(int4["fp8"][0]) >= NEW_TOKENS // 2 and "MatMulNBits" in int4["fp8"][1]
    assert family != "deepseek_v3" or "QMoE" in int4["fp8"][1]
    assert int4["fp8"] == int4["dense"]


@pytest.mark.parametrize(("ep", "dtype"), [("cpu", "f16"), ("cuda", "bf16")])
def test_fp8_weights_stream_into_every_dtype(ep, dtype, tmp_path, monkeypatch):
    """An FP8 checkpoint's f16 or bf16 graph (cuda's: cpu runs no bf16) holds exactly what its
    dequantized float twin's holds, saved from the same reads: row bands and column windows
    (a part of a packed q/k/v is read whole, from either)."""
    dense, packed = _fp8_pair(tmp_path, "qwen2", (32, 32))
    monkeypatch.setattr(weights, "STREAM_ELEMENTS", 500)
    monkeypatch.setattr(weights, "TRANSPOSE_WINDOW_BYTES", 1000)
    reads = []
    original = Checkpoint.read
    monkeypatch.setattr(
        Checkpoint, "read", lambda self, n, i=None: reads.append((n, i)) or original(self, n, i)
    )
    saved = {}
    for name, ckpt in (("fp8", packed), ("dense", dense)):
        reads.clear()
        mobius_genai.build(ckpt, ep, dtype, progress=False).save(tmp_path / name / "b")
        weight_reads = [(n, i) for n, i in reads if _quantized_name(n)]
        saved[name] = (tmp_path / name / "b" / "model.onnx.data").read_bytes(), weight_reads
    assert any(index is not None for _, index in saved["fp8"][1])
    assert saved["fp8"] == saved["dense"]


def _compressed(strategy: str, *, block=None, activations=None, **changes) -> dict:
    """A compressed-tensors float-quantized quantization_config (llm-compressor's FP8)."""
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True}
    weights |= {"dynamic": False, "block_structure": block}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head", NOT_CONVERTED],
        "kv_cache_scheme": None,
        **changes,
    }


DYNAMIC = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
#: strategy → (its scales' block, its config): per tensor ([1]), per output channel
#: ([rows, 1], dynamic activations: FP8-dynamic) and ragged blocks.
COMPRESSED = {
    "tensor": ((None, None), _compressed("tensor")),
    "channel": ((1, None), _compressed("channel", activations=DYNAMIC)),
    "block": ((32, 48), _compressed("block", block=[32, 48], activations=DYNAMIC)),
}


@pytest.mark.parametrize("strategy", sorted(COMPRESSED))
def test_compressed_tensors_fp8_builds_the_model_transformers_runs(strategy, tmp_path):
    block, quantization = COMPRESSED[strategy]
    dense, packed = _fp8_pair(tmp_path, "llama", block, compressed=quantization)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(dense, ids, decode_steps=3)
    package = mobius_genai.build(packed, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "cpu"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


GROUP = "config.json: quantization_config.config_groups.group_0"
#: case → (the quantization_config, the error's words)
BAD_COMPRESSED = {
    "int4 packed": (
        _compressed("channel", format="pack-quantized"),
        "format is 'pack-quantized' \\(compressed-tensors\\); accepted: 'float-quantized'",
    ),
    "static activations": (
        _compressed("tensor", activations={**DYNAMIC, "dynamic": False}),
        f"{GROUP}.input_activations.dynamic is False .*static activation scales are not read",
    ),
    "fp8 kv cache": (
        _compressed("tensor", kv_cache_scheme={"num_bits": 8, "type": "float"}),
        "kv_cache_scheme is set \\(compressed-tensors\\); accepted: null",
    ),
    "group strategy": (
        _compressed("group"),
        f"{GROUP}.weights.strategy is 'group' .*accepted: 'tensor', 'channel', 'block'",
    ),
    "int8 weights": (
        _compressed("channel") | {"config_groups": {"group_0": {"weights": {"type": "int"}}}},
        f"{GROUP}.weights.type is 'int' \\(compressed-tensors\\); accepted: 'float'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_COMPRESSED))
def test_bad_compressed_tensors_configs_are_named(case, tmp_path):
    quantization, words = BAD_COMPRESSED[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "llama")
    _with_quantization(ckpt, quantization, replace=True)
    with pytest.raises(ConfigError, match=words):
        mobius_genai.build(ckpt, "cpu", "f32", progress=False)


def test_misshapen_channel_scales_are_named(tmp_path):
    _, packed = _fp8_pair(tmp_path, "llama", (1, None), compressed=_compressed("channel"))
    scale = "model.layers.2.self_attn.k_proj.weight_scale"
    _rewrite(packed, lambda t: t.update({scale: t[scale][:16].contiguous()}))
    with pytest.raises(WeightsError, match=rf"'{scale}' has shape \[16, 1\]; .*needs \[32, 1\]"):
        mobius_genai.build(packed, "cpu", "f32", progress=False)
