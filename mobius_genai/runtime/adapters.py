"""The LoRA adapter a generation runs with (`run`/`chat`/`bench --adapter NAME`): one of the
bundle's `adapters/NAME.onnx_adapter`, or an .onnx_adapter file, loaded with og's own
`og.Adapters` and activated per generator (og.Engine has no adapters in 0.18, so a generation
with an adapter runs on og.Generator)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnxruntime_genai as og

from mobius_genai.bundle._og_errors import og_error_line
from mobius_genai.bundle.adapters import ADAPTER_SUFFIX, ADAPTERS_DIR, adapter_path
from mobius_genai.errors import BundleError


@dataclasses.dataclass(frozen=True)
class ActiveAdapter:
    """An adapter loaded for a model, under `name`."""

    adapters: og.Adapters
    name: str

    def activate(self, generator: og.Generator) -> None:
        """Feed this adapter's weights to `generator`'s LoRA inputs."""
        generator.set_active_adapter(self.adapters, self.name)


def load_adapter(folder: Path, model: og.Model, name: str) -> ActiveAdapter:
    """Adapter `name` of the bundle in `folder` (or the .onnx_adapter file `name`), loaded."""
    path = Path(name) if name.endswith(ADAPTER_SUFFIX) else adapter_path(folder, name)
    if not path.is_file():
        shipped = sorted(p.stem for p in (folder / ADAPTERS_DIR).glob(f"*{ADAPTER_SUFFIX}"))
        raise BundleError(
            f"{folder}: no adapter {name!r}; accepted: {shipped or 'none shipped'} (the "
            f"bundle's {ADAPTERS_DIR}/), or a file ending in {ADAPTER_SUFFIX}"
        )
    adapters = og.Adapters(model)
    try:
        adapters.load(str(path), path.stem)
    except RuntimeError as error:
        raise BundleError(
            f"{path}: onnxruntime-genai cannot load it: {og_error_line(error)}"
        ) from None
    return ActiveAdapter(adapters, path.stem)
