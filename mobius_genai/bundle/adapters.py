"""LoRA adapter files of a bundle: a PEFT adapter → `NAME.onnx_adapter` (onnxruntime's
AdapterFormat), checked against the LoRA inputs of the bundle's graph (components/lora.py).

The file holds, for each projection the adapter changes, the graph inputs ``<module>.lora_A``
[in, r] and ``<module>.lora_B`` [r, out] (scale applied) in the graph's float dtype, also on an
int4 base (only the base weights are quantized). og 0.18 loads it with
``og.Adapters(model).load(file, name)`` and feeds it with ``generator.set_active_adapter``.
The manifest's ``build.lora`` records what the graph accepts (targets, rank axis, dtype), so
`mobius-genai adapter` converts a further adapter for the bundle later.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mobius_genai._graph_keys import LORA_A, LORA_B, LORA_RANK
from mobius_genai.errors import BundleError, OptionError

if TYPE_CHECKING:
    from mobius_genai.checkpoint.peft import PeftAdapter

ADAPTERS_DIR = "adapters"
ADAPTER_SUFFIX = ".onnx_adapter"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: onnx.TensorProto element types of the float graphs adapters serve.
_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16"}
_BFLOAT16 = 16


def check_adapter_names(names: Mapping[str, object] | list[str]) -> None:
    """Each adapter name a plain file name, used once: one line otherwise."""
    seen: set[str] = set()
    for name in names:
        if not _NAME.match(name):
            raise OptionError(
                f"adapter name {name!r}; accepted: letters, digits, '_', '.', '-' (at most 64)"
            )
        if name.lower() in seen:
            raise OptionError(f"adapter name {name!r} given twice; accepted: one name each")
        seen.add(name.lower())


def read_adapters(adapters: Mapping[str, str | Path]) -> dict[str, PeftAdapter]:
    """Each named PEFT folder read and checked (before a build: nothing is written yet)."""
    from mobius_genai.checkpoint.peft import read_peft_adapter

    check_adapter_names(list(adapters))
    return {name: read_peft_adapter(folder) for name, folder in adapters.items()}


def checkpoint_modules(family: Any) -> Callable[[str], str | None]:
    """Graph module name → the checkpoint's (PEFT's) module name, through the family's
    weight-name map; None for a projection the checkpoint stores in parts."""

    def name(module: str) -> str | None:
        stored = (
            f"{module}.weight" if family is None else family.checkpoint_name(f"{module}.weight")
        )
        if not isinstance(stored, str) or not stored.endswith(".weight"):
            return None
        return stored.removesuffix(".weight")

    return name


def write_adapters(
    graph_file: Path, adapters: Mapping[str, PeftAdapter], family: Any
) -> dict[str, Any] | None:
    """Write `adapters` beside the graph in `graph_file`; returns the manifest's `build.lora`
    (None for a graph without LoRA inputs)."""
    inputs = lora_inputs(graph_file)
    if not inputs:
        return None
    record = lora_record(inputs)
    modules = checkpoint_modules(family)
    for name, adapter in adapters.items():
        entry = write_adapter(adapter, inputs, modules, adapter_path(graph_file.parent, name))
        record["adapters"][name] = {"file": f"{ADAPTERS_DIR}/{name}{ADAPTER_SUFFIX}", **entry}
    return record


def convert_for_bundle(
    peft_folder: str | Path, bundle: str | Path, out: str | Path, *, force: bool = False
) -> Path:
    """`mobius-genai adapter`: the PEFT adapter in `peft_folder` as an .onnx_adapter file `out`
    for `bundle`, a bundle packaged with LoRA inputs (its manifest's `build.lora`). Nothing is
    written when anything does not fit; an existing `out` is replaced only with `force`."""
    from mobius_genai.bundle.bundle_folder import require_bundle
    from mobius_genai.bundle.manifest import MANIFEST_FILENAME
    from mobius_genai.bundle.schema import read_bundle_json
    from mobius_genai.checkpoint.peft import read_peft_adapter
    from mobius_genai.models.families import get_family

    bundle, out = Path(bundle), Path(out)
    require_bundle(bundle)
    manifest_path = bundle / MANIFEST_FILENAME
    build = read_bundle_json(manifest_path)["build"] if manifest_path.is_file() else {}
    if "lora" not in build:
        raise BundleError(
            f"bundle {bundle}: its graph takes no LoRA inputs; accepted: a bundle packaged "
            "with `--adapter NAME=PEFT_DIR`"
        )
    if out.exists() and not force:
        raise OptionError(f"output {out} exists; accepted: a new file, or --force to replace it")
    if out.suffix != ADAPTER_SUFFIX:
        raise OptionError(f"output {out}: accepted: a file name ending in {ADAPTER_SUFFIX}")
    adapter = read_peft_adapter(peft_folder)
    config = read_bundle_json(bundle / "genai_config.json")
    graph_file = bundle / config["model"]["decoder"]["filename"]
    family = get_family(build["model_type"])
    write_adapter(adapter, lora_inputs(graph_file), checkpoint_modules(family), out)
    return out


def adapter_path(bundle: Path, name: str) -> Path:
    """Where the bundle keeps adapter `name`."""
    return bundle / ADAPTERS_DIR / f"{name}{ADAPTER_SUFFIX}"


def lora_inputs(graph_file: Path) -> dict[str, tuple[int, list[int | str]]]:
    """The LoRA inputs of a saved graph (not its weights): name → (element type, shape)."""
    import onnx

    proto = onnx.load(str(graph_file), load_external_data=False)
    found = {}
    for value in proto.graph.input:
        if value.name.endswith((f".{LORA_A}", f".{LORA_B}")):
            tensor = value.type.tensor_type
            shape = [
                d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor.shape.dim
            ]
            found[value.name] = (tensor.elem_type, shape)
    return found


def lora_record(inputs: Mapping[str, tuple[int, list[int | str]]]) -> dict[str, Any]:
    """The manifest's `build.lora` of a graph with LoRA `inputs`: what an adapter may change."""
    modules = sorted({name.rsplit(".", 1)[0] for name in inputs})
    elem_type = next(iter(inputs.values()))[0]
    return {
        "rank_axis": f"PROJECTION.{LORA_RANK}",  # one symbolic rank axis per projection
        "dtype": _FLOAT_TYPES[elem_type],
        "targets": sorted({module.rsplit(".", 1)[-1] for module in modules}),
        "modules": len(modules),
        "adapters": {},
    }


def write_adapter(
    adapter: PeftAdapter,
    inputs: Mapping[str, tuple[int, list[int | str]]],
    checkpoint_module: Callable[[str], str | None],
    out: Path,
) -> dict[str, Any]:
    """Convert `adapter` for a graph with LoRA `inputs` and write it to `out` (nothing written
    on a mismatch); `checkpoint_module` maps a graph module name to the checkpoint's (PEFT
    names the checkpoint's modules). Returns its manifest entry."""
    import onnxruntime as ort

    graph_modules = sorted({name.rsplit(".", 1)[0] for name in inputs})
    by_checkpoint = {checkpoint_module(module): module for module in graph_modules}
    missing = [module for module in adapter.pairs if module not in by_checkpoint]
    if missing:
        targets = sorted({m.rsplit(".", 1)[-1] for m in graph_modules})
        raise BundleError(
            f"adapter {adapter.folder}: {len(missing)} module(s) without LoRA inputs in the "
            f"bundle (first {missing[0]!r}); accepted: target modules {targets} of its layers"
        )
    parameters = {}
    for module, pair in adapter.pairs.items():
        graph_module = by_checkpoint[module]
        name_a, name_b = f"{graph_module}.{LORA_A}", f"{graph_module}.{LORA_B}"
        elem_type, shape_a = inputs[name_a]
        shape_b = inputs[name_b][1]
        if pair.a.shape[0] != shape_a[0] or pair.b.shape[1] != shape_b[-1]:
            raise BundleError(
                f"adapter {adapter.folder}: {module} maps {pair.a.shape[0]} → "
                f"{pair.b.shape[1]} features, the bundle's {shape_a[0]} → {shape_b[-1]}; "
                "accepted: an adapter trained on this bundle's base model"
            )
        parameters[name_a] = _ort_value(ort, pair.a, elem_type)
        parameters[name_b] = _ort_value(ort, pair.b, elem_type)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    adapter_format = ort.AdapterFormat()
    adapter_format.set_adapter_version(1)
    adapter_format.set_model_version(1)
    adapter_format.set_parameters(parameters)
    try:
        adapter_format.export_adapter(str(partial))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return {"rank": adapter.rank, "targets": adapter.targets, "modules": len(adapter.pairs)}


def _ort_value(ort, array: np.ndarray, elem_type: int):
    """`array` (float32) as an OrtValue of the graph's float type."""
    if elem_type == _BFLOAT16:
        import ml_dtypes

        bits = np.ascontiguousarray(array.astype(ml_dtypes.bfloat16)).view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, elem_type)
    dtype = np.float16 if elem_type == 10 else np.float32
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array.astype(dtype)))
