"""`build()` and `build_from_module()`: from a checkpoint (or a module) to optimized ONNX models."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir
from onnx_ir.serde import SerdeError

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY
from mobius_genai.checkpoint.experts import expert_tensors
from mobius_genai.checkpoint.gguf import GgufCheckpoint, find_gguf, gguf_tensors, open_gguf
from mobius_genai.checkpoint.grouped import grouped_tensors
from mobius_genai.checkpoint.prequantized import (
    PrequantizedTensor,
    QuantizationScheme,
    prequantized_tensors,
)
from mobius_genai.checkpoint.prequantized.gptq import read_quantization_config
from mobius_genai.checkpoint.prequantized.mxfp4 import is_mxfp4
from mobius_genai.checkpoint.source import Source, config_file, local_source, resolve_source
from mobius_genai.checkpoint.weights import Checkpoint, checkpoint_tensors
from mobius_genai.config import ArchitectureConfig, read_config_json
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.context import build_context
from mobius_genai.errors import MobiusError, UnsupportedModelError
from mobius_genai.kinds.base import DecoderWeights, KindInput, ModelKind
from mobius_genai.kinds.table import TEXT_DECODER, kind_of
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FamilyAdapter
from mobius_genai.optimize import OptimizationReport, optimize_model
from mobius_genai.progress import Progress, phase
from mobius_genai.target import Target, resolve_target, target_or_choices
from mobius_genai.tasks.causal_lm import CausalLMTask

MODEL_FILENAME = "model.onnx"
#: Initializers above this many bytes are saved to the external data file (onnx-ir's default).
EXTERNAL_THRESHOLD = 256


@dataclasses.dataclass
class ModelPackage(Mapping[str, ir.Model]):
    """The ONNX models built from one checkpoint for one `Target`, by package key ("model" for
    a text decoder; each kind names its graphs and their roles: `kinds/`). `config` is the text
    decoder's, `kind_config` the kind's config of the whole checkpoint (None for a decoder)."""

    models: dict[str, ir.Model]
    roles: dict[str, str]
    """Package key → the model's role (`optimize.gates.ROLES`: the role gates fusions)."""
    config: ArchitectureConfig
    target: Target
    context_length: int
    source: Source | None = None
    family: Any = None
    """The kind's row (a `FamilyAdapter`, a `VisionLanguageFamily`, ...)."""
    reports: dict[str, OptimizationReport] = dataclasses.field(default_factory=dict)
    kind: ModelKind = TEXT_DECODER
    kind_config: Any = None
    prequantized: str | None = None
    """How the source stored its quantized weights (e.g. "GPTQ 4-bit, group size 128"), when
    it did: those weights carry their stored integers (`PrequantizedTensor`)."""
    float_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    """For a pre-quantized source: the stored kind (GGUF type, safetensors dtype) → number of
    the checkpoint's tensors read as float (dequantized or cast), for the manifest."""
    not_built: str | None = None
    """What of a multimodal checkpoint a text-only build left out (`TextOnly.not_built`)."""

    @property
    def ep(self) -> EpCapabilities:
        return self.target.ep

    @property
    def dtype(self) -> ir.DataType:
        return self.target.dtype

    @property
    def decoder_key(self) -> str:
        """The package key of the text decoder ("model", or "decoder" beside other graphs)."""
        return "model" if "model" in self.models else "decoder"

    def filename(self, key: str) -> str:
        """The file the graph of package key `key` is saved as (model.onnx for "model")."""
        return MODEL_FILENAME if key == "model" else f"{key}.onnx"

    def __getitem__(self, key: str) -> ir.Model:
        return self.models[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def optimization_report(self) -> dict[str, int]:
        """Rule name → number of matches, over every model of the package."""
        totals: dict[str, int] = {}
        for report in self.reports.values():
            for rule, count in report.matches.items():
                totals[rule] = totals.get(rule, 0) + count
        return totals

    def save(
        self, directory: str | Path, progress: bool = True, action: str = "saving"
    ) -> list[Path]:
        """Write each model as `<key>.onnx` (the decoder as model.onnx) with external data.

        Weights are read from the checkpoint one tensor at a time while writing (and quantized
        then, if a quantization pass left them lazy: `action` names the phase, e.g.
        "quantizing and saving").
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for index, (key, model) in enumerate(self.models.items(), 1):
            filename = self.filename(key)
            path = directory / filename
            tensors = [
                value
                for graph in model.graphs()
                for value in graph.initializers.values()
                if value.const_value is not None and value.const_value.nbytes > EXTERNAL_THRESHOLD
            ]
            label = f"{action} {filename}"
            if len(self.models) > 1:
                label += f" (graph {index} of {len(self.models)}, {self.roles[key]})"
            with (
                Progress(label, total=len(tensors), enabled=progress) as bar,
                _quiet_weightless_save(),
                _tensor_errors_unwrapped(),
            ):
                ir.save(
                    model,
                    path,
                    external_data=f"{filename}.data",
                    size_threshold_bytes=EXTERNAL_THRESHOLD,
                    callback=lambda tensor, info: bar.advance(),
                )
            written.append(path)
        return written


@contextlib.contextmanager
def _tensor_errors_unwrapped() -> Iterator[None]:
    """Raise the MobiusError a lazy tensor raised while onnx-ir serialized it (a weight with
    NaN values), not the SerdeError layers onnx-ir wraps it in."""
    try:
        yield
    except SerdeError as error:
        cause: BaseException | None = error
        while isinstance(cause, SerdeError):
            cause = cause.__cause__
        if isinstance(cause, MobiusError):
            raise cause from None
        raise


class _WeightlessInitializers(logging.Filter):
    """Drops onnx-ir's warning per initializer saved without data (graph-only builds)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "does not have a constant value set" not in str(record.msg)


@contextlib.contextmanager
def _quiet_weightless_save() -> Iterator[None]:
    serde_logger = logging.getLogger("onnx_ir.serde")
    record_filter = _WeightlessInitializers()
    serde_logger.addFilter(record_filter)
    try:
        yield
    finally:
        serde_logger.removeFilter(record_filter)


def build_from_module(
    module: CausalLMModel,
    config: ArchitectureConfig,
    execution_provider: str | EpCapabilities = "default",
    dtype: str | ir.DataType | None = None,
    trace_optimization: bool = False,
    *,
    task: CausalLMTask | None = None,
    optimize: bool = True,
    prune_lm_head: bool = False,
) -> ModelPackage:
    """Build and optimize the graph of a module built from `config` (no weights attached).

    The module must be constructed inside the same build context, because components read
    the dtype from it; pass a factory-built module or use `build()` for checkpoints. `dtype`
    None means the EP's default dtype.
    """
    target = resolve_target(execution_provider, dtype=dtype)
    with build_context(target.ep, target.dtype):
        model = (task or CausalLMTask()).build(module, config)
    package = ModelPackage(
        models={"model": model},
        roles={"model": "decoder"},
        config=config,
        target=target,
        context_length=int(model.metadata_props[CONTEXT_LENGTH_KEY]),
    )
    if optimize:
        _optimize(package, trace_optimization, prune_lm_head)
    return package


def build(
    model: str | Path,
    execution_provider: str | EpCapabilities = "default",
    dtype: str | ir.DataType | None = None,
    load_weights: bool = True,
    trace_optimization: bool = False,
    *,
    context_length: int | None = None,
    revision: str | None = None,
    progress: bool = True,
    prune_lm_head: bool = False,
    target: Target | None = None,
    num_layers: int | None = None,
) -> ModelPackage:
    """Build the ONNX models of a checkpoint (local folder or hub id) for one EP.

    `dtype` None means the EP's default dtype (what `mobius-genai build --ep EP` builds).
    `target` is an already resolved `resolve_target(...)`, in place of `execution_provider`,
    `dtype` and `context_length`. With `load_weights=False` only config.json is read and the
    graph carries no weights, which makes even a 70B configuration a matter of seconds. With
    `prune_lm_head` the decoder computes logits for the last position only (what
    og.Generator samples from; `package --prune-lm-head`, see bundle/og_support.py). `progress` says each phase on stderr
    (`progress.phase`) and shows huggingface_hub's download bars for a hub id. `num_layers`
    builds the model's first layers only (`ArchitectureConfig.first_layers`; the smoke test's
    small twin), and a vision-language model's vision tower its first layers of every kind too.
    """
    target = target_or_choices(
        target, execution_provider, "build", dtype=dtype, context_length=context_length
    )
    with phase("reading the checkpoint", progress):
        source, raw, checkpoint = _open(model, revision, progress, load_weights)
    if load_weights and checkpoint is None:
        checkpoint = Checkpoint(source.path)
    kind = kind_of(raw.get("model_type", ""))
    given = KindInput(
        raw=raw,
        source=source,
        checkpoint=checkpoint,
        target=target,
        num_layers=num_layers,
        read_decoder=functools.partial(_decoder_weights, raw, checkpoint, num_layers),
    )
    with phase("building the graph", progress), build_context(target.ep, target.dtype):
        built = kind.build(given)
    package = ModelPackage(
        models={key: model for key, (_, model) in built.graphs.items()},
        roles={key: role for key, (role, _) in built.graphs.items()},
        config=built.config,
        target=target,
        context_length=built.context_length,
        source=source,
        family=built.family,
        kind=kind,
        kind_config=built.kind_config,
        prequantized=built.prequantized,
        float_kinds=built.float_kinds if built.prequantized else {},
        not_built=built.not_built,
    )
    _optimize(package, trace_optimization, prune_lm_head, progress)
    return package


def _decoder_weights(
    raw: dict,
    checkpoint: Checkpoint | GgufCheckpoint | None,
    num_layers: int | None,
    module: CausalLMModel,
    family: FamilyAdapter,
) -> DecoderWeights:
    """`KindInput.read_decoder`: the tensors of a decoder module, and how the source stored
    them (GGUF blocks, GPTQ/AWQ, MXFP4 experts); none for a graph-only build."""
    mxfp4_experts = _mxfp4_experts(raw, family)
    scheme = None if mxfp4_experts else read_quantization_config(raw)
    described = checkpoint if isinstance(checkpoint, GgufCheckpoint) else scheme
    prequantized = None if described is None else described.describe()
    if checkpoint is None:
        return DecoderWeights({}, {}, prequantized)
    tensors, float_kinds = _tensors(
        module, checkpoint, family, scheme, num_layers, mxfp4_experts=mxfp4_experts
    )
    return DecoderWeights(tensors, float_kinds, prequantized)


def stored_bits(model: str | Path, revision: str | None = None) -> frozenset[int]:
    """The bit widths of the integers `model` stores that the bundle can keep as they are (a
    GGUF's block types, config.json's GPTQ / AWQ quantization_config); empty for float weights.

    Read before the build (a GGUF's tensor list, or config.json alone), for `resolve_target`:
    what the source stores decides the precision that names the bundle.
    """
    gguf_file = find_gguf(model)
    if gguf_file is not None:
        stat = gguf_file.stat()
        return _gguf_stored_bits(gguf_file, stat.st_mtime_ns, stat.st_size)
    raw = read_config_json(config_file(model, revision))
    if not kind_of(raw.get("model_type", "")).keeps_stored_integers or is_mxfp4(raw):
        return frozenset()  # read as float: MXFP4 experts, vision-language weights
    scheme = read_quantization_config(raw)
    return frozenset() if scheme is None else frozenset({scheme.bits})


@functools.lru_cache(maxsize=8)
def _gguf_stored_bits(path: Path, mtime_ns: int, size: int) -> frozenset[int]:
    """`stored_bits` of a GGUF file, read once per version of the file (the CLI and package()
    both ask): opening one parses every metadata field, seconds for a 49k-token vocabulary."""
    return GgufCheckpoint(path).stored_bits()


def _open(
    model: str | Path, revision: str | None, progress: bool, load_weights: bool
) -> tuple[Source, dict, GgufCheckpoint | None]:
    """The source, its config.json and, for a GGUF file, its checkpoint (which holds the
    config and tokenizer too)."""
    if not load_weights:
        return (*_config_only_source(model, revision, progress), None)
    gguf_file = find_gguf(model)
    if gguf_file is not None:
        return open_gguf(gguf_file)
    source = resolve_source(model, revision, progress=progress)
    return source, read_config_json(source.path), None


def _tensors(
    module: CausalLMModel,
    checkpoint: Checkpoint | GgufCheckpoint,
    family: FamilyAdapter,
    scheme: QuantizationScheme | None,
    skip_layers_from: int | None = None,
    *,
    mxfp4_experts: bool = False,
) -> tuple[dict[str, ir.TensorProtocol], dict[str, int]]:
    """A lazy tensor for each parameter of `module`, and the stored kinds of the checkpoint
    tensors read as float (`ModelPackage.float_kinds`): stacked experts and weights stored as
    integers (GGUF blocks, GPTQ/AWQ) by their own readers, the rest by `checkpoint_tensors`,
    which checks that every checkpoint tensor is read by one of them, or belongs to a layer
    from `skip_layers_from` on (a build of the first layers only, the smoke test's twin; a
    name's first number is its layer)."""
    parameters = dict(module.named_parameters())
    quantized, read = _stored_integers(parameters, checkpoint, scheme, family)
    experts, expert_read = (
        ({}, [])
        if family.experts is None
        else expert_tensors(
            parameters, checkpoint, family.experts, family.checkpoint_name, mxfp4_experts
        )
    )
    grouped, grouped_read = grouped_tensors(
        {name: value for name, value in parameters.items() if name not in quantized},
        checkpoint,
        module.config,
        family.grouped_weights,
        family.checkpoint_name,
    )
    special = {**quantized, **experts, **grouped}
    elsewhere = {*read, *expert_read, *grouped_read, *_layers_from(checkpoint, skip_layers_from)}
    tensors = checkpoint_tensors(
        {name: value for name, value in parameters.items() if name not in special},
        checkpoint,
        module.config,
        family.checkpoint_name,
        family.preprocess_weight,
        family.preprocessed,
        unused=family.unused_weights,
        tied=module.tied_weights(),
        read_elsewhere=sorted(elsewhere),
    )
    float_kinds = Counter(checkpoint.kind(name) for name in checkpoint if name not in elsewhere)
    return {**tensors, **special}, dict(sorted(float_kinds.items()))


def _mxfp4_experts(raw: dict, family: FamilyAdapter) -> bool:
    """Whether config.json says the experts are MXFP4 blocks (gpt_oss), which only a MoE
    family's experts can be."""
    if not is_mxfp4(raw):
        return False
    if family.experts is None:
        raise UnsupportedModelError(
            f"config.json: quantization_config.quant_method is 'mxfp4' for model_type "
            f"{family.model_type!r}; MXFP4 is read for the experts of MoE families only"
        )
    return True


def _stored_integers(
    parameters: Mapping[str, ir.Value],
    checkpoint: Checkpoint | GgufCheckpoint,
    scheme: QuantizationScheme | None,
    family: FamilyAdapter,
) -> tuple[dict[str, PrequantizedTensor], list[str]]:
    """The weights the source stores as integers MatMulNBits holds (GGUF blocks, GPTQ/AWQ),
    and the checkpoint tensors they read."""
    if isinstance(checkpoint, GgufCheckpoint):
        return gguf_tensors(parameters, checkpoint, family.checkpoint_name)
    if scheme is None:
        return {}, []
    return prequantized_tensors(parameters, checkpoint, scheme, family.checkpoint_name)


def _layers_from(checkpoint: Checkpoint, first: int | None) -> list[str]:
    """The checkpoint tensors of layers `first` and later (none when `first` is None)."""
    if first is None:
        return []
    numbered = ((name, re.search(r"\.(\d+)\.", name)) for name in checkpoint)
    return [name for name, match in numbered if match and int(match.group(1)) >= first]


def _config_only_source(
    model: str | Path, revision: str | None, progress: bool
) -> tuple[Source, dict]:
    path = Path(model).expanduser()
    if path.is_dir() or path.name == "config.json":
        config_path = path if path.is_file() else path / "config.json"
        return local_source(config_path.parent), read_config_json(config_path)
    source = resolve_source(model, revision, progress=progress)
    return source, read_config_json(source.path)


def _optimize(
    package: ModelPackage, trace: bool, prune_lm_head: bool = False, progress: bool = False
) -> None:
    with phase(f"optimizing the graph for {package.ep.name}", progress):
        for key, model in package.models.items():
            package.reports[key] = optimize_model(
                model,
                ep=package.ep,
                dtype=package.dtype,
                model_role=package.roles[key],
                trace=trace,
                prune_lm_head=prune_lm_head,
            )
