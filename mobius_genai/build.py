"""`build()` and `build_from_module()`: from a checkpoint (or a module) to optimized ONNX models."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir
from onnx_ir.serde import SerdeError

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY
from mobius_genai.checkpoint.opening import open_checkpoint
from mobius_genai.checkpoint.parameters import layers_from, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.checkpoint.source import Source
from mobius_genai.components.tier1 import expand_after_int4
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.context import build_context
from mobius_genai.errors import MobiusError
from mobius_genai.kinds.base import DecoderWeights, KindInput, ModelKind
from mobius_genai.kinds.table import TEXT_DECODER, kind_of
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FamilyAdapter
from mobius_genai.optimize import OptimizationReport, optimize_model
from mobius_genai.progress import Progress, phase
from mobius_genai.quantize.package_weights import INT4_ROLES
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
            expand_after_int4(model)  # a graph built for int4 saved without it: float experts
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
    lora_targets: Collection[str] = (),
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
    `lora_targets` (PEFT target_modules names) gives those projections of a text decoder LoRA
    inputs that og's adapters feed (components/lora.py). A `target` that asks for int4 leaves
    MoE nodes of GeGLU experts for `quantize_package`, which quantizes and expands them (saved
    without it, they are expanded float).
    """
    target = target_or_choices(
        target, execution_provider, "build", dtype=dtype, context_length=context_length
    )
    with phase("reading the checkpoint", progress):
        opened = open_checkpoint(model, revision, progress=progress, weights=load_weights)
    source, raw = opened.source, opened.config
    checkpoint = opened.reader() if load_weights else None
    kind = kind_of(raw.get("model_type", ""))
    given = KindInput(
        raw=raw,
        source=source,
        checkpoint=checkpoint,
        target=target,
        num_layers=num_layers,
        read_decoder=functools.partial(_decoder_weights, checkpoint, num_layers),
        lora_targets=tuple(lora_targets),
        prune_lm_head=prune_lm_head,
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
    checkpoint: CheckpointReader | None,
    num_layers: int | None,
    module: CausalLMModel,
    family: FamilyAdapter,
) -> DecoderWeights:
    """`KindInput.read_decoder`: the tensors of a decoder module (`parameter_tensors`: every
    reader of stored formats), and how the source stored them; none for a graph-only build.
    With `num_layers`, the checkpoint's later layers are left unread."""
    if checkpoint is None:
        return DecoderWeights({}, {}, None)
    tensors, float_kinds = parameter_tensors(
        dict(module.named_parameters()),
        checkpoint,
        family,
        module.config,
        tied=module.tied_weights(),
        dropped=layers_from(checkpoint, num_layers),
    )
    return DecoderWeights(tensors, float_kinds, checkpoint.describe())


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
                int4_experts=package.target.int4_plan.options is not None
                and package.roles[key] in INT4_ROLES,
            )
