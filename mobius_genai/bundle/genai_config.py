"""genai_config.json: what onnxruntime-genai needs to run a decoder graph.

Built from three things only: the ArchitectureConfig, the EP's capabilities and the graph as
written (its input/output names and whether it uses GroupQueryAttention). onnxruntime-genai
0.18 rejects unknown keys almost everywhere, so only keys it knows are written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
from mobius_genai.bundle.graph import KV_ROLES, GraphInfo, LayerNames, layer_names
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.recurrent import FROM_KV_NAMES, declared_blocks, layers_of
from mobius_genai.ep import EpCapabilities
from mobius_genai.errors import BundleError, ConfigError
from mobius_genai.models.families import get_family

#: generation_config.json keys copied into `search`, with the type genai parses them as, and
#: transformers' default for each (used when generation_config.json does not set it).
SEARCH_DEFAULTS: Mapping[str, tuple[type, Any]] = {
    "do_sample": (bool, False),
    "num_beams": (int, 1),
    "num_return_sequences": (int, 1),
    "min_length": (int, 0),
    "top_k": (int, 50),
    "top_p": (float, 1.0),
    "temperature": (float, 1.0),
    "repetition_penalty": (float, 1.0),
    "length_penalty": (float, 1.0),
    "no_repeat_ngram_size": (int, 0),
    "diversity_penalty": (float, 0.0),
}

CONFIG_FILENAME = "genai_config.json"

#: The ORT session config entry that sets the accuracy_level of the MatMulNBits onnxruntime
#: fuses each blocked DequantizeLinear + MatMul into (CPU EP, default optimization level).
#: Unset, onnxruntime uses 4: activations quantized to int8 per block, which moves a tiny
#: model's logits by several percent from the ONNX spec's float math (README, int4).
FUSED_INT4_ACCURACY_ENTRY = "session.qdq_matmulnbits_accuracy_level"
#: GraphInfo.ops name of the standard op whose int4 weights onnxruntime fuses.
_DEQUANTIZE_LINEAR = "ai.onnx::DequantizeLinear"


def read_generation_config(folder: str | Path) -> dict[str, Any]:
    """generation_config.json of a checkpoint folder as a dict ({} when the file is absent)."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    return read_json_object(path, ConfigError)


def make_genai_config(
    config: ArchitectureConfig,
    ep: EpCapabilities,
    graph: GraphInfo,
    *,
    context_length: int | None = None,
    generation: Mapping[str, Any] | None = None,
    filename: str = "model.onnx",
    tool_tokens: Mapping[str, int] | None = None,
    genai_type: str | None = None,
    int4_accuracy_level: int | None = None,
) -> dict[str, Any]:
    """The genai_config.json document for `graph` (the decoder file `filename`) on `ep`.

    `context_length` defaults to max_position_embeddings; `generation` is generation_config.json
    (token ids and search defaults; it wins over config.json); `tool_tokens` are the tool-call
    and reasoning ids of the tokenizer (`tool_tokens.tool_token_ids`); `genai_type` is
    model.type as the model's kind names it (`ModelKind.genai_type`), by default its family's.
    A graph with DequantizeLinear weights gets `int4_accuracy_level` (the int4 plan's; None:
    the EP's default) as `FUSED_INT4_ACCURACY_ENTRY`, so onnxruntime computes what was chosen.
    """
    generation = generation or {}
    context_length = context_length or config.max_position_embeddings
    share_buffer = graph.shares_kv_buffer
    int4_level = (
        ep.default_int4_accuracy_level if int4_accuracy_level is None else int4_accuracy_level
    )
    model: dict[str, Any] = {
        "type": genai_type or get_family(config.model_type).genai_type,
        "context_length": context_length,
        "vocab_size": config.vocab_size,
        **token_ids(config, generation),
        **(tool_tokens or {}),
        "decoder": {
            "filename": filename,
            "head_size": config.head_dim,
            # the width of the token embeddings (inputs_embeds), narrower than the stack in
            # OPT-350m's projected layout
            "hidden_size": config.embedding_width,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "num_hidden_layers": config.num_hidden_layers,
            "inputs": _decoder_inputs(graph, config),
            "outputs": _decoder_outputs(graph, config),
            "session_options": {
                "provider_options": provider_options(ep, share_buffer=share_buffer),
                **fused_int4_entries(graph, int4_level),
            },
            **recurrent_keys(config),
        },
    }
    search = {
        **search_defaults(generation),
        "max_length": context_length,
        "past_present_share_buffer": share_buffer,
    }
    return {"model": model, "search": search}


