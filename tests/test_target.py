"""One target resolved once: EP, dtype, precision, int4 options and context length."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

from mobius_genai import build, package, resolve_target
from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.errors import ConfigError, ExecutionProviderError
from mobius_genai.quantize import Int4Options
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.conftest import TINY_QWEN2

F32, F16, BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16


def _pair(ep: str, dtype=None, precision=None) -> tuple[ir.DataType, str]:
    target = resolve_target(ep, dtype=dtype, precision=precision)
    return target.dtype, target.precision


@pytest.mark.parametrize(
    ("ep", "expected"),
    [
        ("cpu", (F32, "fp32")),
        ("default", (F32, "fp32")),
        ("onnx-standard", (F32, "fp32")),
        ("cuda", (F16, "fp16")),
        ("dml", (F16, "fp16")),
        ("webgpu", (F16, "fp16")),
        ("trt-rtx", (F16, "fp16")),
        ("mlx", (F16, "fp16")),
    ],
)
def test_default_dtype_per_ep(ep: str, expected):
    assert _pair(ep) == expected


def test_dtype_and_precision_choose_each_other():
    assert _pair("cuda", "fp32") == (F32, "fp32")
    assert _pair("cuda", None, "bf16") == (BF16, "bf16")
    assert _pair("cuda", "bf16", "bf16") == (BF16, "bf16")
    with pytest.raises(ConfigError, match="contradicts"):
        _pair("cuda", "fp32", "fp16")
    assert _pair("cuda", None, "int4") == (get_ep("cuda").default_dtype, "int4")
    assert _pair("cpu", None, "int4") == (F32, "int4")
    assert _pair("cuda", "bf16", "int4") == (BF16, "int4")
    with pytest.raises(ConfigError, match=r"precision 'fp8' is not supported"):
        _pair("cuda", None, "fp8")
    with pytest.raises(ConfigError, match="dtype 'f64' is not supported; accepted: fp32, fp16"):
        _pair("cuda", "f64")
    with pytest.raises(ConfigError, match="dtype DOUBLE is not supported"):
        _pair("cpu", ir.DataType.DOUBLE, "int4")


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [("f16", F16), ("FP16", F16), ("float16", F16), ("f32", F32), ("bfloat16", BF16)],
)
def test_one_vocabulary_with_the_usual_spellings(spelling: str, dtype: ir.DataType):
    assert resolve_target("cuda", dtype=spelling).dtype == dtype
    assert resolve_target("cuda", precision=spelling).dtype == dtype


@pytest.mark.parametrize("ep", ["cpu", "dml", "webgpu"])
@pytest.mark.parametrize(("dtype", "precision"), [(None, "bf16"), ("bf16", None), ("bf16", "int4")])
def test_eps_without_bf16_kernels_refuse_bf16(ep: str, dtype, precision):
    with pytest.raises(
        ExecutionProviderError, match=f"{ep!r} does not run bf16 models.*fp32, fp16"
    ):
        resolve_target(ep, dtype=dtype, precision=precision)


def test_int4_options_belong_to_int4():
    assert resolve_target("cpu", precision="int4").int4 == Int4Options(accuracy_level=4)
    assert resolve_target("cpu").int4 is None
    chosen = Int4Options(block_size=64, accuracy_level=1)
    assert resolve_target("cpu", precision="int4", int4=chosen).int4 == chosen
    implied = resolve_target("cpu", int4=chosen)  # int4 options imply int4
    assert (implied.precision, implied.int4) == ("int4", chosen)
    with pytest.raises(ConfigError, match="int4 options were given for precision 'fp16'"):
        resolve_target("cpu", precision="fp16", int4=chosen)


@pytest.mark.parametrize(
    ("ep", "choices", "stored", "precision", "dequantize"),
    [
        ("cpu", {}, {4, 8}, "int4", False),  # a Q4 GGUF: its integers kept
        ("cpu", {"precision": "fp32"}, {4}, "fp32", True),  # a float precision asked
        ("cpu", {"dtype": "fp16"}, {4}, "int4", False),  # dtype: the activations'
        ("cpu", {}, {8}, "int8", False),  # 8-bit integers kept: an int8 bundle
        ("cpu", {}, set(), "fp32", False),  # float weights
        ("onnx-standard", {}, {4}, "fp32", True),  # no MatMulNBits: dequantized
    ],
)
def test_the_precision_is_resolved_with_what_the_source_stores(
    ep, choices, stored, precision, dequantize
):
    target = resolve_target(ep, stored=stored, **choices)
    assert (target.precision, target.dequantize_stored) == (precision, dequantize)


def test_a_target_must_know_what_the_source_stores(tmp_path):
    """package() names its output with the target's precision: a target resolved for float
    weights cannot name the bundle of a source storing 4-bit integers."""
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama")
    with pytest.raises(ConfigError, match="resolved for a source storing float weights, but"):
        package(gguf, output=tmp_path / "b", target=resolve_target("cpu"))
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("ep", "precision", "int4", "level"),
    [
        ("cpu", None, None, 4),  # a pre-quantized source's kept integers: the EP's level
        ("cpu", "int4", None, 4),
        ("cpu", "int4", Int4Options(accuracy_level=0), 0),
        ("cuda", None, None, 0),
        ("webgpu", "int4", Int4Options(accuracy_level=2), 2),
    ],
)
def test_int4_accuracy_level_is_resolved_once(ep, precision, int4, level):
    """The level asked for, else the EP's, for every MatMulNBits: the int4 options carry it."""
    target = resolve_target(ep, precision=precision, int4=int4)
    assert target.int4_accuracy_level == level
    if target.int4 is not None:
        assert target.int4.accuracy_level == level


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "48"])
def test_context_length_is_a_positive_integer(value):
    with pytest.raises(ConfigError, match="context length .* accepted: a positive integer"):
        resolve_target("cpu", context_length=value)
    assert resolve_target("cpu", context_length=48).context_length == 48


