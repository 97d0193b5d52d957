"""`MobiusExport`: an Olive pass that turns a HuggingFace model into a mobius-genai bundle.

Input: an `HfModelHandler` (local folder or hub id). Output: an `ONNXModelHandler` for the
bundle's model.onnx whose `additional_files` list every other bundle file (genai_config.json,
tokenizer files, README.md card, mobius_manifest.json), so Olive copies them beside the model
through any later pass and into the workflow's output folder; for a vision-language bundle a
`CompositeModelHandler` of its graphs, which Olive saves as the folder it is. The work is `package()`'s: the
bundle is validated (and smoke-tested unless `smoke_test` is false) before the pass returns.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from olive.hardware.accelerator import AcceleratorSpec
from olive.model import CompositeModelHandler, HfModelHandler, ONNXModelHandler
from olive.passes import Pass
from olive.passes.pass_config import BasePassConfig, PassConfigParam
from pydantic import ValidationInfo, field_validator, model_validator

from mobius_genai.build import MODEL_FILENAME
from mobius_genai.bundle.card import graph_sections
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.ep import ep_registry
from mobius_genai.errors import ConfigError
from mobius_genai.olive.providers import NO_PROVIDER_EP, mobius_ep_for
from mobius_genai.optimize import trace_to_stderr
from mobius_genai.packager import default_output, package
from mobius_genai.quantize import DEFAULT_QUALITY, QUALITIES, Int4Options
from mobius_genai.target import (
    FLOAT_PRECISIONS,
    PRECISIONS,
    check_context_length,
    check_int4_precision,
    parse_dtype,
    precision_name,
    resolve_ep,
    resolve_target,
)

logger = logging.getLogger(__name__)
#: The name an input model's own adapter (HfModel `adapter_path`) ships under: PEFT's own name
#: for an adapter given none.
INPUT_ADAPTER = "default"


class MobiusExport(Pass):
    """Build an onnxruntime-genai bundle of a HuggingFace causal LM for one execution provider.

    The EP is the pass's `ep`, else the one whose onnxruntime name the workflow accelerator lists
    (`olive_ep_mapping()`), else cpu. Failures raise ValueError subclasses, which `olive run` reports and exits on.
    """

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        return {
            "ep": PassConfigParam(
                type_=str,
                default_value=None,
                description=(
                    f"mobius-genai execution provider ({', '.join(ep_registry)}, in any case, "
                    "or its onnxruntime name; see `mobius-genai eps`). Default: the workflow "
                    f"accelerator's execution provider, {NO_PROVIDER_EP} when it names none."
                ),
            ),
            "precision": PassConfigParam(
                type_=str,
                default_value=None,
                description=(
                    f"{', '.join(PRECISIONS)} (int4: MatMulNBits weights, `dtype` activations). "
                    "Default: int4 when an int4_* option is set or the source stores 4-bit "
                    "weights (GPTQ, AWQ: kept as stored), else the EP's default dtype, "
                    "unquantized. A float precision dequantizes a pre-quantized source."
                ),
            ),
            "dtype": PassConfigParam(
                type_=str,
                default_value=None,
                description=f"{', '.join(FLOAT_PRECISIONS)}: the model dtype (for int4, of activations and "
                "scales). Default: from `precision`, else the EP's.",
            ),
            **_int4_params(),
            "context_length": PassConfigParam(
                type_=int,
                default_value=None,
                description="Tokens the bundle supports. Default: max_position_embeddings.",
            ),
            "graph_capture": PassConfigParam(
                type_=bool,
                default_value=None,
                description="GPU graph capture in the bundle's provider options (true/false). "
                "Default: the EP's (see `mobius-genai eps`).",
            ),
            "revision": PassConfigParam(
                type_=str,
                default_value=None,
                description="Hub revision (branch, tag or commit) of a hub model. Default: the "
                "input model's load_kwargs revision, else the main branch.",
            ),
            "adapters": PassConfigParam(
                type_=dict,
                default_value=None,
                description="LoRA adapters to ship with the bundle, {NAME: PEFT adapter folder}: "
                "the graph takes LoRA inputs and each becomes adapters/NAME.onnx_adapter (as "
                "`package --adapter NAME=DIR`). An input model's own adapter_path ships as "
                f"{INPUT_ADAPTER!r}.",
            ),
            "smoke_test": PassConfigParam(
                type_=bool,
                default_value=True,
                description="Generate a few tokens with onnxruntime-genai before returning.",
            ),
            "trace": PassConfigParam(
                type_=bool,
                default_value=False,
                description="Print why each graph rewrite fired or not (stderr).",
            ),
        }

    @classmethod
    def _validators(cls) -> dict[str, Callable[..., Any]]:
        """Reject bad values when the workflow is read, before any model is loaded."""
        return {
            "check_ep": field_validator("ep")(_check_ep),
            "check_precision": field_validator("precision")(_check_precision),
            "check_dtype": field_validator("dtype")(_check_dtype),
            "check_int4": field_validator("int4_block_size", "int4_accuracy_level")(_check_int4),
            "check_int4_quality": field_validator("int4_quality")(_check_int4_quality),
            "check_context_length": field_validator("context_length")(_check_context_length),
            "check_adapters": field_validator("adapters")(_check_adapters),
            "check_int4_precision": model_validator(mode="after")(_check_int4_precision),
        }

    @classmethod
    def is_accelerator_agnostic(cls, accelerator_spec: AcceleratorSpec) -> bool:
        """No: unless the pass names an `ep`, the accelerator's EP decides the graph."""
        return False

    def _run_for_config(
        self, model: HfModelHandler, config: BasePassConfig, output_model_path: str
    ) -> ONNXModelHandler | CompositeModelHandler:
        if not isinstance(model, HfModelHandler):
            raise ConfigError(
                f"MobiusExport: input model type {type(model).__name__}; accepted: an HfModel "
                "(a HuggingFace hub id or local checkpoint folder)"
            )
        load_kwargs = model.load_kwargs
        if load_kwargs is not None and load_kwargs.quantization_method:
            raise ConfigError(
                "MobiusExport: the input model's load_kwargs ask for quantization "
                f"({load_kwargs.quantization_method!r}), which MobiusExport does not apply; "
                "accepted: no quantization_method (use the pass's precision 'int4' instead)"
            )
        source = str(model.model_name_or_path)
        extra = (load_kwargs.extra_args if load_kwargs is not None else None) or {}
        revision = config.revision or extra.get("revision")
        target = resolve_target(
            config.ep or mobius_ep_for(self.accelerator_spec.execution_provider),
            dtype=config.dtype,
            precision=config.precision,
            int4=int4_options(config),
            context_length=config.context_length,
            graph_capture=config.graph_capture if _plain(config.graph_capture, bool) else None,
            stored=functools.partial(stored_bits, source, revision),
        )
        # The folder name shows in the card's run instructions: <model>-<ep>-<precision>.
        out = Path(output_model_path) / default_output(source, target.ep, target.precision).name
        logger.info(
            "MobiusExport: building %s for %s (%s) into %s",
            source,
            target.ep.name,
            target.precision,
            out,
        )
        with trace_to_stderr() if config.trace else contextlib.nullcontext():
            folder = package(
                source,
                output=out,
                target=target,
                trace_optimization=config.trace,
                smoke_test=config.smoke_test,
                force=True,
                revision=revision,
                adapters=_adapters(model, config) or None,
            )
        logger.info(
            "MobiusExport: bundle built in Olive's cache %s; Olive copies the workflow's final "
            "model to its output_dir",
            folder,
        )
        return bundle_model_handler(folder, model.model_attributes)


