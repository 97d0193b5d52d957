"""Validation of the caches of hybrid decoders: which layers have a KV cache, and the states
of recurrent layers, as onnxruntime-genai 0.18 reads them.

- LFM2's conv states: against genai_config's `layer_types`, `conv_cache_size` and
  `past_conv_names` / `present_conv_names`.
- Gated delta nets (Qwen3.5): genai_config names nothing; onnxruntime-genai's RecurrentState
  derives `<past key pattern up to its last '.'>.conv_state` / `.recurrent_state` (and the same
  from the present key pattern), takes every graph input matching the conv one as a recurrent
  layer, allocates one shape for all of them (only the batch dim may be dynamic), and its KV
  cache takes the layers whose key inputs the graph has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.bundle.graph import GraphInfo, layer_names
from mobius_genai.config.layers import ATTENTION_LAYER_TYPES

#: The states of a gated delta net layer (name suffix) and their ranks.
_DELTA_STATES = (("conv_state", 3), ("recurrent_state", 4))


def kv_layers(
    decoder: Mapping[str, Any], inputs: Mapping[str, str], graph: GraphInfo
) -> tuple[int, ...]:
    """The layers with a KV cache: those `layer_types` names attention, else all but the
    layers with gated-delta-net states (onnxruntime-genai keeps a KV cache for these)."""
    layer_types = decoder.get("layer_types")
    if layer_types is None:
        recurrent = set(delta_layers(inputs, graph))
        return tuple(i for i in range(decoder["num_hidden_layers"]) if i not in recurrent)
    return tuple(i for i, kind in enumerate(layer_types) if kind in ATTENTION_LAYER_TYPES)


def _derived(kv_pattern: str, suffix: str) -> str:
    """onnxruntime-genai's state pattern from a KV pattern: its part after the last '.'
    replaced by `suffix` ("past_key_values.%d.key" → "past_key_values.%d.conv_state")."""
    return kv_pattern[: kv_pattern.rfind(".") + 1] + suffix


def delta_layers(inputs: Mapping[str, str], graph: GraphInfo) -> tuple[int, ...]:
    """The layers whose conv_state input the graph has, found as onnxruntime-genai does."""
    prefix, _, suffix = _derived(inputs["past_key_names"], "conv_state").partition("%d")
    found = []
    for name in graph.inputs:
        middle = name[len(prefix) : len(name) - len(suffix)]
        if name.startswith(prefix) and name.endswith(suffix) and middle.isdigit():
            found.append(int(middle))
    return tuple(sorted(found))


def check_delta_states(
    inputs: Mapping[str, str], outputs: Mapping[str, str], graph: GraphInfo
) -> list[str]:
    """Each layer with a conv_state input has both states in and out, one fixed shape each."""
    layers = delta_layers(inputs, graph)
    if not layers:
        stray = layer_names(graph.inputs, "recurrent_state")
        if stray is None:
            return []
        conv = _derived(inputs["past_key_names"], "conv_state")
        return [
            f"graph inputs {stray.pattern!r} for layers {list(stray.indices)} lack the conv "
            f"states {conv!r} that onnxruntime-genai finds recurrent layers by"
        ]
    problems = []
    for suffix, rank in _DELTA_STATES:
        for side, names, key in (
            ("inputs", graph.inputs, "past_key_names"),
            ("outputs", graph.outputs, "present_key_names"),
        ):
            pattern = _derived((inputs if side == "inputs" else outputs)[key], suffix)
            missing = [pattern % i for i in layers if pattern % i not in names]
            if missing:
                problems.append(
                    f"graph {side} lack {missing[:3]}: onnxruntime-genai reads {pattern!r} (from "
                    f"model.decoder.{side}.{key}) for the recurrent layers {list(layers)}"
                )
                continue
            problems += _check_fixed_shape(
                pattern, {names[pattern % i].shape for i in layers}, rank
            )
    return problems


def _check_fixed_shape(pattern: str, shapes: set[Any], rank: int) -> list[str]:
    if len(shapes) > 1:
        return [
            f"graph {pattern!r}: shapes differ between layers ({sorted(map(str, shapes))}); "
            "accepted: one shape, onnxruntime-genai allocates every layer's state alike"
        ]
    (shape,) = shapes
    if shape is None:
        return []
    if len(shape) != rank:
        return [f"graph {pattern!r}: rank {len(shape)}; accepted: {rank}"]
    dynamic = [axis for axis in range(1, rank) if not isinstance(shape[axis], int)]
    if dynamic:
        return [
            f"graph {pattern!r}: dims {dynamic} of {list(shape)} are not fixed sizes; accepted: "
            "only the batch dim dynamic (onnxruntime-genai allocates the state once)"
        ]
    return []


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