def test_the_python_default_is_the_cli_default(tmp_path):
    """build(model, "cuda") builds what `mobius-genai build model --ep cuda` builds."""
    built = build(TINY_QWEN2, "cuda", load_weights=False)
    assert (
        main(["build", str(TINY_QWEN2), "--ep", "cuda", "--no-weights", "-o", str(tmp_path / "g")])
        == 0
    )
    model = ir.load(tmp_path / "g" / "model.onnx")
    assert built.dtype == F16
    assert model.graph.outputs[0].dtype == built["model"].graph.outputs[0].dtype == F16


def test_a_target_is_not_given_twice(tmp_path):
    target = resolve_target("cpu")
    with pytest.raises(ConfigError, match="given a target and also"):
        build(TINY_QWEN2, "cuda", target=target, load_weights=False)
    with pytest.raises(ConfigError, match="given a target and also"):
        package(TINY_QWEN2, output=tmp_path / "b", target=target, precision="int4")
    assert not (tmp_path / "b").exists()


def test_graph_capture_is_a_choice_of_the_target(tmp_path, capsys):
    assert resolve_target("cuda", graph_capture=True).ep.enable_graph_capture
    assert not resolve_target("trt-rtx", graph_capture=False).ep.enable_graph_capture
    assert resolve_target("trt-rtx").ep.enable_graph_capture  # the EP's default
    with pytest.raises(ConfigError, match="'cpu' has no graph capture"):
        resolve_target("cpu", graph_capture=True)
    out = tmp_path / "b"
    args = ["package", str(TINY_QWEN2), "--ep", "cuda", "-o", str(out), "--quiet"]
    assert main([*args, "--no-smoke-test", "--graph-capture", "on"]) == 0
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["provider_options"] == [
        {"cuda": {"enable_cuda_graph": "1"}}
    ]
    assert main(["package", str(TINY_QWEN2), "--ep", "cpu", "--graph-capture", "on"]) == 1
    assert "has no graph capture" in capsys.readouterr().err
