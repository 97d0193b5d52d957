"""EpRegistry: lookup, aliases, registration rules, the module-level helpers and the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import onnx_ir as ir
import onnxruntime as ort
import pytest

import mobius_genai.ep.builtins as builtins_module
import mobius_genai.ep.registry as registry_module
from mobius_genai.cli._eps import format_ep_table
from mobius_genai.ep import (
    BUILTIN_ALIASES,
    BUILTIN_EPS,
    EpCapabilities,
    EpRegistry,
    ep_registry,
    get_ep,
    register_ep,
)
from mobius_genai.ep.capabilities import RuntimeInfo
from mobius_genai.errors import ExecutionProviderError

BUILTIN_NAMES = ["cpu", "cuda", "default", "dml", "mlx", "onnx-standard", "trt-rtx", "webgpu"]


def _caps(name: str, **fields) -> EpCapabilities:
    return EpCapabilities(name=name, gqa_dtypes=frozenset({ir.DataType.FLOAT16}), **fields)


@pytest.fixture
def registry() -> EpRegistry:
    return EpRegistry(BUILTIN_EPS, BUILTIN_ALIASES)


@pytest.fixture
def global_registry(monkeypatch: pytest.MonkeyPatch, registry: EpRegistry) -> EpRegistry:
    """Swap the module-level registry so tests that register do not leak into others."""
    monkeypatch.setattr(registry_module, "ep_registry", registry)
    return registry


def test_global_registry_iterates_canonical_names_sorted():
    assert list(ep_registry) == BUILTIN_NAMES
    assert len(ep_registry) == len(BUILTIN_NAMES)


def test_contains_covers_names_and_aliases_only():
    assert "cuda" in ep_registry
    assert "portable" in ep_registry
    assert "rocm" not in ep_registry
    assert "CUDA" in ep_registry and "Portable" in ep_registry  # any case
    assert "CUDAExecutionProvider" in ep_registry  # onnxruntime's name
    assert 3 not in ep_registry


def test_get_returns_registered_caps_or_none():
    assert ep_registry.get("cuda") is next(c for c in BUILTIN_EPS if c.name == "cuda")
    assert ep_registry.get("rocm") is None


def test_portable_alias_resolves_to_default_but_is_not_iterated():
    assert ep_registry.get("portable") is ep_registry.get("default")
    assert get_ep("portable").name == "default"
    assert "portable" not in list(ep_registry)
    assert ep_registry.aliases == {"portable": "default"}
    assert ep_registry.canonical_name("portable") == "default"
    assert ep_registry.canonical_name("cuda") == "cuda"
    assert ep_registry.canonical_name("rocm") is None


def test_unknown_name_error_text_is_exact():
    expected = f"Unknown execution provider 'rocm'. Supported: {BUILTIN_NAMES}"
    with pytest.raises(ValueError) as excinfo:
        ep_registry.require("rocm")
    assert str(excinfo.value) == expected
    assert isinstance(excinfo.value, ExecutionProviderError)
    with pytest.raises(ValueError) as excinfo:
        get_ep("rocm")
    assert str(excinfo.value) == expected


def test_get_ep_is_require():
    for name in BUILTIN_NAMES:
        assert get_ep(name) is ep_registry.require(name)


def test_register_new_ep(registry: EpRegistry):
    caps = _caps("my-ep")
    registry.register(caps)
    assert registry.require("my-ep") is caps
    assert "my-ep" in list(registry)
    assert len(registry) == len(BUILTIN_NAMES) + 1


def test_duplicate_registration_is_rejected(registry: EpRegistry):
    original = registry.require("cuda")
    with pytest.raises(
        ValueError, match=r"Execution provider 'cuda' is already registered; pass replace=True"
    ):
        registry.register(_caps("cuda"))
    assert registry.require("cuda") is original


def test_replace_overrides_existing(registry: EpRegistry):
    replacement = _caps("cuda", supports_fused_rope=False)
    registry.register(replacement, replace=True)
    assert registry.require("cuda") is replacement
    assert len(registry) == len(BUILTIN_NAMES)


def test_replace_of_new_name_just_registers(registry: EpRegistry):
    caps = _caps("fresh")
    registry.register(caps, replace=True)
    assert registry.get("fresh") is caps


def test_name_taken_by_alias_cannot_be_registered(registry: EpRegistry):
    with pytest.raises(ValueError, match=r"'portable' is already an alias of 'default'"):
        registry.register(_caps("portable"), replace=True)


def test_alias_rules(registry: EpRegistry):
    registry.register_alias("gpu", "cuda")
    assert registry.get("gpu") is registry.get("cuda")
    with pytest.raises(ValueError, match=r"'gpu' is already taken"):
        registry.register_alias("gpu", "dml")
    with pytest.raises(ValueError, match=r"'cpu' is already taken"):
        registry.register_alias("cpu", "cuda")
    with pytest.raises(ValueError, match=r"Cannot alias 'x' to unknown execution provider 'rocm'"):
        registry.register_alias("x", "rocm")


def test_register_rejects_non_capabilities(registry: EpRegistry):
    with pytest.raises(TypeError, match=r"expects EpCapabilities, got dict"):
        registry.register({"name": "x"})  # type: ignore[arg-type]


def test_module_level_register_ep(global_registry: EpRegistry):
    caps = _caps("my-ep")
    register_ep(caps)
    assert get_ep("my-ep") is caps
    with pytest.raises(ValueError, match=r"'my-ep' is already registered"):
        register_ep(_caps("my-ep"))
    other = _caps("my-ep", default_int4_accuracy_level=2)
    register_ep(other, replace=True)
    assert get_ep("my-ep") is other
    assert "my-ep" not in ep_registry  # the real global registry was not touched


def test_builtins_register_in_table_order_independent_of_iteration(registry: EpRegistry):
    assert list(registry) == BUILTIN_NAMES
    for caps in BUILTIN_EPS:
        assert registry.require(caps.name) is caps


def test_builtins_cannot_be_registered_twice(registry: EpRegistry):
    with pytest.raises(ValueError, match=r"already registered"):
        registry.register(BUILTIN_EPS[0])


def test_builtins_module_is_pure_data_without_the_registry():
    """builtins.py holds the table only; the registry registers it (no import circle)."""
    tree = ast.parse(Path(builtins_module.__file__).read_text(encoding="utf-8"))
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "mobius_genai.ep.registry" not in imported


def test_format_ep_table():
    table = format_ep_table(wide=True)
    lines = table.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == [
        "name",
        "dtypes",
        "GQA dtypes",
        "fused rope",
        "skip-norm",
        "fused matmul",
        "fused MoE",
        "packed MHA",
        "custom ops",
        "int4",
        "provider options",
        "graph capture",
        "onnxruntime EP",
    ]
    assert set(lines[1]) <= {"-", " "}
    rows = {
        line.split()[0]: dict(zip(header, re.split(r"\s{2,}", line.rstrip()), strict=False))
        for line in lines[2 : 2 + len(BUILTIN_NAMES)]
    }
    assert list(rows) == BUILTIN_NAMES
    assert rows["cuda"]["GQA dtypes"] == "fp16, bf16"
    assert rows["cuda"]["provider options"] == "enable_cuda_graph=0"
    assert rows["trt-rtx"]["graph capture"] == "on" and rows["webgpu"]["graph capture"] == "off"
    assert rows["trt-rtx"]["onnxruntime EP"] == "NvTensorRTRTXExecutionProvider"
    assert rows["default"]["onnxruntime EP"] == "-"
    assert rows["cpu"]["dtypes"] == "fp32, fp16" and rows["cuda"]["dtypes"] == "fp32, fp16, bf16"
    assert rows["cpu"]["int4"] == "MatMulNBits, level 4"
    assert rows["default"]["int4"] == rows["onnx-standard"]["int4"] == "DequantizeLinear"
    standard = rows["onnx-standard"]
    assert [standard[c] for c in header[2:9]] == ["-", "no", "no", "no", "no", "no", "no"]
    assert rows["cpu"]["fused MoE"] == "yes (int4: QMoE)"  # experts quantized to QMoE
    assert rows["default"]["fused MoE"] == "yes"
    assert rows["cuda"]["fused MoE"] == "no"  # its MoE kernel is not measured
    # PackedMultiHeadAttention (vision towers): onnxruntime's only kernel is CUDA's
    assert [name for name, row in rows.items() if row["packed MHA"] != "no"] == ["cuda"]
    assert rows["cuda"]["packed MHA"] == "yes (fp32, fp16)"
    assert lines[-2:] == [
        "aliases: portable -> default",
        "Names are accepted in any case, and an EP's onnxruntime EP name stands for it.",
    ]


def test_format_ep_table_of_custom_registry(registry: EpRegistry):
    registry.register(_caps("zz-ep"))
    assert format_ep_table(registry, wide=True).splitlines()[-4].startswith("zz-ep ")


def test_by_genai_provider_finds_the_ep_a_genai_config_names():
    assert ep_registry.by_genai_provider("cuda").name == "cuda"
    assert ep_registry.by_genai_provider("nvtensorrtrtx").name == "trt-rtx"  # any case
    assert ep_registry.by_genai_provider("MLXExecutionProvider").name == "mlx"
    assert ep_registry.by_genai_provider("tpu") is None


@pytest.mark.parametrize("name", ["CUDA", "Cuda", "cUdA", "Cpu", "TRT-RTX", "Onnx-Standard"])
def test_names_are_accepted_in_any_case(name: str):
    assert get_ep(name) is get_ep(name.lower())
    assert ep_registry.canonical_name(name) == name.lower()


@pytest.mark.parametrize(
    ("ort_name", "ours"),
    [
        ("CPUExecutionProvider", "cpu"),
        ("CUDAExecutionProvider", "cuda"),
        ("DmlExecutionProvider", "dml"),
        ("WebGpuExecutionProvider", "webgpu"),
        ("NvTensorRTRTXExecutionProvider", "trt-rtx"),
        ("MLXExecutionProvider", "mlx"),
        ("cudaexecutionprovider", "cuda"),
    ],
)
def test_onnxruntime_provider_names_are_aliases(ort_name: str, ours: str):
    assert get_ep(ort_name).name == ours
    assert ep_registry.by_ort_provider(ort_name).name == ours


def test_builtin_onnxruntime_names_are_onnxruntimes():
    """Spelled as onnxruntime spells them (NvTensorRTRTX and MLX are plugin EPs it does not list)."""
    known = set(ort.get_all_providers())
    declared = {caps.runtime.ort_provider for caps in BUILTIN_EPS} - {None}
    plugins = {"NvTensorRTRTXExecutionProvider", "MLXExecutionProvider"}
    assert declared - plugins <= known
    assert plugins <= declared


def test_by_ort_provider_does_not_take_our_names():
    assert ep_registry.by_ort_provider("cuda") is None
    assert ep_registry.by_ort_provider("TensorrtExecutionProvider") is None


def test_unknown_alias_or_case_keeps_the_spec_error():
    expected = f"Unknown execution provider 'ROCmExecutionProvider'. Supported: {BUILTIN_NAMES}"
    with pytest.raises(ExecutionProviderError) as excinfo:
        get_ep("ROCmExecutionProvider")
    assert str(excinfo.value) == expected


def test_an_onnxruntime_name_cannot_be_taken_twice(registry: EpRegistry):
    clash = _caps("my-ep", runtime=RuntimeInfo(ort_provider="cudaExecutionProvider"))
    with pytest.raises(ValueError, match=r"'cudaExecutionProvider' already refers to 'cuda'"):
        registry.register(clash)
    assert "my-ep" not in registry


def test_a_name_cannot_shadow_an_onnxruntime_name(registry: EpRegistry):
    with pytest.raises(ValueError, match=r"'cudaexecutionprovider' already refers to 'cuda'"):
        registry.register(_caps("cudaexecutionprovider"))
    with pytest.raises(ValueError, match=r"'CPUExecutionProvider' is already taken"):
        registry.register_alias("CPUExecutionProvider", "cuda")
    with pytest.raises(ValueError, match=r"'CUDA' is already taken"):
        registry.register_alias("CUDA", "cpu")


def test_replacing_an_ep_may_keep_its_onnxruntime_name(registry: EpRegistry):
    replacement = _caps("cuda", runtime=get_ep("cuda").runtime)
    registry.register(replacement, replace=True)
    assert registry.by_ort_provider("CUDAExecutionProvider") is replacement


def test_aliases_are_case_insensitive(registry: EpRegistry):
    registry.register_alias("GPU", "cuda")
    assert registry.get("gpu") is registry.get("Gpu") is registry.get("cuda")


def test_resolve_ep_is_the_one_place_an_ep_argument_becomes_an_entry():
    import mobius_genai.optimize.pipeline as pipeline
    import mobius_genai.target as target
    from mobius_genai.ep import resolve_ep

    cuda = get_ep("cuda")
    assert resolve_ep(cuda) is cuda and resolve_ep("CUDAExecutionProvider") is cuda
    with pytest.raises(ExecutionProviderError, match="Unknown execution provider 'rocm'"):
        resolve_ep("rocm")
    assert target.resolve_ep is resolve_ep and pipeline.resolve_ep is resolve_ep
