"""INT4 MoE experts as com.microsoft::QMoE where the EP has the kernel (the cpu EP).

Each expert is quantized block-wise in MatMulNBits' layout (quantize/qmoe.py). Checked here:
the ops per EP; the QMoE graph equals, to fp32 noise, the same int4 graph whose experts stay
float with the values the int4 codes stand for (the layout: interleaving, nibble order, scales,
zero points); int4 bundles generate with onnxruntime-genai and their logits stay near the fp32
graph's; and the experts stream: no tensor holding a whole layer's experts is ever built.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai.checkpoint.experts import ExpertsTensor
from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options, qmoe, quantize_int4
from mobius_genai.quantize.layout import dequantize_matmul_nbits, quantize_matmul_nbits
from tests._bundles import TOKENIZER_FILES
from tests._hf import write_tiny_checkpoint
from tests._ort import og_sequence, ort_session
from tests.conftest import TINY_QWEN2

CPU = get_ep("cpu")
#: Relative rms error of int4 logits vs the fp32 graph's (rms(int4 - fp32) / rms(fp32)) over a
#: 2 x 12-token prefill, block size 16, the builder recipe. Tiny random checkpoints quantize badly whatever the op
#: (the dense layers alone, experts float, measured 0.61 / 0.33 / 0.49 for mixtral / phimoe /
#: qwen2_moe); with QMoE experts 0.64 / 0.39 / 0.52, i.e. 1.04-1.17 times the dense-only error.
INT4_RELATIVE_RMS = 0.7
EXPERTS_ERROR_RATIO = 1.25
#: QMoE vs float experts holding the dequantized values (fp32 accumulation order only)
LAYOUT_TOLERANCE = 1e-4


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


def _logits(package, folder) -> np.ndarray:
    session = ort_session(package, folder)
    ids = _ids()
    feeds = {}
    for info in session.get_inputs():
        if info.name == "input_ids":
            feeds[info.name] = ids
        elif info.name == "attention_mask":
            feeds[info.name] = np.ones_like(ids)
        elif info.name == "position_ids":
            feeds[info.name] = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1))
        else:
            _, heads, _, head_dim = info.shape
            feeds[info.name] = np.zeros((ids.shape[0], heads, 0, head_dim), np.float32)
    return session.run(["logits"], feeds)[0]


def _int4(ckpt, options: Int4Options, ep=CPU):
    package = mobius_genai.build(ckpt, ep, "f32", progress=False)
    report = quantize_int4(package.models["model"], options, ep)
    return package, report


@pytest.mark.parametrize(("family", "moe_nodes"), [("mixtral", 3), ("phimoe", 6)])
def test_cpu_int4_experts_are_qmoe(family, moe_nodes, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    package, report = _int4(ckpt, Int4Options())
    nodes = list(package.models["model"].graph)
    ops = Counter(node.op_type for node in nodes)
    assert (ops["QMoE"], ops["MoE"]) == (moe_nodes, 0)
    node = next(node for node in nodes if node.op_type == "QMoE")
    assert node.attributes["expert_weight_bits"].as_int() == 4
    assert node.attributes["block_size"].as_int() == 32
    assert node.attributes["accuracy_level"].as_int() == CPU.default_int4_accuracy_level
    # one quantized copy per layer's experts, shared by phimoe's two nodes
    assert report.op_counts["QMoE"] == 2 * 3
    assert not any(key[1] == "MoE" for key in package.models["model"].functions)


def test_gpt_oss_qmoe_keeps_the_expert_biases_and_the_clamped_swiglu(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    package, _ = _int4(ckpt, Int4Options())
    nodes = [node for node in package.models["model"].graph if node.op_type == "QMoE"]
    assert nodes
    for node in nodes:
        assert node.inputs[4] is not None and node.inputs[7] is not None  # fc1 and fc2 biases
        attributes = node.attributes
        assert attributes["activation_alpha"].as_float() == pytest.approx(1.702)
        assert attributes["activation_beta"].as_float() == 1.0
        assert attributes["swiglu_limit"].as_float() > 0


def test_onnx_standard_int4_keeps_float_experts_and_standard_ops(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral")
    ep = get_ep("onnx-standard")
    package, report = _int4(ckpt, Int4Options(), ep)
    assert {node.domain for node in package.models["model"].graph} == {""}
    assert "QMoE" not in report.op_counts


def _dequantized_checkpoint(ckpt, block_size: int, symmetric: bool) -> None:
    """Replace every expert matrix of a mixtral checkpoint by the values its int4 codes stand
    for (MatMulNBits' block-wise scheme, dequantized by the numpy reference of the op spec)."""
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    for name, value in tensors.items():
        if ".experts." in name:
            nbits = quantize_matmul_nbits(np.ascontiguousarray(value.T), block_size, symmetric)
            tensors[name] = np.ascontiguousarray(dequantize_matmul_nbits(nbits, value.shape[1]).T)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("symmetric", [True, False])
def test_qmoe_computes_what_its_int4_codes_stand_for(symmetric, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "mixtral", seed=1)
    options = Int4Options(symmetric=symmetric, accuracy_level=0, quality="builder")
    package, _ = _int4(ckpt, options)
    ours = _logits(package, tmp_path / "qmoe")
    _dequantized_checkpoint(ckpt, 32, symmetric)
    float_experts = CPU.with_kernels({"QMoE": False})
    package, report = _int4(ckpt, options, float_experts)
    assert "QMoE" not in report.op_counts
    reference = _logits(package, tmp_path / "float")
    assert np.abs(ours - reference).max() <= LAYOUT_TOLERANCE


def _relative_rms(logits: np.ndarray, reference: np.ndarray) -> float:
    return float(np.sqrt(((logits - reference) ** 2).mean() / (reference**2).mean()))


@pytest.mark.parametrize("family", ["mixtral", "phimoe", "qwen2_moe", "gpt_oss"])
def test_int4_logits_stay_near_fp32(family, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    fp32 = _logits(mobius_genai.build(ckpt, "cpu", "f32", progress=False), tmp_path / "fp32")
    options = Int4Options(block_size=16, quality="builder")  # (the measurements above)
    errors = {}
    for name, ep in (("qmoe", CPU), ("float", CPU.with_kernels({"QMoE": False}))):
        package, _ = _int4(ckpt, options, ep)
        errors[name] = _relative_rms(_logits(package, tmp_path / name), fp32)
    assert errors["qmoe"] <= INT4_RELATIVE_RMS, errors
    assert errors["qmoe"] <= EXPERTS_ERROR_RATIO * errors["float"], errors


def _bundle_checkpoint(folder, family: str):
    """A tiny checkpoint with the committed tiny-qwen2 tokenizer (vocab 384)."""
    ckpt = write_tiny_checkpoint(
        folder, family, seed=3, vocab_size=384, bos_token_id=381, eos_token_id=383
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, ckpt / name)
    return ckpt


def _refuse_whole_layers(patch: pytest.MonkeyPatch) -> None:
    def refuse(self):
        raise AssertionError(f"{self.name}: every expert of a layer materialized at once")

    patch.setattr(ExpertsTensor, "_load", refuse)
    patch.setattr(qmoe.QuantizedExperts, "_load", refuse)


@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_cpu_bundle_streams_experts_and_generates(precision, tmp_path):
    ckpt = _bundle_checkpoint(tmp_path / "ckpt", "phimoe")
    with pytest.MonkeyPatch.context() as patch:
        _refuse_whole_layers(patch)
        out = mobius_genai.package(
            ckpt, "cpu", tmp_path / "bundle", precision=precision, quiet=True
        )
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["QMoE" if precision == "int4" else "MoE"] == 6
    if precision == "int4":  # (calibrating would read a layer's experts at once)
        manifest = json.loads((out / "mobius_manifest.json").read_text())
        skipped = manifest["build"]["quantization"]["calibration_skipped"]
        assert "MoE experts" in skipped and skipped in (out / "README.md").read_text()
    assert len(og_sequence(out, [381, 17, 92, 250], max_length=20)) == 20


def test_int4_bundle_reads_and_quantizes_each_expert_once(tmp_path):
    """Saving the packed codes, the scales and the zero points of a stacked expert tensor
    quantizes each expert once: each expert's float matrix (an MXFP4 decode for gpt_oss) is read
    once, not once per QMoE array."""
    ckpt = _bundle_checkpoint(tmp_path / "ckpt", "mixtral")
    reads: Counter = Counter()
    original = ExpertsTensor.expert

    def counted(self, index):
        reads[(self.name, index)] += 1
        return original(self, index)

    for symmetric in (True, False):
        reads.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ExpertsTensor, "expert", counted)
            mobius_genai.package(
                ckpt,
                "cpu",
                tmp_path / f"bundle-{symmetric}",
                precision="int4",
                int4=Int4Options(block_size=16, symmetric=symmetric),
                quiet=True,
                smoke_test=False,
            )
        assert reads, "no expert was read"
        assert set(reads.values()) == {1}, Counter(reads.values())
