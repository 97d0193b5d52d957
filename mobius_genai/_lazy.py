"""Public names of a package imported on first use (PEP 562), so importing it stays cheap.

onnx, onnxscript and onnxruntime take seconds to import; the console script must start, and
handle Ctrl-C, before it needs them, and the smoke test's process needs onnxruntime-genai only.
"""

from __future__ import annotations

import importlib
import sys
import types

TYPE_CHECKING = False  # typing itself takes milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class _LazyPackage(types.ModuleType):
    """A package whose `_lazy_exports` (name → defining module) are imported when first read.

    A submodule that shares a public name (`mobius_genai.build` and the function `build`) is
    not bound over it when it is imported: the public name keeps meaning the exported value.
    """

    _lazy_exports: Mapping[str, str]

    def __getattr__(self, name: str) -> Any:
        module = self._lazy_exports.get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        super().__setattr__(name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._lazy_exports and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._lazy_exports})


def export_lazily(package: str, exports: Mapping[str, str]) -> None:
    """Make the names of `exports` (name → module defining it) attributes of `package` that
    are imported on first use."""
    module = sys.modules[package]
    module.__dict__["_lazy_exports"] = dict(exports)
    module.__class__ = _LazyPackage
