"""Validation of the caches of hybrid decoders: which layers have a KV cache, and the states
of recurrent layers as their blocks declare them (config/recurrent.py) and onnxruntime-genai 0.18
reads them.

- States genai_config declares (LFM2's conv states): against `layer_types`, the sizes under the
  states' axis names (`conv_cache_size`) and the patterns `past_<suffix>_names` /
  `present_<suffix>_names`.
- States named from the KV patterns (gated delta nets): genai_config names nothing;
  onnxruntime-genai's RecurrentState derives `<past key pattern up to its last '.'>.conv_state`
  / `.recurrent_state` (and the same from the present key pattern), takes every graph input
  matching the first as a recurrent layer, allocates one shape for all of them (only the batch
  dim may be dynamic), and its KV cache takes the layers whose key inputs the graph has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.bundle.graph import GraphInfo, layer_names
from mobius_genai.config.layers import ATTENTION_LAYER_TYPES
from mobius_genai.config.recurrent import (
    DERIVED_SUFFIXES,
    RecurrentBlock,
    State,
    declared_blocks,
    derived_ranks,
    layers_of,
)

_SIDES = (("inputs", "past_key_names", "past"), ("outputs", "present_key_names", "present"))


def kv_layers(
    decoder: Mapping[str, Any], inputs: Mapping[str, str], graph: GraphInfo
) -> tuple[int, ...]:
    """The layers with a KV cache: those `layer_types` names attention; else, in a graph with
    recurrent states, the layers whose past key input it has (onnxruntime-genai's KV cache
    takes those: a layer may also carry states, Falcon-H1's, or no cache, Nemotron-H's MLP
    layers); else every layer."""
    layer_types = decoder.get("layer_types")
    if layer_types is not None:
        return tuple(i for i, kind in enumerate(layer_types) if kind in ATTENTION_LAYER_TYPES)
    if not delta_layers(inputs, graph):
        return tuple(range(decoder["num_hidden_layers"]))
    prefix, _, suffix = inputs["past_key_names"].partition("%d")
    found = (name[len(prefix) : len(name) - len(suffix)] for name in graph.inputs)
    keys = {int(middle) for middle in found if middle.isdigit()}
    return tuple(sorted(i for i in keys if prefix + str(i) + suffix in graph.inputs))


def _derived(kv_pattern: str, suffix: str) -> str:
    """onnxruntime-genai's state pattern from a KV pattern: its part after the last '.'
    replaced by `suffix` ("past_key_values.%d.key" → "past_key_values.%d.conv_state")."""
    return kv_pattern[: kv_pattern.rfind(".") + 1] + suffix


def delta_layers(inputs: Mapping[str, str], graph: GraphInfo) -> tuple[int, ...]:
    """The layers whose conv_state input the graph has: the recurrent layers onnxruntime-genai's
    RecurrentState finds (gated delta nets)."""
    prefix, _, suffix = _derived(inputs["past_key_names"], DERIVED_SUFFIXES[0]).partition("%d")
    found = []
    for name in graph.inputs:
        middle = name[len(prefix) : len(name) - len(suffix)]
        if name.startswith(prefix) and name.endswith(suffix) and middle.isdigit():
            found.append(int(middle))
    return tuple(sorted(found))


def check_derived_states(
    inputs: Mapping[str, str], outputs: Mapping[str, str], graph: GraphInfo
) -> list[str]:
    """Each layer with a conv_state input has every state named from the KV patterns in and
    out, one fixed shape each of the rank its blocks declare."""
    layers = delta_layers(inputs, graph)
    anchor = _derived(inputs["past_key_names"], DERIVED_SUFFIXES[0])
    problems = []
    for suffix in DERIVED_SUFFIXES[1:]:  # a state og feeds no layer without the conv state
        family = layer_names(graph.inputs, suffix)
        strays = [i for i in family.indices if i not in layers] if family else []
        if strays:
            problems.append(
                f"graph inputs {family.pattern!r} for layers {strays} lack the conv states "
                f"{anchor!r} that onnxruntime-genai finds recurrent layers by"
            )
    if not layers:
        return problems
    for suffix, rank in derived_ranks().items():
        for side, key, _ in _SIDES:
            names = getattr(graph, side)
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


def check_declared_states(
    decoder: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    graph: GraphInfo,
) -> list[str]:
    """The states genai_config declares exist in and out for exactly the layers of their
    block's kind, sized as the decoder keys of their axes say; a graph with such states needs
    `layer_types` that list their layers."""
    layer_types = decoder.get("layer_types") or []
    layers = decoder["num_hidden_layers"]
    if layer_types and len(layer_types) != layers:
        return [
            f"model.decoder.layer_types: {len(layer_types)} entries for "
            f"model.decoder.num_hidden_layers={layers}; accepted: one per layer"
        ]
    problems = []
    for block in declared_blocks():
        for state in block.states:
            problems += _check_declared(decoder, inputs, outputs, graph, block, state)
    return problems


def _check_declared(
    decoder: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    graph: GraphInfo,
    block: RecurrentBlock,
    state: State,
) -> list[str]:
    layers = list(layers_of(decoder.get("layer_types") or [], block.layer_type))
    if not layers:
        in_graph = layer_names(graph.inputs, state.suffix)
        if in_graph is None:
            return []
        return [
            f"graph inputs {in_graph.pattern!r} for layers {list(in_graph.indices)} are "
            f"{state.suffix} states but model.decoder.layer_types lists no "
            f"{block.layer_type!r} layer"
        ]
    problems = []
    for (side, _, prefix), example in zip(_SIDES, block.naming.names(state.suffix), strict=True):
        names, key = getattr(graph, side), f"{prefix}_{state.suffix}_names"
        pattern = (inputs if side == "inputs" else outputs).get(key)
        if pattern is None:
            problems.append(
                f"model.decoder.{side}.{key}: missing; accepted: the pattern of the "
                f"{state.suffix} state names, e.g. {example!r}"
            )
            continue
        missing = [pattern % i for i in layers if pattern % i not in names]
        if missing:
            problems.append(
                f"model.decoder.{side}.{key}: graph lacks {missing[:3]} for the "
                f"{block.layer_type} layers {layers} of model.decoder.layer_types"
            )
            continue
        problems += _check_state_shape(decoder, state, pattern % layers[0], names)
    return problems


def _check_state_shape(
    decoder: Mapping[str, Any], state: State, name: str, names: Mapping[str, Any]
) -> list[str]:
    spec = names[name]
    if spec.shape is None:
        return []
    if len(spec.shape) != 1 + len(state.axes):
        return [
            f"graph {name!r}: rank {len(spec.shape)}; accepted: {1 + len(state.axes)} "
            f"(batch, {', '.join(state.axes)})"
        ]
    problems = []
    for axis, field in enumerate(state.axes, 1):
        found, expected = spec.dim(axis), decoder.get(field)
        if found is not None and found != expected:
            problems.append(
                f"model.decoder.{field}: {expected} but graph {name!r} has {found} at dim {axis}"
            )
    return problems
