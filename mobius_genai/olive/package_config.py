"""An Olive package config naming mobius-genai's passes beside all of Olive's own.

Olive 0.13 has no discovery of third-party passes: `olive run --package-config FILE` is the only
way in, and FILE replaces Olive's registry (olive/olive_config.json) instead of extending it.
So the file written here is the installed Olive's registry with PASSES added; rewrite it after
upgrading olive-ai.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mobius_genai.errors import MobiusError

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
    """The installed Olive's package config with PASSES added (replacing same-named entries)."""
    try:
        from olive.package_config import OlivePackageConfig
    except ModuleNotFoundError as error:
        raise MobiusError(
            f"olive-ai is not installed ({error}); accepted: pip install 'mobius-genai[olive]'"
        ) from error
    path = Path(OlivePackageConfig.get_default_config_path())
    document = json.loads(path.read_text(encoding="utf-8"))
    passes = document.setdefault("passes", {})
    ours = {name.lower() for name in PASSES}
    for name in [name for name in passes if name.lower() in ours]:
        del passes[name]
    passes.update(copy.deepcopy(dict(PASSES)))
    OlivePackageConfig.model_validate(document)  # the file must load where Olive reads it
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
