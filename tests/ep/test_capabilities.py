"""EpCapabilities: the built-in table matches the spec, the dataclass is frozen and validated."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import pytest

from mobius_genai.ep import BUILTIN_EPS, EpCapabilities, RuntimeInfo, get_ep

F32 = ir.DataType.FLOAT
F16 = ir.DataType.FLOAT16
BF16 = ir.DataType.BFLOAT16

# The spec's registry table plus the packager fields, written out independently of builtins.py.
# Fields not named here must keep the dataclass default.
EXPECTED = {
    "default": {"supports_matmul_nbits": False},
    "cpu": {
        "gqa_dtypes": {F32},
        "qkv_pack_dtypes": {F32},
        "default_int4_accuracy_level": 4,
        "model_dtypes": {F32, F16},
        "runtime": RuntimeInfo(ort_provider="CPUExecutionProvider"),
        "supports_qmoe": True,
    },
    "cuda": {
        "supports_fused_moe": False,
        "supports_packed_multi_head_attention": True,  # the only onnxruntime kernel is CUDA's
        "gqa_dtypes": {F16, BF16},
        "qkv_pack_dtypes": {F16, BF16},
        "provider_options": {"enable_cuda_graph": "0"},
        "runtime": RuntimeInfo(
            ort_provider="CUDAExecutionProvider",
            genai_provider="cuda",
            package="onnxruntime-genai-cuda",
            card_note="It is the build for CUDA 12. The CPU-only wheel cannot load this bundle.",
        ),
        "default_dtype": F16,
        "graph_capture_option": "enable_cuda_graph",
    },
    "dml": {
        "supports_fused_moe": False,
        "supports_gqa_head_sink": False,
        "gqa_dtypes": {F16},
        "supports_fused_rope": False,
        "provider_options": {"enable_graph_capture": "0"},
        "runtime": RuntimeInfo(
            ort_provider="DmlExecutionProvider",
            genai_provider="dml",
            package="onnxruntime-genai-directml",
            card_note="It is the DirectML build, for Windows. The CPU-only wheel cannot load "
            "this bundle.",
        ),
        "default_dtype": F16,
        "graph_capture_option": "enable_graph_capture",
        "graph_capture_unless_disabled": True,
        "supports_rms_normalization": False,
        "model_dtypes": {F32, F16},
    },
    "webgpu": {
        "supports_fused_moe": False,
        "supports_gqa_head_sink": False,
        "gqa_dtypes": {F32, F16},
        "default_int4_accuracy_level": 4,
        "provider_options": {"enableGraphCapture": "0"},
        "runtime": RuntimeInfo(
            ort_provider="WebGpuExecutionProvider",
            genai_provider="webgpu",
            card_note="The CPU-only wheel cannot load this bundle.",
        ),
        "default_dtype": F16,
        "supports_shape_op": False,
        "graph_capture_option": "enableGraphCapture",
        "model_dtypes": {F32, F16},
    },
    "mlx": {
        "supports_fused_moe": False,
        "supports_gqa_head_sink": False,
        "gqa_dtypes": {F32, F16, BF16},
        "runtime": RuntimeInfo(
            ort_provider="MLXExecutionProvider",
            genai_provider="MLXExecutionProvider",
            package="onnxruntime-genai",
            card_note="Register the MLX plugin execution provider before loading the model: "
            '`og.register_execution_provider_library("MLXExecutionProvider", '
            '"/path/to/the/MLX/plugin/library")`.',
        ),
        "default_dtype": F16,
    },
    "trt-rtx": {
        "supports_fused_moe": False,
        "supports_gqa_head_sink": False,
        "gqa_dtypes": {F16, BF16},
        "supports_skip_layer_norm": False,
        "enable_graph_capture": True,
        "provider_options": {"enable_cuda_graph": "1"},
        "runtime": RuntimeInfo(
            ort_provider="NvTensorRTRTXExecutionProvider",
            genai_provider="NvTensorRtRtx",
            card_note="That is NVIDIA's TensorRT-RTX execution provider. The CPU-only wheel "
            "cannot load this bundle.",
        ),
        "default_dtype": F16,
        "graph_capture_option": "enable_cuda_graph",
        "supports_matmul_nbits": False,
    },
    "onnx-standard": {
        "supports_fused_moe": False,
        "supports_fused_rope": False,
        "supports_skip_layer_norm": False,
        "supports_fused_matmul": False,
        "supports_custom_ops": False,
        "supports_matmul_nbits": False,
    },
}

DEFAULTS = {
    "gqa_dtypes": set(),
    "qkv_pack_dtypes": set(),
    "supports_fused_rope": True,
    "supports_skip_layer_norm": True,
    "supports_fused_matmul": True,
    "supports_fused_moe": True,
    "supports_packed_multi_head_attention": False,
    "default_int4_accuracy_level": 0,
    "provider_options": {},
    "enable_graph_capture": False,
    "runtime": RuntimeInfo(package="onnxruntime-genai"),
    "default_dtype": F32,
    "supports_shape_op": True,
    "supports_custom_ops": True,
    "graph_capture_option": None,
    "graph_capture_unless_disabled": False,
    "supports_rms_normalization": True,
    "supports_matmul_nbits": True,
    "model_dtypes": {F32, F16, BF16},
    "supports_qmoe": False,
    "supports_gqa_head_sink": True,
}


def test_builtin_names_are_exactly_the_spec_eps():
    assert sorted(caps.name for caps in BUILTIN_EPS) == sorted(EXPECTED)


def test_field_set_is_spec_plus_packager_fields():
    assert [f.name for f in dataclasses.fields(EpCapabilities)] == [
        "name",
        "gqa_dtypes",
        "qkv_pack_dtypes",
        "supports_fused_rope",
        "supports_skip_layer_norm",
        "supports_fused_matmul",
        "supports_fused_moe",
        "supports_packed_multi_head_attention",
        "default_int4_accuracy_level",
        "provider_options",
        "enable_graph_capture",
        "runtime",
        "default_dtype",
        "supports_custom_ops",
        "graph_capture_option",
        "graph_capture_unless_disabled",
        "model_dtypes",
        "kernels",
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("field", sorted(DEFAULTS))
def test_builtin_field_matches_spec(name: str, field: str):
    expected = EXPECTED[name].get(field, DEFAULTS[field])
    actual = getattr(get_ep(name), field)
    assert actual == expected, f"{name}.{field}"


def test_spec_defaults_for_a_minimal_entry():
    caps = EpCapabilities(name="my-ep", gqa_dtypes=frozenset({F16}))
    for field, expected in DEFAULTS.items():
        if field != "gqa_dtypes":
            assert getattr(caps, field) == expected, field
    assert caps.gqa_dtypes == frozenset({F16})


def test_sets_and_options_are_stored_frozen():
    options = {"enable_cuda_graph": "0"}
    caps = EpCapabilities(
        name="x",
        gqa_dtypes={F16},
        qkv_pack_dtypes=[F16, F16],
        provider_options=options,
        graph_capture_option="enable_cuda_graph",
    )
    assert type(caps.gqa_dtypes) is frozenset
    assert type(caps.qkv_pack_dtypes) is frozenset
    options["enable_cuda_graph"] = "1"  # the caller's dict no longer matters
    assert caps.provider_options == {"enable_cuda_graph": "0"}
    with pytest.raises(TypeError):
        caps.provider_options["enable_cuda_graph"] = "1"  # type: ignore[index]


def test_capabilities_are_hashable_and_compare_by_value():
    a = EpCapabilities(name="x", gqa_dtypes={F16}, provider_options={"k": "v"})
    b = EpCapabilities(name="x", gqa_dtypes=frozenset({F16}), provider_options={"k": "v"})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, get_ep("cuda")}) == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "other"),
        ("gqa_dtypes", frozenset()),
        ("supports_fused_rope", False),
        ("provider_options", {}),
        ("default_dtype", F32),
    ],
)
def test_assignment_raises(field: str, value: object):
    caps = get_ep("cuda")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(caps, field, value)


@pytest.mark.parametrize("name", ["", "CUDA", "Cuda", " cuda", "my ep", "-cuda", 3])
def test_invalid_name_is_rejected(name: object):
    with pytest.raises(ValueError, match=r"EpCapabilities\.name must be a non-empty lowercase"):
        EpCapabilities(name=name, gqa_dtypes=frozenset())  # type: ignore[arg-type]


@pytest.mark.parametrize("level", [-1, 5, 100])
def test_accuracy_level_out_of_range_is_rejected(level: int):
    with pytest.raises(ValueError, match=rf"must be in 0\.\.4, got {level}"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), default_int4_accuracy_level=level)


@pytest.mark.parametrize("level", [True, 2.0, "4"])
def test_accuracy_level_must_be_an_int(level: object):
    with pytest.raises(ValueError, match=r"must be an int in 0\.\.4"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), default_int4_accuracy_level=level)  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [{"enable_cuda_graph": 1}, {"k": True}, {1: "v"}])
def test_non_string_provider_option_is_rejected(options: dict):
    with pytest.raises(ValueError, match=r"provider_options of 'x' must map str to str"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), provider_options=options)


def test_non_dtype_in_gqa_dtypes_is_rejected():
    with pytest.raises(ValueError, match=r"gqa_dtypes must hold ir\.DataType values, got 'FLOAT'"):
        EpCapabilities(name="x", gqa_dtypes=frozenset({"FLOAT"}))  # type: ignore[arg-type]


def test_non_dtype_default_dtype_is_rejected():
    with pytest.raises(ValueError, match=r"default_dtype of 'x' must be an ir\.DataType"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), default_dtype="float16")  # type: ignore[arg-type]


def test_default_dtype_outside_model_dtypes_is_rejected():
    with pytest.raises(ValueError, match="default_dtype of 'my-ep'"):
        EpCapabilities(name="my-ep", gqa_dtypes=frozenset(), model_dtypes=frozenset({F16}))


def test_graph_capture_without_option_key_is_rejected():
    with pytest.raises(
        ValueError, match=r"enables graph capture but names no graph_capture_option"
    ):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), enable_graph_capture=True)


def test_graph_capture_flag_and_option_must_agree():
    with pytest.raises(ValueError, match=r"provider_options\['enable_cuda_graph'\] is '1'"):
        EpCapabilities(
            name="x",
            gqa_dtypes=frozenset(),
            provider_options={"enable_cuda_graph": "1"},
            graph_capture_option="enable_cuda_graph",
        )


def test_packager_fields_are_keyword_only():
    with pytest.raises(TypeError):
        EpCapabilities(
            "x",
            frozenset(),
            frozenset(),
            True,
            True,
            True,
            True,
            False,
            0,
            {},
            False,
            RuntimeInfo(),
        )  # type: ignore[misc]


def test_with_graph_capture_switches_flag_and_option_together():
    cuda = get_ep("cuda")
    on = cuda.with_graph_capture(True)
    assert on.enable_graph_capture is True
    assert on.provider_options == {"enable_cuda_graph": "1"}
    assert cuda.provider_options == {"enable_cuda_graph": "0"}  # original untouched
    off = get_ep("trt-rtx").with_graph_capture(False)
    assert (off.enable_graph_capture, off.provider_options) == (False, {"enable_cuda_graph": "0"})
    assert get_ep("cpu").with_graph_capture(False) is get_ep("cpu")
    with pytest.raises(ValueError, match=r"Execution provider 'cpu' has no graph capture"):
        get_ep("cpu").with_graph_capture(True)


def test_every_gpu_builtin_names_its_genai_provider():
    for caps in BUILTIN_EPS:
        on_cpu = caps.default_dtype == F32
        assert (caps.runtime.genai_provider is None) == on_cpu, caps.name


def test_runtime_of_a_bundle_without_provider_runs_on_the_stock_wheel():
    assert RuntimeInfo().package == "onnxruntime-genai"
    assert RuntimeInfo(genai_provider="MyAccel").package is None
    assert RuntimeInfo(package="my-genai").package == "my-genai"


@pytest.mark.parametrize("field", ["ort_provider", "genai_provider", "package"])
@pytest.mark.parametrize("value", ["", " cuda", "my accel", 3])
def test_runtime_names_must_be_non_empty_words(field: str, value: object):
    with pytest.raises(ValueError, match=rf"RuntimeInfo\.{field} must be"):
        RuntimeInfo(**{field: value})


def test_runtime_card_note_must_be_a_string():
    with pytest.raises(ValueError, match=r"RuntimeInfo\.card_note must be a string, got 3"):
        RuntimeInfo(card_note=3)  # type: ignore[arg-type]


def test_runtime_field_must_be_runtime_info():
    with pytest.raises(ValueError, match=r"EpCapabilities\.runtime of 'x' must be a RuntimeInfo"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), runtime={"genai_provider": "x"})  # type: ignore[arg-type]


def test_graph_capture_needs_the_shared_buffer_and_the_ep_enabling_it():
    cuda = get_ep("cuda")
    on = cuda.with_graph_capture(True)
    assert on.captures_graph(share_buffer=True)
    assert not on.captures_graph(share_buffer=False)
    assert not cuda.captures_graph(share_buffer=True)
