"""`MobiusFinalize`: the last pass of an Olive chain that starts with `MobiusExport`.

Olive passes after MobiusExport (peephole optimizers, quantizers, ...) rewrite model.onnx and
its external data, and Olive copies the bundle's other files beside the result unchanged. Then
mobius_manifest.json lists checksums of files that changed or no longer exist, and nothing
checked that genai_config.json still fits the graph. This pass makes the folder a bundle again:
model.onnx plus its weights and every sidecar in one folder, the manifest's file checksums and
the card's file list refreshed, `validate_bundle` passed (genai_config's decoder inputs, outputs
and layer count against the final graph), and a smoke test with onnxruntime-genai.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from olive.common.utils import hardlink_copy_file
from olive.hardware.accelerator import AcceleratorSpec
from olive.model import ONNXModelHandler
from olive.passes import Pass
from olive.passes.pass_config import BasePassConfig, PassConfigParam

from mobius_genai._json import write_json
from mobius_genai.build import MODEL_FILENAME
from mobius_genai.bundle.bos import required_bos
from mobius_genai.bundle.card import CARD_FILENAME, render_card
from mobius_genai.bundle.genai_config import CONFIG_FILENAME
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.manifest import MANIFEST_FILENAME, bundle_files, file_entries
from mobius_genai.bundle.schema import read_bundle_json, validate_manifest
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.ep import HOST_EP, EpCapabilities, ep_registry, resolve_ep
from mobius_genai.errors import BundleError, ConfigError
from mobius_genai.olive.export import bundle_model_handler
from mobius_genai.packager import bundle_name
from mobius_genai.runtime.smoke import smoke_test

logger = logging.getLogger(__name__)


class MobiusFinalize(Pass):
    """Gather a MobiusExport bundle changed by later Olive passes back into a valid bundle.

    Raises BundleError (a ValueError) when the final graph no longer matches genai_config.json
    (an input or output renamed, a layer's KV cache missing) or the bundle fails to generate.
    """

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        return {
            "smoke_test": PassConfigParam(
                type_=bool,
                default_value=True,
                description="Generate a few tokens with onnxruntime-genai before returning.",
            ),
        }

    def _run_for_config(
        self, model: ONNXModelHandler, config: BasePassConfig, output_model_path: str
    ) -> ONNXModelHandler:
        if not isinstance(model, ONNXModelHandler):
            raise ConfigError(
                f"MobiusFinalize: input model type {type(model).__name__}; accepted: the ONNX "
                "model of MobiusExport, or of passes after it"
            )
        sidecars = _sidecars(model)
        manifest = (
            _read_json(sidecars[MANIFEST_FILENAME]) if MANIFEST_FILENAME in sidecars else None
        )
        out = Path(output_model_path) / _bundle_name(manifest)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        _copy_model(Path(model.model_path), out)
        for name, path in sidecars.items():
            if path.is_dir():
                shutil.copytree(path, out / name)
            else:
                shutil.copyfile(path, out / name)
        config_path = out / CONFIG_FILENAME
        genai_config = _read_json(config_path)
        if genai_config.get("model", {}).get("decoder", {}).get("filename") != MODEL_FILENAME:
            genai_config["model"]["decoder"]["filename"] = MODEL_FILENAME
            write_json(config_path, genai_config)
        if manifest is not None:
            refresh_manifest(out, manifest, genai_config)
        validate_bundle(out)
        if config.smoke_test:
            note = smoke_test(out, _bundle_ep(genai_config, manifest)).note
            logger.info("MobiusFinalize: %s", note)
        return bundle_model_handler(out, model.model_attributes)


def refresh_manifest(
    folder: Path, manifest: dict[str, Any], genai_config: Mapping[str, Any]
) -> dict[str, Any]:
    """Rewrite `folder`'s card and manifest for the files now in it; returns the manifest.

    Source and build sections stay as MobiusExport wrote them; the olive-ai version joins the
    dependencies, and every file's sha256 and size is taken again.
    """
    manifest = dict(manifest)
    card = render_card(
        genai_config,
        folder=folder.name,
        model_id=manifest["source"]["model_id"],
        revision=manifest["source"]["revision"],
        build=manifest["build"],
        tool_version=manifest["tool"]["version"],
        files=sorted({*bundle_files(folder), CARD_FILENAME, MANIFEST_FILENAME}),
        bos_token_id=required_bos(folder),
    )
    (folder / CARD_FILENAME).write_text(card, encoding="utf-8")
    manifest["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"
    )
    manifest["dependencies"] = {
        **manifest["dependencies"],
        "olive-ai": importlib.metadata.version("olive-ai"),
    }
    manifest["files"] = file_entries(folder, bundle_files(folder))
    validate_manifest(manifest)
    write_json(folder / MANIFEST_FILENAME, manifest)
    return manifest


def _sidecars(model: ONNXModelHandler) -> dict[str, Path]:
    """Additional files by name; genai_config.json must be among them."""
    files = {
        Path(path).name: Path(path)
        for path in (model.model_attributes or {}).get("additional_files") or []
    }
    if CONFIG_FILENAME not in files:
        raise ConfigError(
            f"MobiusFinalize: the input model carries no {CONFIG_FILENAME} among its "
            "additional_files; accepted: the model of MobiusExport, or of passes after it"
        )
    missing = sorted(name for name, path in files.items() if not path.exists())
    if missing:
        raise BundleError(f"MobiusFinalize: additional files {missing} no longer exist")
    return files


def _copy_model(model_path: Path, out: Path) -> None:
    """model.onnx and its external data files into `out` (hard links where possible)."""
    hardlink_copy_file(model_path, out / MODEL_FILENAME)
    for location in GraphInfo.from_file(model_path).external_data:
        source = model_path.parent / location
        if not source.is_file():
            raise BundleError(
                f"MobiusFinalize: {model_path.name} reads weights from missing {source}"
            )
        (out / location).parent.mkdir(parents=True, exist_ok=True)
        hardlink_copy_file(source, out / location)


def _bundle_name(manifest: Mapping[str, Any] | None) -> str:
    """<model>-<ep>-<precision>, as MobiusExport named the folder; "bundle" without a manifest."""
    if manifest is None:
        return "bundle"
    build = manifest["build"]
    return bundle_name(
        manifest["source"]["model_id"], build["execution_provider"], build["precision"]
    )


def _bundle_ep(
    genai_config: Mapping[str, Any], manifest: Mapping[str, Any] | None
) -> EpCapabilities:
    """The EP the bundle was built for: the manifest's, else the one its provider options name."""
    if manifest is not None:
        return resolve_ep(manifest["build"]["execution_provider"])
    session = genai_config["model"]["decoder"].get("session_options", {})
    for entry in session.get("provider_options", []):
        for provider in entry:
            caps = ep_registry.by_genai_provider(provider)
            if caps is not None:
                return caps
    return resolve_ep(HOST_EP)


def _read_json(path: Path) -> dict[str, Any]:
    return read_bundle_json(path, f"MobiusFinalize: {path.name}")
