"""An Olive package config naming mobius-genai's passes beside all of Olive's own.

Olive 0.13 has no discovery of third-party passes: `olive run --package-config FILE` is the only
way in, and FILE replaces Olive's registry (olive/olive_config.json) instead of extending it.
So the file written here is the installed Olive's registry with PASSES added; rewrite it after
upgrading olive-ai.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mobius_genai.errors import MobiusError

#: Olive's registry, in its package folder (what OlivePackageConfig.get_default_config_path() names).
_OLIVE_REGISTRY = "olive_config.json"

#: Pass name → Olive's PassModuleConfig fields for it.
PASSES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "MobiusExport": {
            "module_path": "mobius_genai.olive.MobiusExport",
            "supported_providers": ["*"],
            "supported_accelerators": ["*"],
            "supported_precisions": ["fp32", "fp16", "bf16", "int4"],
            "supported_algorithms": [],
            "supported_quantization_encodings": [],
            "module_dependencies": ["mobius-genai"],
        },
        "MobiusFinalize": {
            "module_path": "mobius_genai.olive.MobiusFinalize",
            "supported_providers": ["*"],
            "supported_accelerators": ["*"],
            "supported_precisions": ["*"],
            "supported_algorithms": [],
            "supported_quantization_encodings": [],
            "module_dependencies": ["mobius-genai"],
        },
    }
)


def olive_package_config() -> dict[str, Any]:
    """The installed Olive's package config with PASSES added (replacing same-named entries).

    Olive's registry file is found without importing olive, whose import pulls in torch and
    takes seconds; the test suite checks that Olive loads the result.
    """
    spec = importlib.util.find_spec("olive")
    if spec is None or not spec.submodule_search_locations:
        raise MobiusError("olive-ai is not installed; accepted: pip install 'mobius-genai[olive]'")
    path = Path(next(iter(spec.submodule_search_locations))) / _OLIVE_REGISTRY
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MobiusError(
            f"olive-ai's pass registry {path}: cannot read it ({error}); accepted: the "
            "olive-ai release mobius-genai[olive] installs"
        ) from error
    passes = document.setdefault("passes", {})
    ours = {name.lower() for name in PASSES}
    for name in [name for name in passes if name.lower() in ours]:
        del passes[name]
    passes.update(copy.deepcopy(dict(PASSES)))
    return document


def write_package_config(path: str | Path) -> Path:
    """Write olive_package_config() as JSON to `path` (replacing it); returns the path."""
    path = Path(path)
    text = json.dumps(olive_package_config(), indent=4) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise MobiusError(f"olive package config {path}: cannot write it ({error})") from error
    return path