def _int4_params() -> dict[str, PassConfigParam]:
    """The int4_* options of MobiusExport."""
    return {
        "int4_block_size": PassConfigParam(
            type_=int,
            default_value=None,
            description="int4 only: quantization block size 16, 32, 64, 128 or 256 "
            "(default: the int4_quality recipe's, 32 for each recipe today).",
        ),
        "int4_asymmetric": PassConfigParam(
            type_=bool,
            default_value=False,
            description="int4 only: quantize with zero points. Default: the int4_quality recipe's.",
        ),
        "int4_quality": PassConfigParam(
            type_=str,
            default_value=None,
            description=f"int4 only: the recipe, {', '.join(QUALITIES)} (default "
            f"{DEFAULT_QUALITY}; `mobius-genai package --help` describes each).",
        ),
        "int4_accuracy_level": PassConfigParam(
            type_=int,
            default_value=None,
            description="int4 only: MatMulNBits accuracy_level 0-4. Default: the EP's.",
        ),
    }


def _adapters(model: HfModelHandler, config: BasePassConfig) -> dict[str, str]:
    """The adapters to ship: the pass's `adapters`, and the input model's own one."""
    adapters = dict(config.adapters) if _plain(config.adapters, dict) else {}
    if model.adapter_path:
        if INPUT_ADAPTER in adapters:
            raise ConfigError(
                f"MobiusExport: adapters names {INPUT_ADAPTER!r}, the name the input model's own "
                f"adapter ({model.adapter_path}) ships under; accepted: another name"
            )
        adapters[INPUT_ADAPTER] = str(model.adapter_path)
    return adapters


