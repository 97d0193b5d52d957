"""Test-only helpers for the optimization rules: small graphs, rule application, ORT runs.

Two kinds of graph are rewritten in these tests:

* small graphs written in ONNX text: ``parse`` turns ONNX's textual syntax into an ir.Model (so
  each test shows the graph it rewrites), ``rewrite`` applies one rule set the way the pipeline
  does (then registers Tier-1 bodies and drops dead nodes) and ``random_feeds`` makes seeded
  inputs for every graph input;
* tiny decoders: ``tiny_decoder`` builds the portable graph of a tiny ArchitectureConfig straight
  from the components (no checkpoint) and gives its parameters seeded random values, in memory
  or as lazy tensors that count their reads, or none at all (as with ``load_weights=False``);
  ``apply`` runs rule sets and passes in order, and ``run_decoder`` runs a decoder on the ORT CPU
  EP over a prefill and cached decode steps, feeding exactly the inputs onnxruntime-genai would
  (all-ones mask, positions ``past + i``).

Both share ``clone``, ``op_counts``, ``nodes``, ``decline_reasons`` (why checks refused),
``session`` and ``run`` (the ORT CPU EP).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.rewriter import pattern

from mobius_genai.build import build_from_module
from mobius_genai.components.tier1 import register_functions
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import build_context
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.optimize.declines import DeclineRecorder

HEADER = '<ir_version: 10, opset_import: ["" : 24]>'
DTYPES = {"f32": ir.DataType.FLOAT, "f16": ir.DataType.FLOAT16}


# ------------------------------------------------------------------ graphs in ONNX text


def parse(graph_text: str, header: str = HEADER) -> ir.Model:
    """An ir.Model from the ONNX text syntax (`header` sets IR version and opsets)."""
    return ir.from_proto(onnx.parser.parse_model(header + "\n" + graph_text))


def rewrite(model: ir.Model, rules: pattern.RewriteRuleSet) -> int:
    """Apply `rules`, register Tier-1 bodies, drop dead nodes; returns the number of rewrites."""
    count = rules.apply_to_model(model)
    register_functions(model)
    RemoveUnusedNodesPass()(model)
    return count


def random_feeds(model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded normal values for every (statically shaped) graph input."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.inputs:
        shape = [int(d) for d in value.shape]
        feeds[value.name] = rng.standard_normal(shape).astype(value.dtype.numpy())
    return feeds


# ------------------------------------------------------------------ tiny decoders


def tiny_config(**overrides: Any) -> ArchitectureConfig:
    """hidden 64, 4 heads of 16 (2 kv heads), 2 layers, 64 positions, unless overridden."""
    fields: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 64,
    }
    fields.update(overrides)
    return ArchitectureConfig(**fields)


@dataclasses.dataclass
class ReadCounter:
    """How many times lazy parameters were materialized."""

    reads: int = 0


def tiny_decoder(
    config: ArchitectureConfig, dtype: str = "f32", seed: int = 0, weights: str = "memory"
) -> tuple[ir.Model, ReadCounter]:
    """The portable decoder of `config` with random parameters.

    weights: "memory" (ir.Tensor), "lazy" (ir.LazyTensor counting reads) or "none".
    """
    ir_dtype = DTYPES[dtype]
    with build_context("default", ir_dtype):
        module = CausalLMModel(config)
    model = build_from_module(module, config, "default", dtype, optimize=False)["model"]
    counter = ReadCounter()
    rng = np.random.default_rng(seed)
    for value in model.graph.initializers.values():
        if value.const_value is not None or weights == "none":
            continue
        shape = value.shape.numpy()
        center = 1.0 if "norm" in (value.name or "") else 0.0
        array = (center + 0.2 * rng.standard_normal(shape)).astype(ir_dtype.numpy())
        if weights == "memory":
            value.const_value = ir.Tensor(array, name=value.name)
        else:
            value.const_value = _counting_lazy(array, value.name, ir_dtype, counter)
    return model, counter


def _counting_lazy(
    array: np.ndarray, name: str | None, dtype: ir.DataType, counter: ReadCounter
) -> ir.LazyTensor:
    def load() -> ir.TensorProtocol:
        counter.reads += 1
        return ir.Tensor(array, name=name)

    return ir.LazyTensor(load, dtype=dtype, shape=ir.Shape(array.shape), name=name)


def apply(model: ir.Model, *steps: pattern.RewriteRuleSet | ir.passes.PassBase) -> list[int]:
    """Apply rule sets / passes in order, removing dead nodes after each; rewrite counts."""
    counts = []
    for step in steps:
        if isinstance(step, pattern.RewriteRuleSet):
            counts.append(step.apply_to_model(model))
        else:
            counts.append(int(step(model).modified))
        RemoveUnusedNodesPass()(model)
    return counts


# ------------------------------------------------------------------ shared


def clone(model: ir.Model) -> ir.Model:
    """A deep copy (materializes lazy tensors; use before counting reads only on copies)."""
    return ir.from_proto(ir.to_proto(model))


def op_counts(model: ir.Model) -> collections.Counter[str]:
    """op_type → number of nodes in the main graph."""
    return collections.Counter(node.op_type for node in model.graph)


def nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [node for node in model.graph if node.op_type == op_type]


def custom_domains(model: ir.Model) -> set[str]:
    return {node.domain for node in model.graph if node.domain not in ("", "ai.onnx")}


def decline_reasons(model: ir.Model, rules: pattern.RewriteRuleSet) -> list[str]:
    """The reasons the rules gave for refusing candidates (looked for on a copy of `model`)."""
    recorder = DeclineRecorder("test")
    rules.apply_to_model(clone(model), tracer=recorder)
    return [decline.reason for decline in recorder.declines()]


def session(
    model: ir.Model, directory: Path | None = None, *, ort_optimizations: bool = False
) -> ort.InferenceSession:
    """An ORT CPU session of `model`.

    With `directory`, the model is saved there as model.onnx and loaded from the file, else
    passed in memory. ORT's own graph optimizations are off (ORT runs the graph as written)
    unless `ort_optimizations`.
    """
    options = ort.SessionOptions()
    if not ort_optimizations:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if directory is None:
        source: str | bytes = ir.to_proto(model).SerializeToString()
    else:
        directory.mkdir(parents=True, exist_ok=True)
        ir.save(model, directory / "model.onnx")
        source = str(directory / "model.onnx")
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All graph outputs of `model` on the ORT CPU EP."""
    return session(model).run(None, feeds)