def fused_int4_entries(graph: GraphInfo, accuracy_level: int) -> dict[str, str]:
    """The session config entry that fixes the accuracy level of onnxruntime's fused
    DequantizeLinear + MatMul for a `graph` that has DequantizeLinear ({} otherwise)."""
    if _DEQUANTIZE_LINEAR not in graph.ops:
        return {}
    return {FUSED_INT4_ACCURACY_ENTRY: str(accuracy_level)}


def provider_options(ep: EpCapabilities, *, share_buffer: bool) -> list[dict[str, dict[str, str]]]:
    """`session_options.provider_options` for `ep`: [] on CPU, else one `{provider: {...}}`.

    Graph capture needs past/present buffer sharing, so it is switched on only when the EP
    enables it and the graph shares the buffer; the option is always written out when the EP
    has one, because DML turns capture on unless told "0".
    """
    provider = ep.runtime.genai_provider
    if provider is None:
        return []
    options = dict(ep.provider_options)
    if ep.graph_capture_option is not None:
        capture = ep.captures_graph(share_buffer=share_buffer)
        options[ep.graph_capture_option] = "1" if capture else "0"
    return [{provider: options}]


def token_ids(config: ArchitectureConfig, generation: Mapping[str, Any]) -> dict[str, Any]:
    """bos / eos / pad ids: generation_config.json first, then config.json.

    eos is an int or, when there are several, a list; pad falls back to the first eos (also
    when it is negative, as some configs write "no pad token"). Every id must be a row of the
    vocabulary: a ConfigError otherwise (the checkpoint's config and tokenizer disagree).
    """
    bos = _token("bos_token_id", generation.get("bos_token_id"), config.bos_token_id)
    raw_eos = generation.get("eos_token_id")
    if raw_eos is None:
        raw_eos = list(config.eos_token_id)
    eos_list = raw_eos if isinstance(raw_eos, list | tuple) else [raw_eos]
    eos = list(dict.fromkeys(_token("eos_token_id", value, None) for value in eos_list))
    pad = _token("pad_token_id", generation.get("pad_token_id"), config.pad_token_id)
    if (pad is None or pad < 0) and eos:
        pad = eos[0]
    named = (("bos_token_id", [bos]), ("eos_token_id", eos), ("pad_token_id", [pad]))
    problems = check_token_ids(
        ((f"generation_config.json/config.json: {field}", v) for field, ids in named for v in ids),
        config.vocab_size,
        "config.json's vocab_size",
    )
    if problems:
        raise ConfigError("; ".join(problems))
    ids: dict[str, Any] = {}
    if bos is not None:
        ids["bos_token_id"] = bos
    if eos:
        ids["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if pad is not None:
        ids["pad_token_id"] = pad
    return ids


def check_token_ids(ids: Iterable[tuple[str, Any]], vocab: int, source: str) -> list[str]:
    """Problems for the `(where, id)` pairs whose id is not a row of the logits [0, `vocab`).

    onnxruntime-genai checks eos when it loads a bundle; any other id outside the vocabulary
    fails later, inside onnxruntime, when generation meets it.
    """
    outside: dict[str, list[int]] = {}
    for where, value in ids:
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < vocab:
            outside.setdefault(where, []).append(value)
    return [
        f"{where}: {values} outside the vocabulary [0, {vocab}) of {source}; the checkpoint's "
        "config.json and its tokenizer disagree"
        for where, values in outside.items()
    ]


def search_defaults(generation: Mapping[str, Any]) -> dict[str, Any]:
    """Search settings from generation_config.json over transformers' defaults.

    A value of the wrong type for genai (e.g. early_stopping "never") keeps the default.
    """
    search: dict[str, Any] = {}
    for key, (kind, default) in SEARCH_DEFAULTS.items():
        value = _coerce(generation.get(key), kind)
        search[key] = default if value is None else value
    return search


def _coerce(value: Any, kind: type) -> Any:
    if value is None or (isinstance(value, bool) and kind is not bool):
        return None
    if kind is bool:
        return value if isinstance(value, bool) else None
    if kind is int:
        return value if isinstance(value, int) else None
    return float(value) if isinstance(value, int | float) else None


def _token(field: str, value: Any, fallback: Any) -> int | None:
    if value is None:
        value = fallback
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"generation_config.json/config.json: {field} must be an integer token id, "
            f"found {value!r}"
        )
    return value


