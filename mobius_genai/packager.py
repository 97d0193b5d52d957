"""`package()`: from a checkpoint to a checked bundle folder that `og.Model(folder)` runs.

build → tokenizer files (token ids checked) → save graph + weights → genai_config.json →
README.md → manifest → validate → smoke test (of the bundle, or of a twin with fewer layers:
`smoke_plan`), whose record joins the card and the manifest, all inside a temporary folder that
becomes OUT only at the very end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from mobius_genai._json import read_json, write_json
from mobius_genai.build import ModelPackage, build
from mobius_genai.bundle.adapters import read_adapters, write_adapters
from mobius_genai.bundle.bos import required_bos
from mobius_genai.bundle.card import CARD_FILENAME, render_card
from mobius_genai.bundle.digest import save_with_digest
from mobius_genai.bundle.genai_config import (
    CONFIG_FILENAME,
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
from mobius_genai.bundle.og_support import og_limits
from mobius_genai.bundle.output_folder import checkpoint_folder, staged_output
from mobius_genai.bundle.schema import validate_genai_config, validate_manifest
from mobius_genai.bundle.tokenizer_files import copy_tokenizer_files
from mobius_genai.bundle.validate import (
    TOKENIZER_CHOICES,
    check_tokenizer,
    has_tokenizer,
    validate_bundle,
)
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.checkpoint.peft import PeftAdapter
from mobius_genai.checkpoint.source import Source, model_name
from mobius_genai.config import read_config_json
from mobius_genai.ep import EpCapabilities
from mobius_genai.errors import BundleError
from mobius_genai.kinds.base import WrittenGraphs
from mobius_genai.progress import phase
from mobius_genai.quantize import Int4Options, Int4Report
from mobius_genai.quantize.package_weights import quantize_package, why_float
from mobius_genai.quantize.stored_weights import PrequantizedReport
from mobius_genai.runtime.smoke_plan import record_smoke_test, run_smoke_phase
from mobius_genai.target import Target, precision_of, target_or_choices

_SOURCE_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
_HUB_SNAPSHOT = re.compile(r"[0-9a-f]{40}")


def package(
    model: str | Path,
    execution_provider: str | EpCapabilities = "default",
    output: str | Path | None = None,
    *,
    dtype: str | ir.DataType | None = None,
    precision: str | None = None,
    int4: Int4Options | None = None,
    context_length: int | None = None,
    target: Target | None = None,
    trace_optimization: bool = False,
    smoke_test: bool = True,
    force: bool = False,
    quiet: bool = False,
    revision: str | None = None,
    prune_lm_head: bool = False,
    adapters: Mapping[str, str | Path] | None = None,
) -> Path:
    """Build `model` (local folder or hub id) for an EP and write a runnable bundle folder.

    `execution_provider`, `dtype`, `precision` (fp32, fp16, bf16 or int4), `int4` (its options)
    and `context_length` are resolved into one `Target` with what the source stores
    (`resolve_target`; a GGUF or GPTQ/AWQ source's 4-bit integers make it int4 unless a float
    precision is asked, which dequantizes them); pass `target` instead when it is resolved
    already, with the same `stored`. `output` defaults to `./<model name>-<ep>-<precision>`;
    an existing non-empty folder is replaced only with `force`, and only once the new bundle is
    complete, validated and smoke-tested. `prune_lm_head` computes logits for each sequence's
    last position only: a faster prefill that og.Generator's sampling accepts, but og.Engine,
    n-gram speculative decoding and `get_output("logits")` need every position (`og_support`
    names what a bundle gives up; its card and manifest say so). `adapters` (name → PEFT LoRA
    folder) gives the graph LoRA inputs for their target modules and writes each as
    `adapters/<name>.onnx_adapter` (bundle/adapters.py), checked before the build. Returns the
    bundle folder.
    """
    peft = read_adapters(adapters or {})
    target = target_or_choices(
        target,
        execution_provider,
        "package",
        stored=stored_bits(model, revision),
        dtype=dtype,
        precision=precision,
        int4=int4,
        context_length=context_length,
    )
    out = Path(output) if output is not None else default_output(model, target.ep, target.precision)
    try:
        with staged_output(
            out,
            force=force,
            protect=checkpoint_folder(model),
            say=lambda message: _say(message, quiet),
        ) as staging:
            written = _write_staged(
                model,
                target,
                staging,
                out.name,
                trace_optimization=trace_optimization,
                revision=revision,
                quiet=quiet,
                prune_lm_head=prune_lm_head,
                adapters=peft,
            )
            gc.collect()  # the graph and the checkpoint files it mapped, before the bundle runs
            with _errors_name(out, staging):
                _check_staged(staging, out.name, target, written, smoke_test, quiet)
    except BaseException:
        cancel_background_hashes()  # the manifest will not need them
        raise
    return out


def _check_staged(
    staging: Path, name: str, target: Target, written: tuple, smoke_test: bool, quiet: bool
) -> None:
    """Validate the staged bundle and, with `smoke_test`, have onnxruntime-genai run it (or its
    twin with fewer layers); `written` is what `_write_staged` returned."""
    precision, layers, twin_layers, write_twin, vision_layers = written
    with phase("validating the bundle", not quiet):
        validate_bundle(staging, check_hashes=False)  # the manifest was just made
    if not smoke_test:
        return
    with phase("smoke test", not quiet):
        record = run_smoke_phase(
            staging,
            target.ep,
            precision=precision,
            layers=layers,
            twin_layers=twin_layers,
            write_twin=write_twin,
            say=lambda message: _say(message, quiet),
            vision_layers=vision_layers,
        )
    _say(record["note"], quiet)
    record_smoke_test(staging, name, record)


def _write_staged(
    model: str | Path,
    target: Target,
    staging: Path,
    name: str,
    *,
    trace_optimization: bool,
    revision: str | None,
    quiet: bool,
    prune_lm_head: bool,
    adapters: Mapping[str, PeftAdapter],
) -> tuple[str, int, int, Callable[[Path, int], None], tuple[int, int] | None]:
    """Build `model` for `target` and write its bundle into `staging`; returns the precision
    written, the layer count, the layers a smoke-test twin needs, its writer and, for a
    vision-language model, the vision layers of the twin and of the model. Nothing of the
    built graph outlives the call (the smoke test runs the bundle next)."""
    built = build(
        model,
        target=target,
        trace_optimization=trace_optimization,
        revision=revision,
        progress=not quiet,
        prune_lm_head=prune_lm_head,
        lora_targets=sorted({t for adapter in adapters.values() for t in adapter.targets}),
    )
    if built.source is not None:
        _require_tokenizer(built.source.path)  # before the long part: saving weights
        # the manifest hashes the weight files: overlap it with the conversion
        hash_in_background(sorted(built.source.path.glob("*.safetensors")))
    quantizes = target.int4_plan.options is not None or built.prequantized is not None
    with phase(_int4_phase(target, built), not quiet and quantizes):
        weights = quantize_package(built, target)
    precision = weights.precision
    genai_config = write_bundle(
        built,
        staging,
        name=name,
        precision=precision,
        progress=not quiet,
        quantization=weights.int4,
        prequantized=weights.prequantized,
        adapters=adapters,
    )
    for note in build_notes(built, genai_config, target, weights.prequantized):
        _say(f"note: {note}", quiet)
    config = built.config
    write_twin = _twin_writer(built, staging, target, prune_lm_head)
    return (
        precision,
        config.num_hidden_layers,
        config.layers_of_every_kind(),
        write_twin,
        built.kind.twin_layers(built),
    )


def _int4_phase(target: Target, built: ModelPackage) -> str:
    """What `quantize_package` does before saving, which quantizes the weights as it writes
    them."""
    options = target.int4_plan.options
    if options is not None and options.recipe.calibrate:
        return "calibrating int4 (activations of random token ids)"
    if options is None and built.prequantized is not None:
        return "placing the stored integers"
    return "planning int4"


def default_output(model: str | Path, caps: EpCapabilities, precision: str) -> Path:
    """`./<model name>-<ep>-<precision>`, e.g. ./Qwen2.5-7B-cuda-fp16."""
    return Path.cwd() / bundle_name(model, caps.name, precision)


def bundle_name(model: str | Path, ep: str, precision: str) -> str:
    """`<model name>-<ep>-<precision>`: a local folder's name, a GGUF file's stem or a hub id's
    last part."""
    return f"{model_name(model)}-{ep}-{precision}"


def write_bundle(
    built: ModelPackage,
    folder: Path,
    *,
    name: str,
    precision: str,
    progress: bool = True,
    quantization: Int4Report | None = None,
    prequantized: PrequantizedReport | None = None,
    adapters: Mapping[str, PeftAdapter] | None = None,
) -> dict[str, Any]:
    """Write every file of the bundle of `built` into `folder`; returns the genai_config.

    `name` is the bundle's final folder name (the card's run instructions use it);
    `quantization` is the report of the INT4 stage, `prequantized` that of a pre-quantized
    source's weights, both recorded in the manifest and the card; `adapters` are written beside
    the graph (`adapters/<name>.onnx_adapter`) when it has LoRA inputs.
    """
    source = built.source
    if source is None:
        raise BundleError(
            "a bundle needs the checkpoint's files (tokenizer, generation config); accepted: "
            "a ModelPackage from build(), not build_from_module()"
        )
    copied = copy_tokenizer_files(source.path, folder)
    _require_token_ids(folder, built.config.vocab_size)  # before the long part: saving weights
    # hashes model.onnx.data as it writes; int4 weights are quantized then, as they are written
    action = "saving" if quantization is None else "quantizing and saving"
    save_with_digest(built, folder, progress=progress, action=action)
    filename = built.filename(built.decoder_key)
    graph = GraphInfo.from_file(folder / filename)
    written = WrittenGraphs(folder, graph, read_generation_config(source.path))
    genai_config = built.kind.genai_config(built, written)
    for file_name, document in built.kind.bundle_files(source.path, built).items():
        write_json(folder / file_name, document)
    validate_genai_config(genai_config)
    write_json(folder / CONFIG_FILENAME, genai_config)
    build_info = {
        "execution_provider": built.ep.name,
        "dtype": precision_of(built.dtype),
        "precision": precision,
        "context_length": built.context_length,
        "model_type": built.config.model_type,
        "genai_model_type": genai_config["model"]["type"],
        "past_present_share_buffer": graph.shares_kv_buffer,
        "og_limits": og_limits(genai_config, graph),
        "optimization": {
            rule: count for rule, count in sorted(built.optimization_report.items()) if count
        },
    }
    if built.not_built is not None:
        build_info["not_built"] = built.not_built
    if quantization is not None:
        build_info["quantization"] = quantization.summary()
    if prequantized is not None:
        build_info["prequantized"] = prequantized.summary()
    lora = write_adapters(folder / filename, adapters or {}, built.family)
    if lora is not None:
        build_info["lora"] = lora
    _write_card_and_manifest(folder, name, genai_config, source, copied, build_info, progress)
    return genai_config


def _write_card_and_manifest(
    folder: Path,
    name: str,
    genai_config: Mapping[str, Any],
    source: Source,
    copied: list[str],
    build_info: Mapping[str, Any],
    progress: bool,
) -> None:
    """README.md and mobius_manifest.json of the bundle in `folder` (the last files written:
    the manifest hashes every other one)."""
    revision = source_revision(source)
    card = render_card(
        genai_config,
        folder=name,
        model_id=source.model_id,
        revision=revision,
        build=build_info,
        tool_version=dependency_versions()["mobius-genai"] or "0+unknown",
        files=sorted({*bundle_files(folder), CARD_FILENAME, MANIFEST_FILENAME}),
        bos_token_id=required_bos(folder),
    )
    (folder / CARD_FILENAME).write_text(card, encoding="utf-8")
    with phase("checksums", progress):
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


def _twin_writer(
    built: ModelPackage,
    staging: Path,
    target: Target,
    prune_lm_head: bool,
) -> Callable[[Path, int], None]:
    """`write_twin(folder, layers)` for the smoke test: the bundle of `built`'s checkpoint for
    the same target and context length, cut to its first `layers` layers, built, written and
    validated by the same functions as the bundle in `staging`. Holds no reference to `built`.
    """
    source = built.source
    twin_target = dataclasses.replace(target, context_length=built.context_length)

    def write_twin(folder: Path, layers: int) -> None:
        manifest = read_json(staging / MANIFEST_FILENAME, BundleError, MANIFEST_FILENAME)
        remember_source_hashes(manifest, source.path)
        twin = build(
            source.weights or source.path,
            target=twin_target,
            progress=False,
            prune_lm_head=prune_lm_head,
            num_layers=layers,
        )
        weights = quantize_package(twin, target)
        folder.mkdir()
        write_bundle(
            twin,
            folder,
            name=folder.name,
            precision=weights.precision,
            progress=False,
            quantization=weights.int4,
            prequantized=weights.prequantized,
        )
        del twin, weights
        gc.collect()
        validate_bundle(folder, check_hashes=False)

    return write_twin


def _require_tokenizer(checkpoint: Path) -> None:
    if not has_tokenizer(checkpoint):
        raise BundleError(
            f"checkpoint {checkpoint}: no tokenizer (none of {list(TOKENIZER_CHOICES)}); "
            "accepted: a checkpoint with its tokenizer files, which onnxruntime-genai needs"
        )


def _require_token_ids(folder: Path, vocab: int) -> None:
    problems = check_tokenizer(folder, vocab, "config.json's vocab_size")
    if problems:
        raise BundleError("; ".join(problems))


@contextlib.contextmanager
def _errors_name(out: Path, staging: Path) -> Iterator[None]:
    """BundleErrors about the staging folder name `out`, the folder the user asked for."""
    try:
        yield
    except BundleError as error:
        raise BundleError(str(error).replace(str(staging), str(out))) from error


def build_notes(
    built: ModelPackage,
    genai_config: Mapping[str, Any],
    target: Target | None = None,
    prequantized: PrequantizedReport | None = None,
) -> list[str]:
    """What a user should know about a bundle that was built as asked but not as they may
    expect: custom code in the checkpoint that was not run, a context beyond the model's
    trained positions, graph capture that could not be turned on, a pre-quantized source whose
    integers were kept whatever the precision asked."""
    notes = []
    if built.not_built is not None:
        notes.append(f"{built.config.model_type} checkpoint; not built: {built.not_built}")
    if prequantized is not None and target is not None:
        notes.append(_prequantized_note(prequantized, target))
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
    if built.ep.enable_graph_capture and not built.ep.captures_graph(share_buffer=sharing):
        notes.append(
            f"graph capture is off: it needs GroupQueryAttention's shared KV buffer, which "
            f"{built.ep.name} uses for "
            + ", ".join(precision_of(d) for d in sorted(built.ep.gqa_dtypes, key=lambda d: d.value))
            + f" models, not {precision_of(built.dtype)}"
        )
    return notes


def _prequantized_note(report: PrequantizedReport, target: Target) -> str:
    requantized = sum(
        count
        for outcomes in report.tensors.values()
        for outcome, count in outcomes.items()
        if outcome.startswith("re-quantized")
    )
    if target.dequantize_stored:
        note = (
            f"the checkpoint is pre-quantized ({report.scheme}): its weights are dequantized "
            f"to {precision_of(target.dtype)} ({why_float(target)})"
        )
        if requantized:
            return f"{note}; {requantized} re-quantized with the int4 options asked"
        return f"{note}; the bundle is float"
    kept = (
        f"{report.weights} weights kept as stored in MatMulNBits (no second rounding)"
        if report.weights
        else "no weight could be kept in MatMulNBits"
    )
    note = f"the checkpoint is pre-quantized ({report.scheme}): {kept}"
    if report.dequantized:
        note += f"; dequantized to {precision_of(target.dtype)}: {len(report.dequantized)}"
    if requantized:
        note += f"; {requantized} it could not keep re-quantized with the int4 options asked"
    if target.precision != "int4":
        note += (
            f"; precision {target.precision}: its integers are not 4-bit; the activations and "
            f"the weights the checkpoint keeps in float are {precision_of(target.dtype)}"
        )
    elif target.int4 is not None and _layout(target.int4) != _layout(Int4Options()):
        note += "; the kept weights' block size and zero points are the checkpoint's"
    return note


def _layout(options: Int4Options) -> tuple[int, bool]:
    return options.block_size, options.symmetric


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
