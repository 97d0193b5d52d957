"""What one execution provider can run, as data.

Every optimization and packaging decision reads these fields, never an EP's name, so adding an EP
means adding one `EpCapabilities` entry (see `builtins.py`) and nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping

import onnx_ir as ir

__all__ = [
    "ALL_MODEL_DTYPES",
    "MAX_INT4_ACCURACY_LEVEL",
    "EpCapabilities",
    "FrozenOptions",
    "RuntimeInfo",
]

#: MatMulNBits ``accuracy_level`` range: 0 = unset (highest accuracy) … 4 = int8 compute (fastest).
MAX_INT4_ACCURACY_LEVEL = 4

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: The onnxruntime-genai wheel that runs bundles naming no provider (onnxruntime-genai's CPU).
_STOCK_PACKAGE = "onnxruntime-genai"

#: The model dtypes mobius-genai builds.
ALL_MODEL_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


class FrozenOptions(Mapping[str, str]):
    """An immutable, hashable str→str mapping.

    A frozen dataclass hashes its fields, so provider options cannot be a dict (mutable,
    unhashable) or a MappingProxyType (unhashable). Compares equal to a dict with the same items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[str, str] = dict(pairs)

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


def _dtype_set(field: str, values: Iterable[ir.DataType]) -> frozenset[ir.DataType]:
    result = frozenset(values)
    for value in result:
        if not isinstance(value, ir.DataType):
            raise ValueError(f"EpCapabilities.{field} must hold ir.DataType values, got {value!r}")
    return result


@dataclasses.dataclass(frozen=True)
class RuntimeInfo:
    """How onnxruntime and onnxruntime-genai name an EP, and what a user installs to run it.

    Everything outside ``mobius_genai/ep/`` reads provider names from here, so an EP's names and
    wheel are written once, in its entry.
    """

    ort_provider: str | None = None
    """onnxruntime's name (``get_all_providers()``), e.g. "CUDAExecutionProvider". It is accepted
    wherever an EP name is, and an Olive accelerator naming it builds for this EP. None → not an
    onnxruntime EP of its own (portable ONNX)."""
    genai_provider: str | None = None
    """Key of this EP in genai_config ``provider_options`` (``[{key: {...}}]``); None → CPU (``[]``)."""
    package: str | None = None
    """pip package of the onnxruntime-genai build that runs this EP's bundles; None → no published
    wheel (a build with the provider). Defaults to the stock wheel when there is no genai_provider."""
    card_note: str = ""
    """What the bundle card adds after "Needs <package or build>." (markdown), e.g. a driver."""

    def __post_init__(self) -> None:
        for field in ("ort_provider", "genai_provider", "package"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and _WORD_RE.fullmatch(value)):
                raise ValueError(
                    f"RuntimeInfo.{field} must be None or a name of letters, digits, '.', '_' "
                    f"or '-' starting with a letter or digit, got {value!r}"
                )
        if not isinstance(self.card_note, str):
            raise ValueError(f"RuntimeInfo.card_note must be a string, got {self.card_note!r}")
        if self.package is None and self.genai_provider is None:
            object.__setattr__(self, "package", _STOCK_PACKAGE)


