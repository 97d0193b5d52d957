"""`build()` and `build_from_module()`: from a checkpoint (or a module) to optimized ONNX models."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import onnx_ir as ir
from onnx_ir.serde import SerdeError

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY
from mobius_genai.checkpoint.opening import open_checkpoint
from mobius_genai.checkpoint.parameters import attach_weights, layers_from, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.checkpoint.source import Source
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.context import build_context
from mobius_genai.errors import MobiusError
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FamilyAdapter, get_family
from mobius_genai.models.vision_language import VisionLanguageFamily, vision_language_family
from mobius_genai.models.vision_language_graphs import vision_language_graphs
from mobius_genai.optimize import OptimizationReport, optimize_model
from mobius_genai.progress import Progress, phase
from mobius_genai.target import Target, resolve_target, target_or_choices
from mobius_genai.tasks.causal_lm import CausalLMTask

# Package key → model role (the role gates fusions such as GQA): "model" for the one graph
# of a text model; "vision", "embedding" and "decoder" for a vision-language package.
ROLES = {"model": "decoder", "decoder": "decoder", "vision": "vision", "embedding": "embedding"}
MODEL_FILENAME = "model.onnx"
#: Initializers above this many bytes are saved to the external data file (onnx-ir's default).
EXTERNAL_THRESHOLD = 256


@dataclasses.dataclass
class ModelPackage(Mapping[str, ir.Model]):
    """The ONNX models built from one checkpoint, by package key ("model" for a decoder;
    "vision", "embedding", "decoder" for a vision-language model, whose `config` is the text
    decoder's and `vision_language` the whole checkpoint's)."""

    models: dict[str, ir.Model]
    config: ArchitectureConfig
    ep: EpCapabilities
    dtype: ir.DataType
    context_length: int
    source: Source | None = None
    family: FamilyAdapter | VisionLanguageFamily | None = None
    reports: dict[str, OptimizationReport] = dataclasses.field(default_factory=dict)
    vision_language: VisionLanguageConfig | None = None
    prequantized: str | None = None
    """How the source stored its quantized weights (e.g. "GPTQ 4-bit, group size 128"), when
    it did: those weights carry their stored integers (`PrequantizedTensor`)."""
    float_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    """For a pre-quantized source: the stored kind (GGUF type, safetensors dtype) → number of
    the checkpoint's tensors read as float (dequantized or cast), for the manifest."""
    not_built: str | None = None
    """What of a multimodal checkpoint a text-only build left out (`TextOnly.not_built`)."""

    @property
    def decoder_key(self) -> str:
        """The package key of the text decoder ("model", or "decoder" beside other graphs)."""
        return "model" if "model" in self.models else "decoder"

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
            filename = MODEL_FILENAME if key == "model" else f"{key}.onnx"
            path = directory / filename
            tensors = [
                value
                for graph in model.graphs()
                for value in graph.initializers.values()
                if value.const_value is not None and value.const_value.nbytes > EXTERNAL_THRESHOLD
            ]
            label = f"{action} {filename}"
            if len(self.models) > 1:
                label += f" (graph {index} of {len(self.models)}, {ROLES[key]})"
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
        config=config,
        ep=target.ep,
        dtype=target.dtype,
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
        opened = open_checkpoint(model, revision, progress=progress, weights=load_weights)
    source, raw = opened.source, opened.config
    vision_language = vision_language_family(raw.get("model_type", ""))
    if vision_language is not None:
        with phase("building the graph", progress):
            package = _build_vision_language(
                raw,
                vision_language,
                target,
                source,
                opened.reader if load_weights else None,
                num_layers,
            )
        _optimize(package, trace_optimization, prune_lm_head, progress)
        return package
    family = get_family(raw.get("model_type", ""))
    config = family.parse_config(raw)
    if num_layers is not None:
        config = config.first_layers(num_layers)
    length = target.context_length or config.max_position_embeddings
    checkpoint = opened.reader() if load_weights else None
    prequantized = None if checkpoint is None else checkpoint.describe()
    with phase("building the graph", progress), build_context(target.ep, target.dtype):
        module = CausalLMModel(config, length)  # parameters are shapes, rotary tables lazy
        # config vs checkpoint: before the graph is built
        tensors, float_kinds = _read_weights(module, checkpoint, family, num_layers)
        graph_model = CausalLMTask().build(module, config)
        attach_weights(graph_model, tensors)
    package = ModelPackage(
        models={"model": graph_model},
        config=config,
        ep=target.ep,
        dtype=target.dtype,
        context_length=length,
        source=source,
        family=family,
        prequantized=prequantized,
        float_kinds=float_kinds if prequantized else {},
        not_built=None if family.text_only is None else family.text_only.not_built,
    )
    _optimize(package, trace_optimization, prune_lm_head, progress)
    return package


def _read_weights(
    module: CausalLMModel,
    checkpoint: CheckpointReader | None,
    family: FamilyAdapter,
    num_layers: int | None,
) -> tuple[dict[str, ir.TensorProtocol], dict[str, int]]:
    """`parameter_tensors` of the module (none without a checkpoint); with `num_layers`, the
    checkpoint's later layers are left unread."""
    if checkpoint is None:
        return {}, {}
    return parameter_tensors(
        dict(module.named_parameters()),
        checkpoint,
        family,
        module.config,
        tied=module.tied_weights(),
        dropped=layers_from(checkpoint, num_layers),
    )


def _build_vision_language(
    raw: dict,
    family: VisionLanguageFamily,
    target: Target,
    source: Source,
    reader: Callable[[], CheckpointReader] | None,
    num_layers: int | None,
) -> ModelPackage:
    """The three graphs; with `num_layers`, the decoder's first layers and the vision tower's
    first layers of every kind (`VisionLanguageConfig.first_layers`). `reader` opens the
    checkpoint once the config is parsed (None: a graph without weights)."""
    config = family.parse_config(raw)
    if num_layers is not None:
        config = config.first_layers(num_layers)
    checkpoint = None if reader is None else reader()
    dropped = (
        family.dropped_layers(checkpoint, config)
        if checkpoint is not None and num_layers is not None
        else []
    )
    length = target.context_length or config.text.max_position_embeddings
    with build_context(target.ep, target.dtype):
        models, float_kinds = vision_language_graphs(config, family, length, checkpoint, dropped)
    prequantized = None if checkpoint is None else checkpoint.describe()
    return ModelPackage(
        models=models,
        config=config.text,
        ep=target.ep,
        dtype=target.dtype,
        context_length=length,
        source=source,
        family=family,
        vision_language=config,
        prequantized=prequantized,
        float_kinds=float_kinds if prequantized else {},
    )


def _optimize(
    package: ModelPackage, trace: bool, prune_lm_head: bool = False, progress: bool = False
) -> None:
    with phase(f"optimizing the graph for {package.ep.name}", progress):
        for key, model in package.models.items():
            package.reports[key] = optimize_model(
                model,
                ep=package.ep,
                dtype=package.dtype,
                model_role=ROLES[key],
                trace=trace,
                prune_lm_head=prune_lm_head,
            )