def _require_input(graph: GraphInfo, name: str) -> str:
    if name not in graph.inputs:
        raise BundleError(
            f"graph: input {name!r} is missing; found {sorted(graph.inputs)}; accepted: "
            "a decoder with the onnxruntime-genai I/O contract"
        )
    return name


def recurrent_keys(config: ArchitectureConfig) -> dict[str, Any]:
    """The decoder keys of a model whose recurrent blocks genai_config declares (LFM2's conv
    layers), as onnxruntime-genai 0.18 reads them: `layer_types` (which layers have a KV cache)
    and the sizes of each state under its axis names (`conv_cache_size`); {} otherwise. States
    named from the KV patterns (gated delta nets) need no key: og finds them by name, and its
    builder writes none for Qwen3.5."""
    keys: dict[str, Any] = {}
    for block in declared_blocks():
        if block.layer_type in config.layer_types:
            keys["layer_types"] = list(config.layer_types)
            for state in block.states:
                keys.update(zip(state.axes, state.dims(config), strict=True))
    return keys


def _layers(
    names: Mapping[str, Any], role: str, side: str, expected: tuple[int, ...], layers: int
) -> str:
    family: LayerNames | None = layer_names(names, role)
    if family is None and not expected and role in KV_ROLES:
        # no attention layer (a Nemotron-H of Mamba2 and MLP layers): og 0.18 still reads the
        # KV patterns, naming the recurrent states after them; no graph input matches them
        past, present = FROM_KV_NAMES.names(role)
        return past if side == "input" else present
    if family is None or family.indices != expected:
        found = "none" if family is None else f"{family.pattern} for layers {list(family.indices)}"
        raise BundleError(
            f"graph: per-layer {side} {role} names: {found}; accepted: one per layer "
            f"{list(expected)}, the layers with this cache of num_hidden_layers={layers}"
        )
    return family.pattern


def _cache_layers(config: ArchitectureConfig) -> dict[str, tuple[int, ...]]:
    """Cache role → the layers that have it: "key"/"value" the attention layers, and each
    state genai_config names (LFM2's "conv") the layers of its block."""
    layers = range(config.num_hidden_layers)
    attention = tuple(i for i in layers if config.has_kv_cache(i))
    roles = {"key": attention, "value": attention}
    for block in declared_blocks():
        found = layers_of(config.layer_types, block.layer_type)
        if found:
            roles.update((state.suffix, found) for state in block.states)
    return roles


def _decoder_inputs(graph: GraphInfo, config: ArchitectureConfig) -> dict[str, str]:
    inputs = {
        "input_ids": _require_input(graph, "input_ids"),
        "attention_mask": _require_input(graph, "attention_mask"),
    }
    if "position_ids" in graph.inputs:
        inputs["position_ids"] = "position_ids"
    for role, expected in _cache_layers(config).items():
        inputs[f"past_{role}_names"] = _layers(
            graph.inputs, role, "input", expected, config.num_hidden_layers
        )
    return inputs


def _decoder_outputs(graph: GraphInfo, config: ArchitectureConfig) -> dict[str, str]:
    if "logits" not in graph.outputs:
        raise BundleError(
            f"graph: output 'logits' is missing; found {sorted(graph.outputs)}; accepted: "
            "a decoder with the onnxruntime-genai I/O contract"
        )
    outputs = {"logits": "logits"}
    for role, expected in _cache_layers(config).items():
        outputs[f"present_{role}_names"] = _layers(
            graph.outputs, role, "output", expected, config.num_hidden_layers
        )
    return outputs