def int4_options(config: BasePassConfig) -> Int4Options | None:
    """package()'s `int4` argument from the pass's int4_* params; None when none is set."""
    if not _int4_given(config):
        return None
    return Int4Options.from_choices(
        config.int4_block_size,
        bool(config.int4_asymmetric),
        config.int4_accuracy_level,
        config.int4_quality,
    )


def bundle_model_handler(
    folder: Path, model_attributes: dict[str, Any] | None = None
) -> ONNXModelHandler | CompositeModelHandler:
    """The Olive model of the bundle in `folder`.

    A one-graph bundle is an ONNXModelHandler of model.onnx: its external data files stay with
    the model (a later pass writes its own); every other file is listed in
    `additional_files`, replacing the input model's list (Olive's Pass.run then carries the
    input's files over, without overwriting these). A bundle of several graphs (vision,
    embedding, decoder; encoder, decoder) is a CompositeModelHandler of them marked `no_flatten`, so
    Olive saves the folder as it is: graph names, weights and genai_config stay together.
    """
    config = read_genai_config(folder)["model"]
    sections = graph_sections(config)
    if len(sections) > 1:
        graphs = {config[section]["filename"] for section in sections}
        weights = {
            name for graph in graphs for name in GraphInfo.from_file(folder / graph).external_data
        }
        attributes = {
            **(model_attributes or {}),
            "no_flatten": True,
            "additional_files": _files(folder, graphs | weights),
        }
        components = [
            ONNXModelHandler(model_path=str(folder), onnx_file_name=config[section]["filename"])
            for section in sections
        ]
        return CompositeModelHandler(components, sections, str(folder), attributes)
    weights = set(GraphInfo.from_file(folder / MODEL_FILENAME).external_data)
    attributes = {
        **(model_attributes or {}),
        "additional_files": _files(folder, {MODEL_FILENAME} | weights),
    }
    return ONNXModelHandler(
        model_path=str(folder), onnx_file_name=MODEL_FILENAME, model_attributes=attributes
    )


def _files(folder: Path, but: set[str]) -> list[str]:
    """The paths of the files in `folder` not named in `but`."""
    return [str(path) for path in sorted(folder.iterdir()) if path.name not in but]


def _plain(value: Any, kind: type) -> bool:
    """A value the user set (not None, a search parameter or Olive's DEFAULT_VALUE enum)."""
    return type(value) is kind


def _check_ep(cls: type, value: Any) -> Any:
    if _plain(value, str):
        resolve_ep(value)  # ExecutionProviderError names the EPs accepted
    return value


def _check_precision(cls: type, value: Any) -> Any:
    if _plain(value, str):
        precision_name(value)  # ConfigError names the precisions accepted
    return value


def _check_dtype(cls: type, value: Any) -> Any:
    if _plain(value, str):
        parse_dtype(value)  # ConfigError names the dtypes accepted
    return value


def _check_int4(cls: type, value: Any, info: ValidationInfo) -> Any:
    if _plain(value, int):
        key = "block_size" if info.field_name == "int4_block_size" else "accuracy_level"
        Int4Options(**{key: value})  # ConfigError names the values accepted
    return value


def _check_int4_quality(cls: type, value: Any) -> Any:
    if _plain(value, str):
        Int4Options(quality=value)  # ConfigError names the recipes accepted
    return value


def _int4_given(config: Any) -> bool:
    return (
        _plain(config.int4_block_size, int)
        or config.int4_asymmetric is True
        or _plain(config.int4_accuracy_level, int)
        or _plain(config.int4_quality, str)
    )


def _check_int4_precision(config: Any) -> Any:
    if config.precision is None or _plain(config.precision, str):
        check_int4_precision(_int4_given(config), precision_name(config.precision))
    return config


def _check_adapters(cls: type, value: Any) -> Any:
    if value is not None and not (
        _plain(value, dict) and all(isinstance(v, str) and v for v in [*value, *value.values()])
    ):
        raise ConfigError(
            f"MobiusExport: adapters {value!r}; accepted: a mapping of adapter names to PEFT "
            'adapter folders, e.g. {"sql": "./sql-lora"}'
        )
    return value


def _check_context_length(cls: type, value: Any) -> Any:
    if _plain(value, int):
        check_context_length(value)  # ConfigError says what is accepted
    return value
