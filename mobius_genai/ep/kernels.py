"""The kernels an execution provider may lack, as a table, and the questions gates ask of it.

A kernel is an op, or one feature of an op, that the pipeline emits only for an EP that runs it;
elsewhere it lowers, inlines or keeps float. An EP's entry says which of these kernels it runs,
and in which model dtypes: the spec's fields for the kernels the spec names (`Kernel.field`),
`EpCapabilities.kernels` for the others, the row's default where it says nothing. A new kernel
is one row here plus the ``kernels`` entries of the EPs that differ from its default: no new
field, no gate edit, and ``mobius-genai eps --kernels`` prints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import onnx_ir as ir

if TYPE_CHECKING:
    from mobius_genai.ep.capabilities import EpCapabilities

__all__ = ["KERNELS", "MS_DOMAIN", "Kernel", "ep_runs", "is_standard_domain", "missing"]

MS_DOMAIN = "com.microsoft"
_STANDARD_DOMAINS = ("", "ai.onnx")


def is_standard_domain(domain: str) -> bool:
    """True for the ONNX standard domain ("" or "ai.onnx")."""
    return domain in _STANDARD_DOMAINS


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One row: a kernel, how an EP entry states it, and what the pipeline does without it."""

    name: str
    """Key in `EpCapabilities.kernels`: the op type, or "Op.feature" for one input or attribute
    (or one overload of the op's function: components/tier1.py's `needs_inlining`)."""
    domain: str
    without: str
    """What an EP without the kernel gets instead (for ``mobius-genai eps --kernels``)."""
    default: bool = True
    """Whether an EP whose entry does not name the kernel has it (in all its model dtypes)."""
    field: str | None = None
    """The spec's EpCapabilities field that states it (a bool, or gqa_dtypes' dtype set); such
    a kernel is never a ``kernels`` key."""
    flag: str | None = None
    """The bool attribute of EpCapabilities that reads it (the spec's field, or the property
    kept for a kernel that had a field before); trace reasons name it."""

    @property
    def dtyped_field(self) -> bool:
        """Whether `field` holds model dtypes rather than a bool."""
        return self.field is not None and self.flag != self.field


