"""Execution providers: capabilities as data, the registry, and the build context."""

from mobius_genai.ep.builtins import BUILTIN_ALIASES, BUILTIN_EPS, HOST_EP
from mobius_genai.ep.capabilities import (
    MAX_INT4_ACCURACY_LEVEL,
    EpCapabilities,
    FrozenOptions,
    RuntimeInfo,
)
from mobius_genai.ep.context import (
    DEFAULT_EP,
    BuildContext,
    build_context,
    current_build_context,
    ep_capabilities,
    get_build_dtype,
)
from mobius_genai.ep.registry import EpRegistry, ep_registry, get_ep, register_ep, resolve_ep

__all__ = [
    "BUILTIN_ALIASES",
    "BUILTIN_EPS",
    "DEFAULT_EP",
    "HOST_EP",
    "MAX_INT4_ACCURACY_LEVEL",
    "BuildContext",
    "EpCapabilities",
    "EpRegistry",
    "FrozenOptions",
    "RuntimeInfo",
    "build_context",
    "current_build_context",
    "ep_capabilities",
    "ep_registry",
    "get_build_dtype",
    "get_ep",
    "register_ep",
    "resolve_ep",
]
