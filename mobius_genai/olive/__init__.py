"""Olive (olive-ai) integration: the `MobiusExport` and `MobiusFinalize` passes.

Olive finds a third-party pass only through a package config given to `olive run
--package-config FILE`, and that file replaces Olive's own pass registry; `mobius-genai
olive-config -o FILE` writes the installed Olive's registry plus these passes (see
recipes/README.md). The passes import olive-ai on first use, so this package imports without it.
"""

from __future__ import annotations

import importlib
from typing import Any

from mobius_genai.olive.package_config import PASSES, olive_package_config, write_package_config

__all__ = [
    "PASSES",
    "MobiusExport",
    "MobiusFinalize",
    "mobius_ep_for",
    "olive_ep_mapping",
    "olive_package_config",
    "write_package_config",
]

# Attribute → module holding it; imported on first access (the passes need olive-ai, the
# mapping the EP registry: `mobius-genai olive-config` needs neither).
_LAZY = {
    "MobiusExport": "mobius_genai.olive.export",
    "MobiusFinalize": "mobius_genai.olive.finalize",
    "mobius_ep_for": "mobius_genai.olive.providers",
    "olive_ep_mapping": "mobius_genai.olive.providers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        if error.name != "olive" and not (error.name or "").startswith("olive."):
            raise
        raise ModuleNotFoundError(
            f"mobius_genai.olive.{name} needs olive-ai: pip install 'mobius-genai[olive]'",
            name=error.name,
        ) from error