KERNELS: Mapping[str, Kernel] = MappingProxyType(
    {
        kernel.name: kernel
        for kernel in (
            Kernel("GroupQueryAttention", MS_DOMAIN, "standard Attention", field="gqa_dtypes"),
            Kernel(
                "GroupQueryAttention.do_rotary",
                MS_DOMAIN,
                "explicit RotaryEmbedding before GQA, q/k/v unpacked",
                field="supports_fused_rope",
                flag="supports_fused_rope",
            ),
            Kernel(
                "GroupQueryAttention.head_sink",
                MS_DOMAIN,
                "attention with sinks stays standard Attention",
                flag="supports_gqa_head_sink",
            ),
            # causal=0 with attention_bias (input 10): measured on the CPU kernel only
            # (tests/optimize/test_gqa_image_blocks.py)
            Kernel(
                "GroupQueryAttention.attention_bias",
                MS_DOMAIN,
                "attention with image blocks (Gemma 3), chunks (Llama 4) or ALiBi (Bloom, MPT) "
                "stays standard Attention",
                default=False,
            ),
            Kernel(
                "SkipLayerNormalization",
                MS_DOMAIN,
                "Add + LayerNormalization",
                field="supports_skip_layer_norm",
                flag="supports_skip_layer_norm",
            ),
            Kernel(
                "SkipSimplifiedLayerNormalization",
                MS_DOMAIN,
                "Add + RMSNormalization",
                field="supports_skip_layer_norm",
                flag="supports_skip_layer_norm",
            ),
            Kernel(
                "FusedMatMul",
                MS_DOMAIN,
                "Transpose + MatMul",
                field="supports_fused_matmul",
                flag="supports_fused_matmul",
            ),
            Kernel("BiasGelu", MS_DOMAIN, "Add + Gelu"),
            Kernel("FastGelu", MS_DOMAIN, "Add + Gelu (tanh)"),
            Kernel(
                "MoE",
                MS_DOMAIN,
                "its standard body (the picked experts gathered)",
                field="supports_fused_moe",
                flag="supports_fused_moe",
            ),
            # Gemma 4's GeGLU experts (activation_type "geglu", the function overload "geglu"):
            # onnxruntime 1.32's CPU MoE kernel refuses it ("Unsupported MoE activation type")
            Kernel(
                "MoE.geglu",
                MS_DOMAIN,
                "its standard body (the picked experts gathered)",
                default=False,
            ),
            Kernel(
                "QMoE",
                MS_DOMAIN,
                "MoE experts stay float in an int4 bundle (GeGLU experts: QMoE's 4-bit body)",
                default=False,
                flag="supports_qmoe",
            ),
            # QMoE's GeGLU bodies (Gemma 4's experts in int4, components/moe_bodies.py): no
            # onnxruntime 1.32 kernel takes GeGLU (as "MoE.geglu"), so every EP expands them
            *(
                Kernel(f"QMoE.{overload}", MS_DOMAIN, f"its body ({how})", default=False)
                for overload, how in (
                    ("geglu", "GatherBlockQuantized of the picked experts"),
                    ("geglu_unpacked", "the picked experts unpacked in standard ops"),
                    ("geglu_unpacked_zp", "the same, with zero points"),
                )
            ),
            Kernel(
                "PackedMultiHeadAttention",
                MS_DOMAIN,
                "its standard body (Attention with a block-diagonal bias)",
                default=False,
                field="supports_packed_multi_head_attention",
                flag="supports_packed_multi_head_attention",
            ),
            Kernel(
                "CausalConvWithState",
                MS_DOMAIN,
                "its standard body",
                flag="supports_causal_conv_with_state",
            ),
            Kernel(
                "LinearAttention",
                MS_DOMAIN,
                "its standard body (a Scan over the tokens)",
                flag="supports_linear_attention",
            ),
            # Mamba2's scan (update_rule "gated", the function overload "gated"; Mamba1's with a
            # decay per key dim): measured against its body on the CPU EP only
            # (tests/components/test_recurrent_functions.py)
            Kernel(
                "LinearAttention.gated",
                MS_DOMAIN,
                "its standard body (a Scan over the tokens)",
                default=False,
            ),
            Kernel(
                "MatMulNBits",
                MS_DOMAIN,
                "int4 as DequantizeLinear + MatMul",
                flag="supports_matmul_nbits",
            ),
            # Gemma 4's int4 GeGLU experts as one MatMulNBits per expert on its constant codes
            # (prepacked at load), on the rows that picked it: measured on the CPU EP
            # (benchmarks/README.md's MoE body section). Not on a GPU EP: the rows are split
            # by counts the host must read (a sync a layer), then 768 launches a layer (128
            # experts), most on no rows; not measured there.
            Kernel(
                "MatMulNBits.experts",
                MS_DOMAIN,
                "GeGLU experts in QMoE's body (the picked experts dequantized k at a time)",
                default=False,
            ),
            Kernel(
                "GatherBlockQuantized",
                MS_DOMAIN,
                "the token embedding stays float in an int4 bundle",
                default=False,
            ),
            Kernel(
                "RMSNormalization",
                "",
                "SimplifiedLayerNormalization",
                flag="supports_rms_normalization",
            ),
            Kernel("Shape", "", "sizes computed, Shape ops eliminated", flag="supports_shape_op"),
        )
    }
)


def missing(caps: EpCapabilities, name: str, dtype: ir.DataType | None = None) -> str | None:
    """Why `caps` does not run kernel `name` (for a `dtype` model), as the trace says it; None
    when it does. A kernel stated as a bool runs in any dtype; one stated with dtypes, in those."""
    kernel = KERNELS[name]
    dtypes = caps.kernel_dtypes(name)
    stated = kernel.field if kernel.dtyped_field else f"kernels[{name!r}]"
    checked = dtype is not None and (kernel.dtyped_field or name in caps.kernels)
    wrong_dtype = f"{dtype.name} not in {stated}" if checked and dtype not in dtypes else None
    if wrong_dtype and kernel.dtyped_field:  # a spec dtype field (gqa_dtypes) answers first
        return wrong_dtype
    if not is_standard_domain(kernel.domain) and not caps.supports_custom_ops:
        return "supports_custom_ops=False"
    if not dtypes:
        return f"{kernel.flag}=False" if kernel.flag else f"no {name} kernel"
    return wrong_dtype


def ep_runs(caps: EpCapabilities, op_type: str, domain: str = MS_DOMAIN) -> bool:
    """Whether `caps` says the EP has a kernel for `domain::op_type` (in some dtype).

    Standard ops always run (their lowerings are rule groups); a custom-domain op needs
    ``supports_custom_ops``, and a kernel of the table the EP's statement of it.
    """
    if is_standard_domain(domain):
        return True
    if not caps.supports_custom_ops:
        return False
    return domain != MS_DOMAIN or op_type not in KERNELS or bool(caps.kernel_dtypes(op_type))
