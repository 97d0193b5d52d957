"""EpRegistry: lookup, aliases, registration rules, the module-level helpers and the table."""

from __future__ import annotations

import re

import onnx_ir as ir
import pytest

import mobius_genai.ep.registry as registry_module
from mobius_genai.ep import (
    BUILTIN_EPS,
    EpCapabilities,
    EpRegistry,
    ep_registry,
    format_ep_table,
    get_ep,
    register_ep,
)
from mobius_genai.ep.builtins import _register_builtins
from mobius_genai.errors import ExecutionProviderError

BUILTIN_NAMES = ["cpu", "cuda", "default", "dml", "mlx", "onnx-standard", "trt-rtx", "webgpu"]


def _caps(name: str, **fields) -> EpCapabilities:
    return EpCapabilities(name=name, gqa_dtypes=frozenset({ir.DataType.FLOAT16}), **fields)


@pytest.fixture
def registry() -> EpRegistry:
    fresh = EpRegistry()
    _register_builtins(fresh)
    return fresh


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
    assert "CUDA" not in ep_registry  # names are exact, lowercase


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
        _register_builtins(registry)


def test_format_ep_table():
    table = format_ep_table()
    lines = table.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == [
        "name",
        "dtypes",
        "GQA dtypes",
        "fused rope",
        "skip-norm",
        "fused matmul",
        "custom ops",
        "int4",
        "provider options",
        "graph capture",
    ]
    assert set(lines[1]) <= {"-", " "}
    rows = {
        line.split()[0]: dict(zip(header, re.split(r"\s{2,}", line.rstrip()), strict=False))
        for line in lines[2 : 2 + len(BUILTIN_NAMES)]
    }
    assert list(rows) == BUILTIN_NAMES
    assert rows["cuda"]["GQA dtypes"] == "f16, bf16"
    assert rows["cuda"]["provider options"] == "enable_cuda_graph=0"
    assert rows["trt-rtx"]["graph capture"] == "on" and rows["webgpu"]["graph capture"] == "off"
    assert rows["cpu"]["dtypes"] == "f32, f16" and rows["cuda"]["dtypes"] == "f32, f16, bf16"
    assert rows["cpu"]["int4"] == "MatMulNBits, level 4"
    assert rows["default"]["int4"] == rows["onnx-standard"]["int4"] == "DequantizeLinear"
    standard = rows["onnx-standard"]
    assert [standard[c] for c in header[2:7]] == ["-", "no", "no", "no", "no"]
    assert lines[-1] == "aliases: portable -> default"


def test_format_ep_table_of_custom_registry(registry: EpRegistry):
    registry.register(_caps("zz-ep"))
    assert format_ep_table(registry).splitlines()[-3].startswith("zz-ep ")


def test_by_genai_provider_finds_the_ep_a_genai_config_names():
    assert ep_registry.by_genai_provider("cuda").name == "cuda"
    assert ep_registry.by_genai_provider("nvtensorrtrtx").name == "trt-rtx"  # any case
    assert ep_registry.by_genai_provider("MLXExecutionProvider").name == "mlx"
    assert ep_registry.by_genai_provider("tpu") is None
