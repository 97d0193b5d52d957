"""The build target: EP, model dtype, weight precision, int4 choices and context length.

The user's words for these (CLI flags, Olive pass options, `build()` / `package()` arguments)
are parsed here, once, into a frozen `Target` that is passed down; nothing below parses an EP
name, a dtype or a precision again. One vocabulary: precisions are fp32, fp16, bf16 and int4;
a dtype is a float precision (f32 / float32, f16 / float16 and bfloat16 are accepted spellings).

The precision is resolved with what the source stores (`resolve_target`'s `stored`: the bit
widths of a GGUF's or a GPTQ/AWQ checkpoint's integers), so that the one precision that names
the bundle folder is the one the bundle holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

import onnx_ir as ir

from mobius_genai.config.limits import check_size
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.registry import resolve_ep
from mobius_genai.errors import ConfigError, ExecutionProviderError
from mobius_genai.quantize.plan import Int4Options, Int4Plan, int4_plan

#: Float precision → model dtype.
FLOAT_PRECISIONS: dict[str, ir.DataType] = {
    "fp32": ir.DataType.FLOAT,
    "fp16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16,
}
#: Precisions that quantize the weights and keep a float dtype for activations and scales.
QUANTIZED_PRECISIONS = ("int4",)
#: Every precision, in the order help texts list them.
PRECISIONS = (*FLOAT_PRECISIONS, *QUANTIZED_PRECISIONS)
#: The precision of a bundle that keeps a source's integers, by their narrowest width (a GGUF
#: of Q4_K matrices and a Q6_K table is int4; of Q8_0, Q6_K or Q5_K ones alone, int8: what
#: MatMulNBits holds them in). Never asked for: a source stores it.
STORED_PRECISIONS: dict[int, str] = {4: "int4", 8: "int8"}
#: Other accepted spellings of the float precisions.
_SPELLINGS = {
    "f32": "fp32",
    "float32": "fp32",
    "f16": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
}


@dataclasses.dataclass(frozen=True)
class Target:
    """What one build is for.

    `dtype` is the model's float dtype (for int4: of activations and scales); `precision`
    names the weights (a float precision, or int4 with `int4` holding the options of the int4
    asked for, as asked but for the accuracy level; None for a source's stored int4 kept as it
    is), or int8 for a source's 8-bit integers kept (`STORED_PRECISIONS`); `context_length` None means the checkpoint's max_position_embeddings. `stored` is the
    bit widths of the integers the source stores (empty: float weights), kept as they are
    (MatMulNBits) unless `dequantize_stored` (a float precision asked of such a source, or an
    EP without MatMulNBits) makes them float.
    `int4_plan` holds every int4 decision (the ops, the accuracy level, the options resolved):
    what the int4 passes and the packager follow, for int4 asked and for stored integers alike.
    """

    ep: EpCapabilities
    dtype: ir.DataType
    precision: str
    int4: Int4Options | None = None
    context_length: int | None = None
    stored: frozenset[int] = frozenset()
    dequantize_stored: bool = False
    _: dataclasses.KW_ONLY
    int4_plan: Int4Plan

    @property
    def int4_accuracy_level(self) -> int:
        """The MatMulNBits accuracy level of every int4 weight and of the integers a
        pre-quantized source keeps: the one asked for, else the EP's default."""
        return self.int4_plan.accuracy_level


def resolve_target(
    execution_provider: str | EpCapabilities = "default",
    *,
    dtype: str | ir.DataType | None = None,
    precision: str | None = None,
    int4: Int4Options | None = None,
    context_length: int | None = None,
    graph_capture: bool | None = None,
    stored: Collection[int] | Callable[[], Collection[int]] = (),
) -> Target:
    """The target for the user's choices and the source's stored integers.

    `stored` may be a function that reads them (`checkpoint.opening.stored_bits`): it is
    called only after the choices that need no source are checked, so a wrong `--ep` or
    `--dtype` is said before a hub download is tried.

    Without a precision: int4 when int4 options are given or the source stores 4-bit integers
    the EP keeps, int8 when the integers it keeps are all 8-bit (`STORED_PRECISIONS`), else the
    dtype's (the EP's default dtype when no dtype is given). A float
    precision asked of a source that stores integers dequantizes them. `graph_capture` None
    is the EP's default. Errors name the argument, the value and what is accepted."""
    ep = resolve_ep(execution_provider)
    if graph_capture is not None:
        ep = _with_graph_capture(ep, graph_capture)
    chosen = None if dtype is None else require_model_dtype(ep, parse_dtype(dtype))
    asked = precision_name(precision)
    check_int4_precision(int4 is not None, asked)
    context_length = check_context_length(context_length)
    stored = frozenset(stored() if callable(stored) else stored)
    if asked is None and int4 is not None:
        asked = "int4"  # the int4 options say it
    if asked in QUANTIZED_PRECISIONS:
        model_dtype = chosen or ep.default_dtype
    elif asked is not None:
        model_dtype = require_model_dtype(ep, FLOAT_PRECISIONS[asked])
        if chosen is not None and chosen != model_dtype:
            raise ConfigError(
                f"dtype {dtype!r} contradicts precision {asked!r}; accepted: one of them, "
                "or a matching pair"
            )
    else:
        model_dtype = chosen or ep.default_dtype
    if asked in QUANTIZED_PRECISIONS:
        int4 = int4 or Int4Options()
    plan = int4_plan(ep, model_dtype, int4)
    if int4 is not None:
        int4 = dataclasses.replace(int4, accuracy_level=plan.accuracy_level)
    dequantize = bool(stored) and (asked in FLOAT_PRECISIONS or not plan.matmul_nbits)
    kept = STORED_PRECISIONS[min(stored)] if stored and not dequantize else None
    resolved = asked or kept or precision_of(model_dtype)
    return Target(
        ep,
        model_dtype,
        resolved,
        int4,
        context_length,
        stored=stored,
        dequantize_stored=dequantize,
        int4_plan=plan,
    )