@dataclasses.dataclass(frozen=True)
class EpCapabilities:
    """Everything the build pipeline and the packager need to know about one execution provider.

    The first eleven fields are the spec's (same names, order and defaults; provider_options,
    which the spec leaves without one, defaults to empty); the keyword-only
    fields after them are what the packager and the lowering passes need beyond the spec.
    Set-like and mapping fields accept any iterable / mapping and are stored frozen.
    """

    name: str
    """Canonical, lowercase EP name for ``--ep`` / ``execution_provider=`` (looked up in any case)."""
    gqa_dtypes: frozenset[ir.DataType]
    """Dtypes for which Attention is fused into com.microsoft::GroupQueryAttention."""
    qkv_pack_dtypes: frozenset[ir.DataType] = frozenset()
    """Dtypes for which the Q/K/V projections are packed into one MatMul."""
    supports_fused_rope: bool = True
    """False → GQA gets ``do_rotary=0`` with an explicit RotaryEmbedding, and QKV is unpacked."""
    supports_skip_layer_norm: bool = True
    """False → Skip(Simplified)LayerNormalization is expanded back to primitives."""
    supports_fused_matmul: bool = True
    """False → FusedMatMul is expanded to Transpose + MatMul."""
    supports_fused_moe: bool = True
    """False → fused MoE ops are decomposed."""
    supports_packed_multi_head_attention: bool = False
    """True → PackedMultiHeadAttention may be emitted."""
    default_int4_accuracy_level: int = 0
    """MatMulNBits ``accuracy_level`` used when quantizing for this EP (0 = most accurate)."""
    provider_options: Mapping[str, str] = FrozenOptions()
    """Default onnxruntime-genai provider options (values are strings, as genai requires)."""
    enable_graph_capture: bool = False
    """Whether GPU graph capture is on by default; must agree with ``graph_capture_option``."""

    _: dataclasses.KW_ONLY

    runtime: RuntimeInfo = RuntimeInfo()
    """Provider names in onnxruntime / onnxruntime-genai / Olive, and the wheel that runs it."""
    default_dtype: ir.DataType = ir.DataType.FLOAT
    """Model dtype used when the user does not choose one."""
    supports_shape_op: bool = True
    """False → the pipeline eliminates Shape ops (static shapes or computed sizes instead)."""
    supports_custom_ops: bool = True
    """False → every com.microsoft op is inlined into standard ONNX (no custom domains remain)."""
    graph_capture_option: str | None = None
    """Provider-option key that toggles graph capture; None → this EP has no graph capture."""
    graph_capture_unless_disabled: bool = False
    """True → onnxruntime-genai captures the graph when the option is absent (it must say "0")."""
    int4_gather_dtypes: frozenset[ir.DataType] = frozenset()
    """Model dtypes for which INT4 stores the token embedding as com.microsoft::GatherBlockQuantized
    (shared with a tied lm_head); for other dtypes the embedding stays float."""
    supports_rms_normalization: bool = True
    """False → ONNX RMSNormalization (opset 23) becomes onnxruntime's SimplifiedLayerNormalization
    (the EP has a kernel for that one only)."""
    supports_matmul_nbits: bool = True
    """False → INT4 is standard blocked DequantizeLinear + MatMul (no custom op; onnxruntime
    fuses the pair back into MatMulNBits when it loads the graph)."""
    model_dtypes: frozenset[ir.DataType] = ALL_MODEL_DTYPES
    """Model dtypes this EP's runtime executes; building for another one is refused."""
    supports_causal_conv_with_state: bool = True
    """False → com.microsoft::CausalConvWithState (recurrent conv layers: LFM2) is expanded to
    its standard body. onnxruntime 1.32's CPU EP has the kernel; onnxruntime-genai's builder
    emits the op for every EP."""
    supports_qmoe: bool = False
    """True → INT4 quantizes MoE experts to com.microsoft::QMoE (block-wise 4-bit, each expert in
    MatMulNBits' layout; measured on onnxruntime 1.32's CPU EP: tests/quantize/test_qmoe.py).
    False → the experts stay float in an INT4 bundle."""
    supports_gqa_head_sink: bool = True
    """False → attention with sinks (gpt_oss) stays standard Attention with the sink rescaling
    (components/sinks.py) instead of GroupQueryAttention with its ``head_sink`` input."""
    supports_linear_attention: bool = True
    """False → com.microsoft::LinearAttention (gated delta rule layers: Qwen3.5) is expanded to its
    standard body (a Scan over the tokens). onnxruntime 1.32's CPU EP has the kernel;
    onnxruntime-genai's builder emits the op for every EP."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ValueError(
                f"EpCapabilities.name must be a non-empty lowercase name of letters, digits, "
                f"'.', '_' or '-' starting with a letter or digit, got {self.name!r}"
            )
        object.__setattr__(self, "gqa_dtypes", _dtype_set("gqa_dtypes", self.gqa_dtypes))
        object.__setattr__(
            self, "qkv_pack_dtypes", _dtype_set("qkv_pack_dtypes", self.qkv_pack_dtypes)
        )
        object.__setattr__(
            self, "int4_gather_dtypes", _dtype_set("int4_gather_dtypes", self.int4_gather_dtypes)
        )
        object.__setattr__(self, "model_dtypes", _dtype_set("model_dtypes", self.model_dtypes))
        level = self.default_int4_accuracy_level
        if isinstance(level, bool) or not isinstance(level, int):
            raise ValueError(
                f"EpCapabilities.default_int4_accuracy_level of {self.name!r} must be an int "
                f"in 0..{MAX_INT4_ACCURACY_LEVEL}, got {level!r}"
            )
        if not 0 <= level <= MAX_INT4_ACCURACY_LEVEL:
            raise ValueError(
                f"EpCapabilities.default_int4_accuracy_level of {self.name!r} must be in "
                f"0..{MAX_INT4_ACCURACY_LEVEL}, got {level}"
            )
        options = FrozenOptions(self.provider_options)
        for key, value in options.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(
                    f"EpCapabilities.provider_options of {self.name!r} must map str to str "
                    f"(onnxruntime-genai rejects other values), got {key!r}: {value!r}"
                )
        object.__setattr__(self, "provider_options", options)
        if not isinstance(self.runtime, RuntimeInfo):
            raise ValueError(
                f"EpCapabilities.runtime of {self.name!r} must be a RuntimeInfo, "
                f"got {self.runtime!r}"
            )
        if not isinstance(self.default_dtype, ir.DataType):
            raise ValueError(
                f"EpCapabilities.default_dtype of {self.name!r} must be an ir.DataType, "
                f"got {self.default_dtype!r}"
            )
        if self.default_dtype not in self.model_dtypes:
            raise ValueError(
                f"EpCapabilities.default_dtype of {self.name!r} ({self.default_dtype}) must be "
                f"one of its model_dtypes ({sorted(str(d) for d in self.model_dtypes)})"
            )
        self._check_graph_capture()

    def _check_graph_capture(self) -> None:
        """The flag and the provider option must not say different things to the packager."""
        key = self.graph_capture_option
        if key is None:
            if self.enable_graph_capture:
                raise ValueError(
                    f"EpCapabilities {self.name!r} enables graph capture but names no "
                    f"graph_capture_option to turn it on"
                )
            return
        if key in self.provider_options:
            expected = "1" if self.enable_graph_capture else "0"
            if self.provider_options[key] != expected:
                raise ValueError(
                    f"EpCapabilities {self.name!r}: provider_options[{key!r}] is "
                    f"{self.provider_options[key]!r} but enable_graph_capture is "
                    f"{self.enable_graph_capture} (expected {expected!r})"
                )

    @property
    def runs_matmul_nbits(self) -> bool:
        """Whether int4 weights reach this EP as com.microsoft::MatMulNBits (custom ops kept and
        the kernel present); else as standard DequantizeLinear + MatMul, and a source's stored
        integers are dequantized."""
        return self.supports_custom_ops and self.supports_matmul_nbits

    def with_graph_capture(self, enabled: bool) -> EpCapabilities:
        """A copy with graph capture switched on or off, flag and provider option together."""
        if self.graph_capture_option is None:
            if not enabled:
                return self
            raise ValueError(f"Execution provider {self.name!r} has no graph capture")
        options = dict(self.provider_options)
        options[self.graph_capture_option] = "1" if enabled else "0"
        return dataclasses.replace(self, enable_graph_capture=enabled, provider_options=options)
