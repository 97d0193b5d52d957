"""Validation of the caches of hybrid decoders: which layers have a KV cache, and the conv
states of recurrent layers, against genai_config (`layer_types`, `conv_cache_size`,
`past_conv_names` / `present_conv_names`, as onnxruntime-genai 0.18 reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.bundle.graph import GraphInfo, layer_names
from mobius_genai.config.layers import ATTENTION_LAYER_TYPES


def kv_layers(decoder: Mapping[str, Any]) -> tuple[int, ...]:
    """The layers with a KV cache: those `layer_types` names attention, else all
    (onnxruntime-genai keeps a KV cache for exactly these kinds)."""
    layer_types = decoder.get("layer_types")
    if layer_types is None:
        return tuple(range(decoder["num_hidden_layers"]))
    return tuple(i for i, kind in enumerate(layer_types) if kind in ATTENTION_LAYER_TYPES)


def check_conv_states(
    decoder: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    graph: GraphInfo,
) -> list[str]:
    """Conv state inputs/outputs exist for exactly the conv layers, sized [batch, hidden_size,
    conv_cache_size]; a graph with conv states needs `layer_types` that list them."""
    layer_types = decoder.get("layer_types") or []
    layers = decoder["num_hidden_layers"]
    if layer_types and len(layer_types) != layers:
        return [
            f"model.decoder.layer_types: {len(layer_types)} entries for "
            f"model.decoder.num_hidden_layers={layers}; accepted: one per layer"
        ]
    conv = [i for i, kind in enumerate(layer_types) if kind == "conv"]
    in_graph = layer_names(graph.inputs, "conv")
    if not conv:
        if in_graph is None:
            return []
        return [
            f"graph inputs {in_graph.pattern!r} for layers {list(in_graph.indices)} are conv "
            "states but model.decoder.layer_types lists no 'conv' layer"
        ]
    problems = []
    for side, names, key in (
        ("inputs", graph.inputs, "past_conv_names"),
        ("outputs", graph.outputs, "present_conv_names"),
    ):
        pattern = (inputs if side == "inputs" else outputs).get(key)
        if pattern is None:
            problems.append(
                f"model.decoder.{side}.{key}: missing; accepted: the pattern of the "
                "conv state names, e.g. 'past.%d.conv'"
            )
            continue
        missing = [pattern % i for i in conv if pattern % i not in names]
        if missing:
            problems.append(
                f"model.decoder.{side}.{key}: graph lacks {missing[:3]} for the conv layers "
                f"{conv} of model.decoder.layer_types"
            )
            continue
        problems += _check_state_shape(decoder, pattern % conv[0], names[pattern % conv[0]])
    return problems


def _check_state_shape(decoder: Mapping[str, Any], name: str, spec: Any) -> list[str]:
    if spec.shape is None:
        return []
    if len(spec.shape) != 3:
        return [f"graph {name!r}: rank {len(spec.shape)}; accepted: 3 (batch, hidden, columns)"]
    problems = []
    for field, axis in (("hidden_size", 1), ("conv_cache_size", 2)):
        found, expected = spec.dim(axis), decoder.get(field)
        if found is not None and found != expected:
            problems.append(
                f"model.decoder.{field}: {expected} but graph {name!r} has {found} at dim {axis}"
            )
    return problems