def target_or_choices(
    target: Target | None,
    execution_provider: str | EpCapabilities,
    caller: str,
    stored: Collection[int] | None = None,
    **choices: object,
) -> Target:
    """`target` as given, or the one `execution_provider`, `choices` and the source's `stored`
    integers name; never both. With `stored` (a caller whose output its precision names), a
    given target must have been resolved with the same."""
    if target is None:
        return resolve_target(execution_provider, stored=stored or (), **choices)
    if execution_provider != "default" or any(value is not None for value in choices.values()):
        raise ConfigError(
            f"{caller}() was given a target and also execution_provider or "
            f"{', '.join(choices)}; accepted: a target, or those arguments"
        )
    if stored is not None and target.stored != frozenset(stored):
        raise ConfigError(
            f"{caller}() was given a target resolved for a source storing "
            f"{_bits(target.stored)}, but the source stores {_bits(stored)}; accepted: "
            f"resolve_target(..., stored={sorted(stored)}), or {caller}()'s own arguments"
        )
    return target


def _bits(stored: Collection[int]) -> str:
    return " and ".join(f"{bits}-bit integers" for bits in sorted(stored)) or "float weights"


def parse_dtype(dtype: str | ir.DataType) -> ir.DataType:
    """The model dtype a float precision name (or an ir.DataType) stands for."""
    if isinstance(dtype, ir.DataType):
        if dtype in FLOAT_PRECISIONS.values():
            return dtype
    elif isinstance(dtype, str):
        name = dtype.lower()
        name = _SPELLINGS.get(name, name)
        if name in FLOAT_PRECISIONS:
            return FLOAT_PRECISIONS[name]
    raise ConfigError(f"dtype {dtype!r} is not supported; accepted: {', '.join(FLOAT_PRECISIONS)}")


def precision_of(dtype: ir.DataType) -> str:
    """The float precision name of a model dtype (fp32, fp16 or bf16)."""
    return next(name for name, value in FLOAT_PRECISIONS.items() if value == dtype)


def require_model_dtype(ep: EpCapabilities, dtype: ir.DataType) -> ir.DataType:
    """`dtype` if `ep` runs models of it, else an ExecutionProviderError saying what does."""
    if dtype not in ep.model_dtypes:
        accepted = sorted(ep.model_dtypes, key=lambda d: d.value)
        raise ExecutionProviderError(
            f"execution provider {ep.name!r} does not run {precision_of(dtype)} models (its "
            f"runtime has no {precision_of(dtype)} kernels); accepted for {ep.name}: "
            + ", ".join(precision_of(d) for d in accepted)
        )
    return dtype


def _with_graph_capture(ep: EpCapabilities, enabled: bool) -> EpCapabilities:
    if not isinstance(enabled, bool):
        raise ConfigError(f"graph capture {enabled!r} is not accepted; accepted: true or false")
    try:
        return ep.with_graph_capture(enabled)
    except ValueError:
        raise ConfigError(
            f"execution provider {ep.name!r} has no graph capture; accepted: graph capture on "
            "for EPs whose `mobius-genai eps` row shows it on or off"
        ) from None


def check_int4_precision(int4_given: bool, precision: str | None) -> None:
    """Int4 options belong with precision int4, or with no precision (they imply int4)."""
    if int4_given and precision is not None and precision not in QUANTIZED_PRECISIONS:
        raise ConfigError(
            f"int4 options were given for precision {precision!r}; accepted: int4 options with "
            "precision 'int4' or without a precision (they imply int4)"
        )


def check_context_length(context_length: int | None) -> int | None:
    """`context_length` if it is a positive integer (or None, the checkpoint's)."""
    if context_length is None:
        return None
    if (
        isinstance(context_length, bool)
        or not isinstance(context_length, int)
        or context_length <= 0
    ):
        raise ConfigError(
            f"context length {context_length!r} is not accepted; accepted: a positive integer"
        )
    check_size("context_length", context_length, source="build option")
    return context_length


def precision_name(precision: str | None) -> str | None:
    """The canonical name of a precision (None stays None)."""
    if precision is None:
        return None
    name = str(precision).lower()
    name = _SPELLINGS.get(name, name)
    if name not in PRECISIONS:
        raise ConfigError(
            f"precision {precision!r} is not supported; accepted: {', '.join(PRECISIONS)}"
        )
    return name
