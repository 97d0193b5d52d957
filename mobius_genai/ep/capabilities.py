"""What one execution provider can run, as data.

Every optimization and packaging decision reads these fields, never an EP's name, so adding an EP
means adding one `EpCapabilities` entry (see `builtins.py`) and nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

import onnx_ir as ir

from mobius_genai.ep.kernels import KERNELS

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

_V = TypeVar("_V")

#: The model dtypes mobius-genai builds.
ALL_MODEL_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


class FrozenOptions(Mapping[str, _V], Generic[_V]):
    """An immutable, hashable mapping with str keys (provider options, kernels).

    A frozen dataclass hashes its fields, so these cannot be a dict (mutable, unhashable) or a
    MappingProxyType (unhashable). Compares equal to a dict with the same items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, _V] | Iterable[tuple[str, _V]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[str, _V] = dict(pairs)

    def __getitem__(self, key: str) -> _V:
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
    fields after them are what the packager and the lowering passes need beyond the spec. The
    kernels the spec has no field for are data (`kernels`, rows of ep/kernels.py); the
    ``supports_*`` properties below read the ones that had a field before.
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
    supports_custom_ops: bool = True
    """False → every com.microsoft op is inlined into standard ONNX (no custom domains remain)."""
    graph_capture_option: str | None = None
    """Provider-option key that toggles graph capture; None → this EP has no graph capture."""
    graph_capture_unless_disabled: bool = False
    """True → onnxruntime-genai captures the graph when the option is absent (it must say "0")."""
    model_dtypes: frozenset[ir.DataType] = ALL_MODEL_DTYPES
    """Model dtypes this EP's runtime executes; building for another one is refused."""
    kernels: Mapping[str, frozenset[ir.DataType]] = FrozenOptions()
    """Kernel (a row of ep/kernels.py's KERNELS that no spec field states) → the model dtypes
    the EP runs it in (empty or False: not at all; True: all its model dtypes). A kernel not
    named has its row's default. Read them with `kernel_dtypes`, never field by field."""

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
        self._check_kernels()

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

    def _check_kernels(self) -> None:
        """Kernels are rows of KERNELS that no spec field states, each with a dtype set."""
        if not isinstance(self.kernels, Mapping):
            raise ValueError(
                f"EpCapabilities.kernels of {self.name!r} must map kernel names to dtype sets, "
                f"got {self.kernels!r}"
            )
        kernels = {}
        for name, dtypes in self.kernels.items():
            kernel = KERNELS.get(name)
            if kernel is None or kernel.field is not None:
                stated = sorted(k.name for k in KERNELS.values() if k.field is None)
                hint = "" if kernel is None else f" (say it with the spec's field {kernel.field})"
                raise ValueError(
                    f"EpCapabilities.kernels of {self.name!r} names {name!r}{hint}; accepted: "
                    + ", ".join(stated)
                )
            if isinstance(dtypes, bool):
                dtypes = self.model_dtypes if dtypes else ()
            kernels[name] = _dtype_set(f"kernels[{name!r}]", dtypes)
        object.__setattr__(self, "kernels", FrozenOptions(kernels))

    def kernel_dtypes(self, name: str) -> frozenset[ir.DataType]:
        """The model dtypes this entry says the EP runs kernel `name` in (ep/kernels.py), as
        stated: a kernel stated as a bool runs in all `model_dtypes` or none."""
        kernel = KERNELS[name]
        if kernel.dtyped_field:
            return getattr(self, kernel.field)
        if kernel.field is not None:
            has = getattr(self, kernel.field)
        elif name in self.kernels:
            return self.kernels[name]
        else:
            has = kernel.default
        return self.model_dtypes if has else frozenset()

    def with_kernels(self, changes: Mapping[str, bool | Iterable[ir.DataType]]) -> EpCapabilities:
        """A copy where each kernel named runs in the dtypes given (True: every model dtype,
        False: none); a kernel the spec states with a bool takes only True or False."""
        fields: dict[str, object] = {}
        kernels = dict(self.kernels)
        for name, value in changes.items():
            dtypes = value if not isinstance(value, bool) else self.model_dtypes if value else ()
            kernel = KERNELS.get(name)
            if kernel is not None and kernel.field is not None:
                if not (kernel.dtyped_field or isinstance(value, bool)):
                    raise ValueError(f"Kernel {name!r} is stated by {kernel.field}: True or False")
                fields[kernel.field] = dtypes if kernel.dtyped_field else value
            else:
                kernels[name] = dtypes
        return dataclasses.replace(self, kernels=kernels, **fields)

    @property
    def supports_gqa_head_sink(self) -> bool:
        """False → attention with sinks (gpt_oss) stays standard Attention with the sink
        rescaling (components/sinks.py) instead of GroupQueryAttention's ``head_sink`` input."""
        return bool(self.kernel_dtypes("GroupQueryAttention.head_sink"))

    @property
    def supports_qmoe(self) -> bool:
        """True → INT4 quantizes MoE experts to com.microsoft::QMoE (block-wise 4-bit); False →
        the experts stay float in an INT4 bundle."""
        return bool(self.kernel_dtypes("QMoE"))

    @property
    def supports_causal_conv_with_state(self) -> bool:
        """False → com.microsoft::CausalConvWithState (LFM2's conv layers) gets its body."""
        return bool(self.kernel_dtypes("CausalConvWithState"))

    @property
    def supports_linear_attention(self) -> bool:
        """False → com.microsoft::LinearAttention (Qwen3.5's gated delta rule) gets its body."""
        return bool(self.kernel_dtypes("LinearAttention"))

    @property
    def supports_matmul_nbits(self) -> bool:
        """False → INT4 is standard blocked DequantizeLinear + MatMul (onnxruntime fuses the
        pair back into MatMulNBits when it loads the graph)."""
        return bool(self.kernel_dtypes("MatMulNBits"))

    @property
    def supports_rms_normalization(self) -> bool:
        """False → ONNX RMSNormalization (opset 23) becomes SimplifiedLayerNormalization."""
        return bool(self.kernel_dtypes("RMSNormalization"))

    @property
    def supports_shape_op(self) -> bool:
        """False → the pipeline eliminates Shape ops (static shapes or computed sizes instead)."""
        return bool(self.kernel_dtypes("Shape"))

    @property
    def int4_gather_dtypes(self) -> frozenset[ir.DataType]:
        """Model dtypes for which INT4 stores the token embedding as
        com.microsoft::GatherBlockQuantized (shared with a tied lm_head)."""
        return self.kernel_dtypes("GatherBlockQuantized")

    def captures_graph(self, *, share_buffer: bool) -> bool:
        """Whether a bundle captures the graph: the EP enables capture, and the graph shares
        the past/present buffer (GroupQueryAttention's), which capture needs."""
        return self.enable_graph_capture and share_buffer

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
