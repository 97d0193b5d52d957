"""`build()` and `build_from_module()`: from a checkpoint (or a module) to optimized ONNX models."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import onnx_ir as ir

from mobius_genai.config import ArchitectureConfig, read_config_json
from mobius_genai.ep.capabilities import ALL_MODEL_DTYPES, EpCapabilities
from mobius_genai.ep.context import build_context
from mobius_genai.ep.registry import get_ep
from mobius_genai.errors import ConfigError, ExecutionProviderError
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FamilyAdapter, get_family
from mobius_genai.optimize import OptimizationReport, optimize_model
from mobius_genai.progress import Progress
from mobius_genai.source import Source, resolve_source
from mobius_genai.tasks.causal_lm import CausalLMTask
from mobius_genai.weights import Checkpoint, attach_weights

#: The dtype names the CLI and the Olive pass offer (DTYPES also takes longer spellings).
DTYPE_NAMES = ("f32", "f16", "bf16")

DTYPES: dict[str, ir.DataType] = {
    "f32": ir.DataType.FLOAT,
    "fp32": ir.DataType.FLOAT,
    "float32": ir.DataType.FLOAT,
    "f16": ir.DataType.FLOAT16,
    "fp16": ir.DataType.FLOAT16,
    "float16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
}

# Package key → model role (the role gates fusions such as GQA).
ROLES = {
    "model": "decoder",
    "decoder": "decoder",
    "vision": "vision",
    "embedding": "embedding",
    "encoder": "encoder",
}
MODEL_FILENAME = "model.onnx"


def parse_dtype(dtype: str | ir.DataType | None, caps: EpCapabilities) -> ir.DataType:
    """Resolve a dtype argument for `caps`' EP; None means the EP's default dtype."""
    if dtype is None:
        return caps.default_dtype
    if isinstance(dtype, ir.DataType):
        if dtype not in ALL_MODEL_DTYPES:
            raise ConfigError(f"dtype {dtype} is not supported; accepted: {', '.join(DTYPE_NAMES)}")
        return require_model_dtype(caps, dtype)
    try:
        parsed = DTYPES[str(dtype).lower()]
    except KeyError:
        raise ConfigError(
            f"dtype {dtype!r} is not supported; accepted: {', '.join(DTYPE_NAMES)}"
        ) from None
    return require_model_dtype(caps, parsed)


def require_model_dtype(caps: EpCapabilities, dtype: ir.DataType) -> ir.DataType:
    """`dtype` if `caps`' EP runs models of it, else an ExecutionProviderError saying what does."""
    if dtype not in caps.model_dtypes:
        accepted = sorted(caps.model_dtypes, key=lambda d: d.value)
        raise ExecutionProviderError(
            f"execution provider {caps.name!r} does not run {dtype.short_name()} models (its "
            f"runtime has no {dtype.short_name()} kernels); accepted for {caps.name}: "
            + ", ".join(d.short_name() for d in accepted)
        )
    return dtype


def resolve_ep(execution_provider: str | EpCapabilities) -> EpCapabilities:
    """EpCapabilities for a name (or pass capabilities through)."""
    if isinstance(execution_provider, EpCapabilities):
        return execution_provider
    try:
        return get_ep(execution_provider)
    except ValueError as error:
        raise ExecutionProviderError(str(error)) from None