def run_decoder(
    model: ir.Model,
    config: ArchitectureConfig,
    directory: Path,
    *,
    batch: int = 2,
    prefill: int = 12,
    decode_steps: int = 4,
    seed: int = 1,
) -> list[np.ndarray]:
    """Logits of a prefill and cached decode steps on the ORT CPU EP.

    The tokens are fixed by `seed` (not sampled from the logits), so two graphs that agree
    within rounding are fed identical inputs at every step.
    """
    decoder = session(model, directory, ort_optimizations=True)
    inputs = {i.name: i for i in decoder.get_inputs()}
    outputs = [o.name for o in decoder.get_outputs()]
    cache_dtype = next(
        np.float16 if i.type == "tensor(float16)" else np.float32
        for name, i in inputs.items()
        if name.startswith("past_key_values.")
    )
    tokens = np.random.default_rng(seed).integers(
        3, config.vocab_size, size=(batch, prefill + decode_steps)
    )
    ids, past = tokens[:, :prefill], 0
    cache = {
        f"past_key_values.{i}.{kind}": np.zeros(
            (batch, config.num_key_value_heads, 0, config.head_dim), cache_dtype
        )
        for i in range(config.num_hidden_layers)
        for kind in ("key", "value")
    }
    all_logits = []
    for _ in range(decode_steps + 1):
        seq = ids.shape[1]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((batch, past + seq), np.int64),
            "position_ids": np.tile(np.arange(past, past + seq), (batch, 1)),
            **cache,
        }
        values = decoder.run(outputs, {k: v for k, v in feeds.items() if k in inputs})
        results = dict(zip(outputs, values, strict=True))
        all_logits.append(results["logits"].astype(np.float32))
        cache = {
            name.replace("present.", "past_key_values."): value
            for name, value in results.items()
            if name.startswith("present.")
        }
        past += seq
        ids = tokens[:, past : past + 1]
    return all_logits


def max_diff(a: Iterable[np.ndarray], b: Iterable[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
