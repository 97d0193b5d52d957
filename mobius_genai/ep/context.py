"""The build context: which EP and dtype the graph being built targets.

Components query it (`ep_capabilities()`, `get_build_dtype()`) instead of receiving the EP through
every layer. It lives in a ContextVar, so each thread and asyncio task sees its own value, inner
contexts shadow outer ones, and the previous value comes back on exit even after an exception.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.registry import get_ep

__all__ = [
    "DEFAULT_EP",
    "BuildContext",
    "build_context",
    "current_build_context",
    "ep_capabilities",
    "get_build_dtype",
]

#: EP assumed outside any build context: portable ONNX.
DEFAULT_EP = "default"
_DEFAULT_DTYPE = ir.DataType.FLOAT


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """The EP capabilities and model dtype a graph is being built for."""

    capabilities: EpCapabilities
    dtype: ir.DataType


# None means "no context": resolved lazily so a replaced "default" EP is honoured.
_current: contextvars.ContextVar[BuildContext | None] = contextvars.ContextVar(
    "mobius_genai_build_context", default=None
)


def current_build_context() -> BuildContext:
    """The active context, or the default EP with FLOAT when none is active."""
    context = _current.get()
    if context is None:
        return BuildContext(get_ep(DEFAULT_EP), _DEFAULT_DTYPE)
    return context


def ep_capabilities() -> EpCapabilities:
    """Capabilities of the EP being built for ("default" outside any build context)."""
    return current_build_context().capabilities


def get_build_dtype() -> ir.DataType:
    """Model dtype being built (FLOAT outside any build context)."""
    return current_build_context().dtype


@contextlib.contextmanager
def build_context(
    caps: EpCapabilities | str, dtype: ir.DataType | None = None
) -> Iterator[BuildContext]:
    """Build for `caps` (capabilities or an EP name) and `dtype` within the `with` block.

    `dtype` defaults to the EP's ``default_dtype``. Unknown EP names raise ValueError.
    """
    capabilities = get_ep(caps) if isinstance(caps, str) else caps
    if not isinstance(capabilities, EpCapabilities):
        raise TypeError(
            f"build_context() expects EpCapabilities or an EP name, got {type(caps).__name__}"
        )
    if dtype is None:
        dtype = capabilities.default_dtype
    if not isinstance(dtype, ir.DataType):
        raise TypeError(f"build_context() expects an ir.DataType dtype, got {dtype!r}")
    context = BuildContext(capabilities, dtype)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
