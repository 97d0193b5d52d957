"""The built-in execution providers: one `EpCapabilities` entry each, as a table (data only;
the registry registers it).

Values follow the spec's registry table (spec: "Supported Execution Providers"); the
keyword-only fields carry what onnxruntime-genai 0.18 expects in genai_config.json, and
`runtime` how onnxruntime, onnxruntime-genai and Olive name each EP and which wheel runs it.
To add an EP, add one entry here; nothing else names EPs or their providers.

`supports_fused_moe` is claimed only where onnxruntime's com.microsoft::MoE kernel was measured
to compute the routing the MoE block emits (softmax, top-k, renormalization, interleaved SwiGLU;
tests/components/test_moe_function.py on the CPU EP); elsewhere the op's standard body is inlined.
The "QMoE" kernel likewise: INT4 experts as com.microsoft::QMoE only where its kernel was measured
(the CPU EP: tests/quantize/test_qmoe.py).
"LinearAttention.gated" (Mamba2's scan) likewise: onnxruntime's CPU kernel was measured against
its body (tests/components/test_recurrent_functions.py); other EPs get the body inlined.
Likewise "GroupQueryAttention.head_sink" (attention sinks inside GroupQueryAttention) stays on only
where it was measured (the CPU EP, tests/optimize/test_gqa_sinks.py) or is the runtime that
onnxruntime-genai's own gpt-oss models target (CUDA). `kernels` names only the kernels where an
EP differs from the row's default (ep/kernels.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import onnx_ir as ir

from mobius_genai.ep.capabilities import EpCapabilities, RuntimeInfo

__all__ = ["BUILTIN_ALIASES", "BUILTIN_EPS", "HOST_EP"]

_F32 = ir.DataType.FLOAT
_F16 = ir.DataType.FLOAT16
_BF16 = ir.DataType.BFLOAT16

#: The EP of onnxruntime's CPU provider, the host every machine has: where a bundle runs without
#: its accelerator, and what smoke tests, calibration and an Olive accelerator naming no EP use.
HOST_EP = "cpu"

_NOT_ON_CPU_WHEEL = "The CPU-only wheel cannot load this bundle."
_NO_HEAD_SINK = {"GroupQueryAttention.head_sink": False}  # GQA's head_sink not measured (above)

BUILTIN_EPS: tuple[EpCapabilities, ...] = (
    # Portable ONNX: no EP-specific fusions; custom ops keep their function bodies. INT4 is
    # standard DequantizeLinear + MatMul (MatMulNBits has no function body).
    EpCapabilities(
        name="default",
        gqa_dtypes=frozenset(),
        kernels={"MatMulNBits": False, "LinearAttention.gated": True},
    ),
    # ORT CPU EP. Packed q/k/v: one projection per layer decodes ~2.5% faster on CPU, fp32
    # and int4 alike (benchmarks/qkv_packing.py). No bf16: onnxruntime's CPU EP lacks bf16
    # kernels for ops every decoder uses (MatMul, Where).
    EpCapabilities(
        name=HOST_EP,
        gqa_dtypes=frozenset({_F32}),
        qkv_pack_dtypes=frozenset({_F32}),
        default_int4_accuracy_level=4,
        model_dtypes=frozenset({_F32, _F16}),
        runtime=RuntimeInfo(ort_provider="CPUExecutionProvider"),
        kernels={
            "GatherBlockQuantized": {_F32, _F16},
            "MatMulNBits.experts": True,
            "QMoE": True,
            "LinearAttention.gated": True,
            "GroupQueryAttention.attention_bias": True,
        },
    ),
    # ORT CUDA EP. Graph capture is off by default (it needs past/present buffer sharing).
    EpCapabilities(
        name="cuda",
        supports_fused_moe=False,  # MoE kernel not measured (see above)
        # onnxruntime registers PackedMultiHeadAttention for CUDA only (float and float16:
        # contrib_ops/cuda/bert/packed_multihead_attention.cc); the CPU wheel's
        # get_all_opkernel_def() has no kernel for it, DirectML's registration lists only
        # Attention / MultiHeadAttention, WebGPU's contrib ops have none.
        supports_packed_multi_head_attention=True,
        gqa_dtypes=frozenset({_F16, _BF16}),
        qkv_pack_dtypes=frozenset({_F16, _BF16}),
        provider_options={"enable_cuda_graph": "0"},
        runtime=RuntimeInfo(
            ort_provider="CUDAExecutionProvider",
            genai_provider="cuda",
            package="onnxruntime-genai-cuda",
            card_note=f"It is the build for CUDA 12. {_NOT_ON_CPU_WHEEL}",
        ),
        default_dtype=_F16,
        graph_capture_option="enable_cuda_graph",
        # attention_bias with causal=0: onnxruntime 1.32's schema; not run on a GPU here
        kernels={
            "GatherBlockQuantized": {_F32, _F16, _BF16},
            "GroupQueryAttention.attention_bias": True,
        },
    ),
    # DirectML: no fused RoPE inside GQA. genai turns DML graph capture on unless told "0",
    # so the option is written out to match enable_graph_capture=False. DirectML has no bf16
    # and no kernels for opset-23 ops: RMSNormalization is lowered to SimplifiedLayerNorm
    # (SeparateRoPE emits onnxruntime's RotaryEmbedding).
    EpCapabilities(
        name="dml",
        supports_fused_moe=False,  # MoE kernel not measured (see above)
        gqa_dtypes=frozenset({_F16}),
        supports_fused_rope=False,
        provider_options={"enable_graph_capture": "0"},
        runtime=RuntimeInfo(
            ort_provider="DmlExecutionProvider",
            genai_provider="dml",
            package="onnxruntime-genai-directml",
            card_note=f"It is the DirectML build, for Windows. {_NOT_ON_CPU_WHEEL}",
        ),
        default_dtype=_F16,
        graph_capture_option="enable_graph_capture",
        graph_capture_unless_disabled=True,
        model_dtypes=frozenset({_F32, _F16}),
        kernels={**_NO_HEAD_SINK, "RMSNormalization": False},
    ),
    # ORT WebGPU EP: Shape ops are eliminated. WebGPU has no bf16.
    EpCapabilities(
        name="webgpu",
        supports_fused_moe=False,  # MoE kernel not measured (see above)
        gqa_dtypes=frozenset({_F32, _F16}),
        default_int4_accuracy_level=4,
        provider_options={"enableGraphCapture": "0"},
        runtime=RuntimeInfo(
            ort_provider="WebGpuExecutionProvider",
            genai_provider="webgpu",
            card_note=_NOT_ON_CPU_WHEEL,
        ),
        default_dtype=_F16,
        graph_capture_option="enableGraphCapture",
        model_dtypes=frozenset({_F32, _F16}),
        kernels={**_NO_HEAD_SINK, "Shape": False, "GatherBlockQuantized": {_F32, _F16}},
    ),
    # Apple-silicon MLX plugin EP: GQA with unpacked Q/K/V. genai 0.18 passes names it does not
    # know through to ORT's plugin-EP lookup (AppendExecutionProvider_V2 by EP name), and the MLX
    # plugin registers as "MLXExecutionProvider"; it has no graph-capture option.
    EpCapabilities(
        name="mlx",
        supports_fused_moe=False,  # MoE kernel not measured (see above)
        gqa_dtypes=frozenset({_F32, _F16, _BF16}),
        runtime=RuntimeInfo(
            ort_provider="MLXExecutionProvider",
            genai_provider="MLXExecutionProvider",
            package="onnxruntime-genai",
            card_note="Register the MLX plugin execution provider before loading the model: "
            '`og.register_execution_provider_library("MLXExecutionProvider", '
            '"/path/to/the/MLX/plugin/library")`.',
        ),
        default_dtype=_F16,
        kernels=_NO_HEAD_SINK,
    ),
    # NVIDIA TensorRT-RTX: TRT handles the primitives of SkipLayerNorm itself, and takes int4 as
    # DequantizeLinear + MatMul (onnxruntime-genai's builder emits that for it too, "use_qdq").
    EpCapabilities(
        name="trt-rtx",
        supports_fused_moe=False,  # MoE kernel not measured (see above)
        gqa_dtypes=frozenset({_F16, _BF16}),
        supports_skip_layer_norm=False,
        enable_graph_capture=True,
        provider_options={"enable_cuda_graph": "1"},
        runtime=RuntimeInfo(
            ort_provider="NvTensorRTRTXExecutionProvider",
            genai_provider="NvTensorRtRtx",
            card_note=f"That is NVIDIA's TensorRT-RTX execution provider. {_NOT_ON_CPU_WHEEL}",
        ),
        default_dtype=_F16,
        graph_capture_option="enable_cuda_graph",
        kernels={**_NO_HEAD_SINK, "MatMulNBits": False},
    ),
    # Strict ONNX for non-ORT runtimes: zero custom-domain ops in the output.
    EpCapabilities(
        name="onnx-standard",
        gqa_dtypes=frozenset(),
        qkv_pack_dtypes=frozenset(),
        supports_fused_rope=False,
        supports_skip_layer_norm=False,
        supports_fused_matmul=False,
        supports_fused_moe=False,
        supports_packed_multi_head_attention=False,
        supports_custom_ops=False,
        kernels={"MatMulNBits": False},
    ),
)

#: Other names the CLI and API accept, mapped to a canonical EP name.
BUILTIN_ALIASES: Mapping[str, str] = MappingProxyType({"portable": "default"})