@dataclasses.dataclass
class ModelPackage(Mapping[str, ir.Model]):
    """The ONNX models built from one checkpoint, by package key ("model" for a decoder)."""

    models: dict[str, ir.Model]
    config: ArchitectureConfig
    ep: EpCapabilities
    dtype: ir.DataType
    context_length: int
    source: Source | None = None
    family: FamilyAdapter | None = None
    reports: dict[str, OptimizationReport] = dataclasses.field(default_factory=dict)

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

    def save(self, directory: str | Path, progress: bool = True) -> list[Path]:
        """Write each model as `<key>.onnx` (the decoder as model.onnx) with external data.

        Weights are read from the checkpoint one tensor at a time while writing.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for key, model in self.models.items():
            filename = MODEL_FILENAME if key == "model" else f"{key}.onnx"
            path = directory / filename
            tensors = [v for v in model.graph.initializers.values() if v.const_value is not None]
            with (
                Progress(f"saving {filename}", total=len(tensors), enabled=progress) as bar,
                _quiet_weightless_save(),
            ):
                ir.save(
                    model,
                    path,
                    external_data=f"{filename}.data",
                    callback=lambda tensor, info: bar.advance(),
                )
            written.append(path)
        return written


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
    dtype: str | ir.DataType | None = "f32",
    trace_optimization: bool = False,
    *,
    task: CausalLMTask | None = None,
    optimize: bool = True,
    prune_lm_head: bool = False,
) -> ModelPackage:
    """Build and optimize the graph of a module built from `config` (no weights attached).

    The module must be constructed inside the same build context, because components read
    the dtype from it; pass a factory-built module or use `build()` for checkpoints.
    """
    caps = resolve_ep(execution_provider)
    build_dtype = parse_dtype(dtype, caps)
    with build_context(caps, build_dtype):
        model = (task or CausalLMTask()).build(module, config)
    package = ModelPackage(
        models={"model": model},
        config=config,
        ep=caps,
        dtype=build_dtype,
        context_length=getattr(module, "context_length", config.max_position_embeddings),
    )
    if optimize:
        _optimize(package, trace_optimization, prune_lm_head)
    return package


def build(
    model: str | Path,
    execution_provider: str | EpCapabilities = "default",
    dtype: str | ir.DataType | None = "f32",
    load_weights: bool = True,
    trace_optimization: bool = False,
    *,
    context_length: int | None = None,
    revision: str | None = None,
    progress: bool = True,
    prune_lm_head: bool = False,
    num_layers: int | None = None,
) -> ModelPackage:
    """Build the ONNX models of a checkpoint (local folder or hub id) for one EP.

    With `load_weights=False` only config.json is read and the graph carries no weights, which
    makes even a 70B configuration a matter of seconds. With `prune_lm_head` the decoder
    computes logits for the last position only (what onnxruntime-genai reads; bundles do this).
    `progress` shows huggingface_hub's download bars for a hub id. `num_layers` builds the
    model's first layers only (`ArchitectureConfig.first_layers`; the smoke test's small twin).
    """
    caps = resolve_ep(execution_provider)
    build_dtype = parse_dtype(dtype, caps)
    if load_weights:
        source = resolve_source(model, revision, progress=progress)
        raw = read_config_json(source.path)
    else:
        source, raw = _config_only_source(model, revision, progress)
    family = get_family(raw.get("model_type", ""))
    config = family.parse_config(raw)
    if num_layers is not None:
        config = config.first_layers(num_layers)
    if context_length is not None and (
        isinstance(context_length, bool)
        or not isinstance(context_length, int)
        or context_length <= 0
    ):
        raise ConfigError(f"context_length must be a positive integer, found {context_length!r}")
    length = context_length or config.max_position_embeddings
    checkpoint = Checkpoint(source.path) if load_weights else None
    with build_context(caps, build_dtype):
        module = CausalLMModel(config, length)
        graph_model = CausalLMTask().build(module, config)
    if checkpoint is not None:
        attach_weights(
            graph_model,
            checkpoint,
            config,
            family.checkpoint_name,
            family.preprocess_weight,
            family.preprocessed,
        )
    package = ModelPackage(
        models={"model": graph_model},
        config=config,
        ep=caps,
        dtype=build_dtype,
        context_length=length,
        source=source,
        family=family,
    )
    _optimize(package, trace_optimization, prune_lm_head)
    return package


def _config_only_source(
    model: str | Path, revision: str | None, progress: bool
) -> tuple[Source, dict]:
    path = Path(model).expanduser()
    if path.is_dir() or path.name == "config.json":
        config_path = path if path.is_file() else path / "config.json"
        return Source(path=config_path.parent.resolve(), model_id=str(model)), read_config_json(
            config_path
        )
    source = resolve_source(model, revision, progress=progress)
    return source, read_config_json(source.path)


def _optimize(package: ModelPackage, trace: bool, prune_lm_head: bool = False) -> None:
    for key, model in package.models.items():
        package.reports[key] = optimize_model(
            model,
            ep=package.ep,
            dtype=package.dtype,
            model_role=ROLES.get(key, "decoder"),
            trace=trace,
            prune_lm_head=prune_lm_head,
        )
