"""The registry of execution providers: name → `EpCapabilities`, plus aliases.

One module-level `ep_registry` holds the built-ins (registered here, at import) and any EP
registered at runtime with `register_ep`. Names are looked up in any case, and an EP's
onnxruntime name (`RuntimeInfo.ort_provider`, e.g. "CUDAExecutionProvider") is an alias of it.
Unknown names fail early with the list of supported ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from mobius_genai.ep.builtins import BUILTIN_ALIASES, BUILTIN_EPS
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.errors import ExecutionProviderError

__all__ = ["EpRegistry", "ep_registry", "get_ep", "register_ep", "resolve_ep"]


class EpRegistry:
    """Canonical EP names to capabilities; aliases resolve on lookup but are never iterated.

    Lookups ignore case; each EP's onnxruntime provider name resolves to it like an alias.
    """

    def __init__(
        self, eps: Iterable[EpCapabilities] = (), aliases: Mapping[str, str] | None = None
    ) -> None:
        self._entries: dict[str, EpCapabilities] = {}
        self._aliases: dict[str, str] = {}
        self._lock = threading.Lock()
        for caps in eps:
            self.register(caps)
        for alias, target in (aliases or {}).items():
            self.register_alias(alias, target)

    def __iter__(self) -> Iterator[str]:
        """Canonical names, sorted, so listings and error messages are stable."""
        with self._lock:
            return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return self.canonical_name(name) is not None  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"EpRegistry({list(self)})"

    @property
    def aliases(self) -> Mapping[str, str]:
        """Alias → canonical name (read-only view; onnxruntime names are not listed)."""
        return MappingProxyType(self._aliases)

    def entries(self) -> list[EpCapabilities]:
        """Every registered EP's capabilities, sorted by name."""
        return [self._entries[name] for name in self]

    def canonical_name(self, name: str) -> str | None:
        """The canonical name `name` refers to (any case; itself, an alias or an onnxruntime
        name), or None."""
        return self._owner(name.lower()) if isinstance(name, str) else None

    def get(self, name: str) -> EpCapabilities | None:
        """Capabilities for `name` (see `canonical_name`), or None when unknown."""
        canonical = self.canonical_name(name)
        return None if canonical is None else self._entries[canonical]

    def by_genai_provider(self, provider: str) -> EpCapabilities | None:
        """The first registered EP whose genai_config provider name is `provider` (any case)."""
        return self._by_runtime("genai_provider", provider)

    def by_ort_provider(self, provider: str) -> EpCapabilities | None:
        """The EP whose onnxruntime name (as an Olive accelerator lists it) is `provider` (any
        case); our own names do not count."""
        return self._by_runtime("ort_provider", provider)

    def require(self, name: str) -> EpCapabilities:
        """Capabilities for `name`; raises ExecutionProviderError (a ValueError) when unknown."""
        caps = self.get(name)
        if caps is None:
            raise ExecutionProviderError(
                f"Unknown execution provider {name!r}. Supported: {sorted(self)}"
            )
        return caps

    def register(self, caps: EpCapabilities, *, replace: bool = False) -> None:
        """Add `caps` under `caps.name`; an existing name is only overwritten with replace=True.

        Neither its name nor its onnxruntime name may already refer to another EP.
        """
        if not isinstance(caps, EpCapabilities):
            raise TypeError(f"register() expects EpCapabilities, got {type(caps).__name__}")
        with self._lock:
            if caps.name in self._aliases:
                raise ValueError(
                    f"Execution provider name {caps.name!r} is already an alias of "
                    f"{self._aliases[caps.name]!r}"
                )
            if caps.name in self._entries and not replace:
                raise ValueError(
                    f"Execution provider {caps.name!r} is already registered; "
                    f"pass replace=True to override it"
                )
            for key in (caps.name, caps.runtime.ort_provider):
                owner = None if key is None else self._owner(key.lower())
                if owner is not None and owner != caps.name:
                    raise ValueError(
                        f"Execution provider {caps.name!r}: {key!r} already refers to {owner!r}"
                    )
            self._entries[caps.name] = caps

    def register_alias(self, alias: str, target: str) -> None:
        """Make `alias` (any case) resolve to the registered canonical EP `target`."""
        with self._lock:
            if self._owner(alias.lower()) is not None:
                raise ValueError(f"Execution provider name {alias!r} is already taken")
            if target not in self._entries:
                raise ValueError(
                    f"Cannot alias {alias!r} to unknown execution provider {target!r}. "
                    f"Supported: {sorted(self._entries)}"
                )
            self._aliases[alias.lower()] = target

    def _owner(self, key: str) -> str | None:
        """The canonical name a lowercase `key` refers to: a name, an alias or an onnxruntime name."""
        if key in self._entries:
            return key
        if key in self._aliases:
            return self._aliases[key]
        caps = self._by_runtime("ort_provider", key)
        return None if caps is None else caps.name

    def _by_runtime(self, field: str, provider: str) -> EpCapabilities | None:
        for caps in self._entries.values():
            name = getattr(caps.runtime, field)
            if name is not None and name.lower() == provider.lower():
                return caps
        return None


ep_registry = EpRegistry(BUILTIN_EPS, BUILTIN_ALIASES)


def register_ep(caps: EpCapabilities, *, replace: bool = False) -> None:
    """Register an out-of-tree EP in the global registry (see `EpRegistry.register`)."""
    ep_registry.register(caps, replace=replace)


def get_ep(name: str) -> EpCapabilities:
    """Capabilities of a registered EP, in any case, or of an alias or onnxruntime name for one;
    ValueError naming the supported ones if unknown."""
    return ep_registry.require(name)


def resolve_ep(ep: str | EpCapabilities) -> EpCapabilities:
    """The capabilities `ep` names (see `get_ep`), or `ep` itself when it is capabilities: the
    one place an ``ep`` argument becomes an entry. Raises ExecutionProviderError when unknown."""
    return ep if isinstance(ep, EpCapabilities) else ep_registry.require(ep)
