"""Test-only helpers for the attention rules: tiny decoder graphs, rule application, ORT runs.

``tiny_decoder`` builds the portable graph of a tiny ArchitectureConfig straight from the
components (no checkpoint) and gives its parameters seeded random values, in memory or as
lazy tensors that count their reads, or none at all (as with ``load_weights=False``).
``run_decoder`` runs a graph on the ORT CPU EP over a prefill and cached decode steps, feeding
exactly the inputs onnxruntime-genai would (all-ones mask, positions ``past + i``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer, MatchStatus

from mobius_genai.build import build_from_module
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import build_context
from mobius_genai.models.causal_lm import CausalLMModel

DTYPES = {"f32": ir.DataType.FLOAT, "f16": ir.DataType.FLOAT16}
MS_DOMAIN = "com.microsoft"


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


def clone(model: ir.Model) -> ir.Model:
    """A deep copy (materializes lazy tensors; use before counting reads only on copies)."""
    return ir.from_proto(ir.to_proto(model))


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


class _DeclineRecorder(MatchingTracer):
    """Keeps every failed check (MatchingTracer keeps only each rule's best match)."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def log(self, rule, container, node, match_result, status) -> None:
        if status == MatchStatus.CONDITION_FAILED:
            self.reasons.append(str(match_result.reason))


def decline_reasons(rules: pattern.RewriteRuleSet, model: ir.Model) -> list[str]:
    """The reasons the rules' checks gave for refusing candidates (model left unchanged)."""
    recorder = _DeclineRecorder()
    rules.apply_to_model(model, tracer=recorder)
    return recorder.reasons


def op_counts(model: ir.Model) -> collections.Counter[str]:
    """op_type → number of nodes in the main graph."""
    return collections.Counter(node.op_type for node in model.graph)


def nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [node for node in model.graph if node.op_type == op_type]


def custom_domains(model: ir.Model) -> set[str]:
    return {node.domain for node in model.graph if node.domain not in ("", "ai.onnx")}


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
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    ir.save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
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
        values = session.run(outputs, {k: v for k, v in feeds.items() if k in inputs})
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
