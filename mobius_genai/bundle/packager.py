"""`package()`: from a checkpoint to a checked bundle folder that `og.Model(folder)` runs.

build → save graph + weights → genai_config.json → tokenizer files → README.md → manifest →
validate → smoke test (of the bundle, or of a twin with fewer layers: `smoke_plan`), whose record
joins the card and the manifest, all inside a temporary folder that becomes OUT only at the very
end.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from mobius_genai._json import read_json, write_json
from mobius_genai.build import (
    MODEL_FILENAME,
    ModelPackage,
    build,
    parse_dtype,
    require_model_dtype,
    resolve_ep,
)
from mobius_genai.bundle.bundle import (
    checkpoint_folder,
    copy_tokenizer_files,
    staged_output,
)
from mobius_genai.bundle.card import CARD_FILENAME, render_card
from mobius_genai.bundle.digest import save_with_digest
from mobius_genai.bundle.genai_config import (
    CONFIG_FILENAME,
    make_genai_config,
    read_generation_config,
)
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.manifest import (
    MANIFEST_FILENAME,
    bundle_files,
    cancel_background_hashes,
    dependency_versions,
    hash_in_background,
    make_manifest,
    remember_source_hashes,
)
from mobius_genai.bundle.schema import validate_genai_config, validate_manifest
from mobius_genai.bundle.smoke_plan import record_smoke_test, run_smoke_phase
from mobius_genai.bundle.validate import TOKENIZER_CHOICES, has_tokenizer, validate_bundle
from mobius_genai.config import read_config_json
from mobius_genai.ep import EpCapabilities
from mobius_genai.errors import BundleError, ConfigError
from mobius_genai.quantize import Int4Options, Int4Report, quantize_int4
from mobius_genai.source import Source

#: --precision → model dtype. int4 keeps the dtype (--dtype or the EP's) for activations and
#: scales and quantizes the weights (MatMulNBits, or DequantizeLinear on onnx-standard).
PRECISIONS: dict[str, ir.DataType] = {
    "fp32": ir.DataType.FLOAT,
    "fp16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16,
}
QUANTIZED_PRECISIONS = ("int4",)

_SOURCE_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
_HUB_SNAPSHOT = re.compile(r"[0-9a-f]{40}")


def package(
    model: str | Path,
    ep: str | EpCapabilities = "default",
    output: str | Path | None = None,
    *,
    dtype: str | ir.DataType | None = None,
    precision: str | None = None,
    context_length: int | None = None,
    trace: bool = False,
    smoke_test: bool = True,
    force: bool = False,
    quiet: bool = False,
    revision: str | None = None,
    int4: Int4Options | None = None,
    prune_lm_head: bool = True,
) -> Path:
    """Build `model` (local folder or hub id) for `ep` and write a runnable bundle folder.

    `output` defaults to `./<model name>-<ep>-<precision>`; an existing non-empty folder is
    replaced only with `force`, and only once the new bundle is complete, validated and
    smoke-tested. `int4` holds the INT4 choices for `precision="int4"` (defaults otherwise).
    `prune_lm_head` (default) computes logits for the last position only, all that
    onnxruntime-genai reads; turn it off to keep every position's logits (e.g. to score prompts).
    Returns the bundle folder.
    """
    caps = resolve_ep(ep)
    build_dtype, precision = resolve_precision(caps, dtype, precision)
    if int4 is not None and precision != "int4":
        raise ConfigError(
            f"int4 options were given for precision {precision!r}; accepted: int4 options only "
            "with precision 'int4'"
        )
    int4_options = (int4 or Int4Options()) if precision == "int4" else None
    out = Path(output) if output is not None else default_output(model, caps, precision)
    try:
        with staged_output(out, force=force, protect=checkpoint_folder(model)) as staging:
            built = build(
                model,
                caps,
                build_dtype,
                trace_optimization=trace,
                context_length=context_length,
                revision=revision,
                progress=not quiet,
                prune_lm_head=prune_lm_head,
            )
            if built.source is not None:
                _require_tokenizer(built.source.path)  # before the long part: saving weights
                # the manifest hashes the weight files: overlap it with the conversion
                hash_in_background(sorted(built.source.path.glob("*.safetensors")))
            quantization = (
                quantize_int4(built["model"], int4_options, built.ep)
                if int4_options is not None
                else None
            )
            genai_config = write_bundle(
                built,
                staging,
                name=out.name,
                precision=precision,
                progress=not quiet,
                quantization=quantization,
            )
            for note in build_notes(built, genai_config):
                _say(f"note: {note}", quiet)
            layers, twin_layers = (
                built.config.num_hidden_layers,
                built.config.layers_of_every_kind(),
            )
            write_twin = _twin_writer(built, staging, precision, int4_options, prune_lm_head)
            # Release the graph and the checkpoint files it maps before the bundle is run.
            del built, quantization
            gc.collect()
            with _errors_name(out, staging):
                validate_bundle(staging, check_hashes=False)  # the manifest was just made
                if smoke_test:
                    record = run_smoke_phase(
                        staging,
                        caps,
                        precision=precision,
                        layers=layers,
                        twin_layers=twin_layers,
                        write_twin=write_twin,
                        say=lambda message: _say(message, quiet),
                    )
                    _say(record["note"], quiet)
                    record_smoke_test(staging, out.name, record)
    except BaseException:
        cancel_background_hashes()  # the manifest will not need them
        raise
    _say(f"bundle written to {out}", quiet)
    return out


def resolve_precision(
    caps: EpCapabilities, dtype: str | ir.DataType | None, precision: str | None
) -> tuple[ir.DataType, str]:
    """The model dtype and precision name from either argument; the EP's default otherwise.

    For int4 the dtype is that of activations and scales: `dtype` or the EP's default.
    """
    if precision is not None and precision not in (*PRECISIONS, *QUANTIZED_PRECISIONS):
        raise ConfigError(
            f"precision {precision!r} is not supported; accepted: "
            f"{sorted([*PRECISIONS, *QUANTIZED_PRECISIONS])}"
        )
    chosen = parse_dtype(dtype, caps) if dtype is not None else None
    if precision in QUANTIZED_PRECISIONS:
        return chosen or caps.default_dtype, precision
    if precision is not None:
        if chosen is not None and chosen != PRECISIONS[precision]:
            raise ConfigError(
                f"dtype {dtype!r} contradicts precision {precision!r}; accepted: one of them, "
                "or a matching pair"
            )
        return require_model_dtype(caps, PRECISIONS[precision]), precision
    chosen = chosen or caps.default_dtype
    return chosen, next(name for name, value in PRECISIONS.items() if value == chosen)


def default_output(model: str | Path, caps: EpCapabilities, precision: str) -> Path:
    """`./<model name>-<ep>-<precision>`, e.g. ./Qwen2.5-7B-cuda-fp16."""
    return Path.cwd() / bundle_name(model, caps.name, precision)


def bundle_name(model: str | Path, ep: str, precision: str) -> str:
    """`<model name>-<ep>-<precision>`: a local folder's name or a hub id's last part."""
    local = Path(model).expanduser()
    name = local.resolve().name if local.is_dir() else str(model).rstrip("/").rsplit("/", 1)[-1]
    return f"{name}-{ep}-{precision}"


def write_bundle(
    built: ModelPackage,
    folder: Path,
    *,
    name: str,
    precision: str,
    progress: bool = True,
    quantization: Int4Report | None = None,
) -> dict[str, Any]:
    """Write every file of the bundle of `built` into `folder`; returns the genai_config.

    `name` is the bundle's final folder name (the card's run instructions use it);
    `quantization` is the report of the INT4 stage, recorded in the manifest and the card.
    """
    source = built.source
    if source is None:
        raise BundleError(
            "a bundle needs the checkpoint's files (tokenizer, generation config); accepted: "
            "a ModelPackage from build(), not build_from_module()"
        )
    save_with_digest(built, folder, progress=progress)  # hashes model.onnx.data as it writes
    graph = GraphInfo.from_file(folder / MODEL_FILENAME)
    genai_config = make_genai_config(
        built.config,
        built.ep,
        graph,
        context_length=built.context_length,
        generation=read_generation_config(source.path),
        filename=MODEL_FILENAME,
    )
    validate_genai_config(genai_config)
    write_json(folder / CONFIG_FILENAME, genai_config)
    copied = copy_tokenizer_files(source.path, folder)
    build_info = {
        "execution_provider": built.ep.name,
        "dtype": built.dtype.short_name(),
        "precision": precision,
        "context_length": built.context_length,
        "model_type": built.config.model_type,
        "genai_model_type": genai_config["model"]["type"],
        "past_present_share_buffer": graph.has_gqa,
        "optimization": {
            rule: count for rule, count in sorted(built.optimization_report.items()) if count
        },
    }
    if quantization is not None:
        build_info["quantization"] = quantization.summary()
    revision = source_revision(source)
    card = render_card(
        genai_config,
        folder=name,
        model_id=source.model_id,
        revision=revision,
        build=build_info,
        tool_version=dependency_versions()["mobius-genai"] or "0+unknown",
        files=sorted({*bundle_files(folder), CARD_FILENAME, MANIFEST_FILENAME}),
    )
    (folder / CARD_FILENAME).write_text(card, encoding="utf-8")
    manifest = make_manifest(
        folder,
        model_id=source.model_id,
        revision=revision,
        source_root=source.path,
        source_files=_source_files(source.path, copied),
        build=build_info,
    )
    validate_manifest(manifest)
    write_json(folder / MANIFEST_FILENAME, manifest)
    return genai_config


def _twin_writer(
    built: ModelPackage,
    staging: Path,
    precision: str,
    int4: Int4Options | None,
    prune_lm_head: bool,
) -> Callable[[Path, int], None]:
    """`write_twin(folder, layers)` for the smoke test: the bundle of `built`'s checkpoint, EP,
    dtype, precision and context length cut to its first `layers` layers, built, written and
    validated by the same functions as the bundle in `staging`. Holds no reference to `built`.
    """
    source, caps, dtype, context = built.source, built.ep, built.dtype, built.context_length

    def write_twin(folder: Path, layers: int) -> None:
        manifest = read_json(staging / MANIFEST_FILENAME, BundleError, MANIFEST_FILENAME)
        remember_source_hashes(manifest, source.path)
        twin = build(
            source.path,
            caps,
            dtype,
            context_length=context,
            progress=False,
            prune_lm_head=prune_lm_head,
            num_layers=layers,
        )
        quantization = quantize_int4(twin["model"], int4, twin.ep) if int4 is not None else None
        folder.mkdir()
        write_bundle(
            twin,
            folder,
            name=folder.name,
            precision=precision,
            progress=False,
            quantization=quantization,
        )
        del twin, quantization
        gc.collect()
        validate_bundle(folder, check_hashes=False)

    return write_twin


def _require_tokenizer(checkpoint: Path) -> None:
    if not has_tokenizer(checkpoint):
        raise BundleError(
            f"checkpoint {checkpoint}: no tokenizer (none of {list(TOKENIZER_CHOICES)}); "
            "accepted: a checkpoint with its tokenizer files, which onnxruntime-genai needs"
        )


@contextlib.contextmanager
def _errors_name(out: Path, staging: Path) -> Iterator[None]:
    """BundleErrors about the staging folder name `out`, the folder the user asked for."""
    try:
        yield
    except BundleError as error:
        raise BundleError(str(error).replace(str(staging), str(out))) from error


def build_notes(built: ModelPackage, genai_config: Mapping[str, Any]) -> list[str]:
    """What a user should know about a bundle that was built as asked but not as they may
    expect: custom code in the checkpoint that was not run, a context beyond the model's
    trained positions, graph capture that could not be turned on."""
    notes = []
    if built.source is not None:
        custom = read_config_json(built.source.path).get("auto_map")
        if custom:
            names = sorted(custom) if isinstance(custom, dict) else [str(custom)]
            notes.append(
                f"config.json names custom code (auto_map: {', '.join(names)}); it was "
                f"not run: the bundle uses mobius-genai's own {built.config.model_type!r} graph"
            )
    trained = built.config.max_position_embeddings
    if built.context_length > trained:
        notes.append(
            f"context length {built.context_length} is above max_position_embeddings "
            f"{trained}: positions past it are outside what the model was trained on"
        )
    sharing = genai_config.get("search", {}).get("past_present_share_buffer", False)
    if built.ep.enable_graph_capture and not sharing:
        notes.append(
            f"graph capture is off: it needs GroupQueryAttention's shared KV buffer, which "
            f"{built.ep.name} uses for "
            + ", ".join(d.short_name() for d in sorted(built.ep.gqa_dtypes, key=lambda d: d.value))
            + f" models, not {built.dtype.short_name()}"
        )
    return notes


def _source_files(root: Path, copied: list[str]) -> list[str]:
    names = {name for name in _SOURCE_FILES if (root / name).is_file()}
    names.update(path.name for path in root.glob("*.safetensors"))
    names.update(copied)
    return sorted(names)


def source_revision(source: Source) -> str | None:
    """The requested revision, else the commit of a hub snapshot folder."""
    if source.revision:
        return source.revision
    path = source.path
    if path.parent.name == "snapshots" and _HUB_SNAPSHOT.fullmatch(path.name):
        return path.name
    return None


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"mobius-genai: {message}", file=sys.stderr)
