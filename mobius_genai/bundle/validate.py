"""Check a bundle folder, ours or another tool's: schema, files, graph I/O against the config.

The graph is read without its weights, so validating a 70B bundle takes seconds (plus the
checksums of the manifest, when there is one and hashes are checked, and a fraction of a second
for onnxruntime-genai to render the chat template in a process of its own: `chat_template`). Every problem found is
reported in one BundleError that names the file or field, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json
from mobius_genai.bundle.bundle_folder import checkpoint_hint
from mobius_genai.bundle.chat_template import check_chat_template
from mobius_genai.bundle.genai_config import CONFIG_FILENAME, check_token_ids
from mobius_genai.bundle.graph import GraphInfo, TensorSpec
from mobius_genai.bundle.manifest import MANIFEST_FILENAME, sha256_file
from mobius_genai.bundle.mtp_config import MAIN_HIDDEN_STATES
from mobius_genai.bundle.og_support import og_limits
from mobius_genai.bundle.recurrent import (
    check_declared_states,
    check_derived_states,
    kv_layers,
)
from mobius_genai.bundle.schema import read_bundle_json
from mobius_genai.bundle.tool_tokens import check_tool_token_ids
from mobius_genai.ep import ep_registry
from mobius_genai.errors import BundleError
from mobius_genai.kinds.og_types import (
    OG_OPTIONAL_SECTIONS,
    OG_OWN_LAYERS,
    OG_PROCESSOR_FILES,
    OG_SECTIONS,
    og_type,
)

#: genai's defaults for the decoder I/O names a config may leave out.
DEFAULT_INPUTS = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "past_key_names": "past_key_values.%d.key",
    "past_value_names": "past_key_values.%d.value",
}
DEFAULT_OUTPUTS = {
    "logits": "logits",
    "present_key_names": "present.%d.key",
    "present_value_names": "present.%d.value",
}

#: The decoder input the embedding graph feeds (og's default name).
_INPUTS_EMBEDS = "inputs_embeds"

TOKENIZER_CHOICES = ("tokenizer.json", "tokenizer.model")

_INTEGER = re.compile(r"-?[0-9]{1,18}")
_DRIVE = re.compile(r"[A-Za-z]:")

#: genai_config keys naming a file or folder that onnxruntime-genai opens, relative to the
#: bundle folder (decoder, encoder, vision, speech, ... filenames; adapters; tokenizer_dir;
#: session_options.custom_ops_library); every one must stay inside the bundle.
PATH_KEYS = frozenset(
    {
        "filename",
        "config_filename",
        "adapter_filename",
        "data_file",
        "tokenizer_dir",
        "custom_ops_library",
    }
)


@dataclasses.dataclass(frozen=True)
class BundleReport:
    """What a valid bundle holds: its config, its decoder graph and its manifest (if any)."""

    folder: Path
    genai_config: dict[str, Any]
    graph: GraphInfo
    manifest: dict[str, Any] | None


def read_genai_config(folder: Path) -> dict[str, Any]:
    """genai_config.json of `folder`, parsed and checked against the schema
    (`schema.read_bundle_json`)."""
    path = folder / CONFIG_FILENAME
    if not path.is_file():
        raise BundleError(
            f"{folder}: {CONFIG_FILENAME} is missing; a bundle needs one{checkpoint_hint(folder)}"
        )
    return read_bundle_json(path)


def validate_bundle(folder: str | Path, *, check_hashes: bool = True) -> BundleReport:
    """Check the bundle in `folder`; raise BundleError listing every problem found.

    `check_hashes=False` skips re-hashing the files listed in mobius_manifest.json.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BundleError(f"{folder}: not a folder; accepted: a bundle folder")
    config = read_genai_config(folder)
    outside = [
        f"{field}: {value!r} is not a path inside the bundle folder; accepted: a relative path "
        "without '..' that stays inside it"
        for field, value in _config_paths(config)
        if value and not _inside(folder, folder, value)
    ]
    if outside:
        raise BundleError(f"bundle {folder}: {CONFIG_FILENAME}: " + "; ".join(outside))
    decoder = config["model"]["decoder"]
    model_path = folder / decoder["filename"]
    if not model_path.is_file():
        raise BundleError(
            f"{CONFIG_FILENAME}: model.decoder.filename {decoder['filename']!r} is not a file "
            f"in {folder}"
        )
    graph = GraphInfo.from_file(model_path)
    problems = [
        *_check_external_data(folder, model_path.parent, graph),
        *check_graph_against_config(config, graph),
        *check_runtime_settings(config, graph),
        *check_pipeline_graphs(folder, config, graph),
    ]
    vocab, source = _vocabulary(config, graph)
    tokenizer_problems = check_tokenizer(folder, vocab, source)
    problems += tokenizer_problems or _check_chat_template(folder)
    problems += check_tool_token_ids(config["model"], folder)
    manifest = None
    if (folder / MANIFEST_FILENAME).is_file():
        manifest = read_bundle_json(folder / MANIFEST_FILENAME)
        problems += _check_manifest_files(folder, manifest, check_hashes)
        problems += _check_og_limits(manifest["build"].get("og_limits"), og_limits(config, graph))
    if problems:
        raise BundleError(f"bundle {folder}: " + "; ".join(problems))
    return BundleReport(folder, config, graph, manifest)


def check_graph_against_config(config: Mapping[str, Any], graph: GraphInfo) -> list[str]:
    """Problems between genai_config's decoder section and the graph's inputs and outputs."""
    model = config["model"]
    decoder = model["decoder"]
    inputs = {**DEFAULT_INPUTS, **decoder.get("inputs", {})}
    outputs = {**DEFAULT_OUTPUTS, **decoder.get("outputs", {})}
    layers = kv_layers(decoder, inputs, graph)
    source = "model.decoder." + (
        "layer_types (attention layers)"
        if "layer_types" in decoder
        else "num_hidden_layers (less recurrent layers)"
        if len(layers) < decoder["num_hidden_layers"]
        else "num_hidden_layers"
    )
    problems = []
    listed = decoder.get("inputs", {})
    for key in ("input_ids", *sorted(listed.keys() & {"attention_mask", "position_ids"})):
        if inputs[key] not in graph.inputs:
            problems.append(_missing("inputs", key, inputs[key], "input", graph.inputs))
    if outputs["logits"] not in graph.outputs:
        problems.append(_missing("outputs", "logits", outputs["logits"], "output", graph.outputs))
    for side, names, key, role in (
        ("inputs", graph.inputs, "past_key_names", "key"),
        ("inputs", graph.inputs, "past_value_names", "value"),
        ("outputs", graph.outputs, "present_key_names", "key"),
        ("outputs", graph.outputs, "present_value_names", "value"),
    ):
        pattern = (inputs if side == "inputs" else outputs)[key]
        problems += _check_layers(
            f"model.decoder.{side}.{key}", pattern, names, role, layers, source
        )
    problems += check_declared_states(decoder, inputs, outputs, graph)
    problems += _check_positions(model["type"], graph.inputs.get(inputs["position_ids"]))
    problems += check_derived_states(inputs, outputs, graph)
    first_past = inputs["past_key_names"].replace("%d", str(layers[0] if layers else 0))
    if first_past in graph.inputs:
        problems += _check_kv_shape(decoder, first_past, graph.inputs[first_past])
    cache_heads = {
        graph.inputs[name].dim(1)
        for name in (inputs["past_key_names"].replace("%d", str(i)) for i in layers)
        if name in graph.inputs and graph.inputs[name].shape is not None
    }
    problems += _check_sizes(model, inputs["input_ids"], graph, cache_heads - {None})
    problems += _check_vocab(model.get("vocab_size"), outputs["logits"], graph)
    vocab, source = _vocabulary(config, graph)
    if vocab is not None:
        problems += check_token_ids(_config_token_ids(model), vocab, source)
    return problems


def check_runtime_settings(config: Mapping[str, Any], graph: GraphInfo) -> list[str]:
    """Buffer sharing needs GroupQueryAttention; graph capture needs buffer sharing; the
    provider options name the provider the graph was built for (or none: CPU)."""
    share = config.get("search", {}).get("past_present_share_buffer", False)
    session = config["model"]["decoder"].get("session_options", {})
    problems = _check_provider(session.get("provider_options", []), graph.built_for)
    if share and not graph.has_gqa:
        problems.append(
            "search.past_present_share_buffer: true but the graph has no "
            "com.microsoft::GroupQueryAttention; accepted: false for this graph"
        )
    elif share and not graph.shares_kv_buffer:
        problems.append(
            "search.past_present_share_buffer: true but some layers attend with standard "
            "Attention, whose present outgrows a shared buffer; accepted: false for this graph"
        )
    for provider, option in _captured(session.get("provider_options", [])):
        if not share:
            problems.append(
                f"model.decoder.session_options.provider_options.{provider}.{option}: graph "
                "capture is on but search.past_present_share_buffer is not true; accepted: "
                f'{option} "0", or a GroupQueryAttention graph sharing the KV buffer'
            )
    return problems


def _check_provider(provider_options: list[Mapping[str, Any]], built_for: str | None) -> list[str]:
    """A graph built for an EP with a genai provider runs under that provider, or on CPU."""
    caps = ep_registry.get(built_for) if built_for else None
    if caps is None or caps.runtime.genai_provider is None:
        return []
    named = [provider for entry in provider_options for provider in entry]
    wrong = [provider for provider in named if provider != caps.runtime.genai_provider]
    if not wrong:
        return []
    return [
        f"model.decoder.session_options.provider_options names {wrong[0]!r} but the graph was "
        f"built for {caps.name}; accepted: {caps.runtime.genai_provider!r}, or none (CPU)"
    ]


def _captured(provider_options: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(provider, option) for each provider whose graph capture the options turn on."""
    captured = []
    for entry in provider_options:
        for provider, options in entry.items():
            caps = ep_registry.by_genai_provider(provider)
            if caps is None or caps.graph_capture_option is None:
                continue
            default = "1" if caps.graph_capture_unless_disabled else "0"
            if options.get(caps.graph_capture_option, default) == "1":
                captured.append((provider, caps.graph_capture_option))
    return captured


def check_pipeline_graphs(folder: Path, config: Mapping[str, Any], decoder: GraphInfo) -> list[str]:
    """The files the og type reads by name; model.vision / model.embedding / model.encoder:
    each graph is a file of the bundle with its weights,
    has the inputs and outputs the section names (genai's defaults for those it leaves out)
    and no input genai would not feed; the vision section's processor config is a file; the
    decoder takes the embedding graph's output."""
    model = config["model"]
    layers = model["decoder"].get("num_hidden_layers", 0)
    problems = [
        f"{name!r} is not a file in {folder}; onnxruntime-genai's {model['type']!r} type reads it"
        for name in og_type(model["type"]).required_files
        if not (folder / name).is_file()
    ]
    for section, (default_inputs, default_outputs) in OG_SECTIONS.items():
        entry = model.get(section)
        if entry is None or "pipeline" in entry:  # no such graph, or several (not checked)
            continue
        if section in OG_OPTIONAL_SECTIONS and not entry.get("filename"):
            continue  # a section that turns its graph off
        path = folder / entry.get("filename", "")
        if not entry.get("filename") or not path.is_file():
            problems.append(
                f"model.{section}.filename: {entry.get('filename')!r} is not a file in {folder}"
            )
            continue
        graph = GraphInfo.from_file(path)
        problems += _check_external_data(folder, path.parent, graph)
        count = entry.get("num_hidden_layers", 1) if section in OG_OWN_LAYERS else layers
        inputs = {**default_inputs, **entry.get("inputs", {})}
        outputs = {**default_outputs, **entry.get("outputs", {})}
        for side, names, kind, found in (
            ("inputs", inputs, "input", graph.inputs),
            ("outputs", outputs, "output", graph.outputs),
        ):
            problems += [
                _missing(side, key, name, kind, found, section)
                for key, pattern in names.items()
                for name in _per_layer(pattern, count)
                if name not in found
            ]
        fed = {name for pattern in inputs.values() for name in _per_layer(pattern, count)}
        problems += [
            f"{entry['filename']}: graph input {name!r} is not fed by onnxruntime-genai; "
            f"accepted: the names of model.{section}.inputs {sorted(fed)}"
            for name in graph.inputs
            if name not in fed
        ]
    for section, default in OG_PROCESSOR_FILES.items():
        processor = model.get(section, {}).get("config_filename", default)
        if section in model and not (folder / processor).is_file():
            problems.append(
                f"model.{section}.config_filename: {processor!r} is not a file in {folder}; "
                "the multimodal processor reads its transforms from it"
            )
    hidden = model.get("mtp", {}).get("main_hidden_states", MAIN_HIDDEN_STATES)
    if "mtp" in model and hidden not in decoder.outputs:
        problems.append(_missing("outputs", "hidden_states", hidden, "output", decoder.outputs))
    embeds = model["decoder"].get("inputs", {}).get(_INPUTS_EMBEDS, _INPUTS_EMBEDS)
    if "embedding" in model and embeds not in decoder.inputs:
        problems.append(_missing("inputs", _INPUTS_EMBEDS, embeds, "input", decoder.inputs))
    width = decoder.inputs[embeds].dim(2) if embeds in decoder.inputs else None
    if width is not None and width != model["decoder"]["hidden_size"]:  # og sizes it by that
        problems.append(
            f"model.decoder.hidden_size: {model['decoder']['hidden_size']} but graph input "
            f"{embeds!r} is {width} wide; onnxruntime-genai sizes inputs_embeds and "
            "image_features by decoder.hidden_size"
        )
    return problems


def _missing(
    side: str,
    key: str,
    name: str,
    kind: str,
    found: Mapping[str, Any],
    section: str = "decoder",
) -> str:
    return (
        f"model.{section}.{side}.{key}: {name!r} is not a graph {kind}; graph {kind}s: "
        f"{sorted(found)[:8]}{' ...' if len(found) > 8 else ''}"
    )


def _check_layers(
    field: str,
    pattern: str,
    names: Mapping[str, Any],
    role: str,
    layers: tuple[int, ...],
    source: str,
) -> list[str]:
    """`pattern` names one graph input/output per layer in `layers` (those with a KV cache,
    counted by `source`: num_hidden_layers, or the attention layers of layer_types)."""
    try:
        expected = [pattern % i for i in layers]
    except (TypeError, ValueError):
        return [f"{field}: {pattern!r} has no single %d for the layer index"]
    missing = [name for name in expected if name not in names]
    if missing:
        return [
            f"{field}: graph lacks {missing[:3]}{' ...' if len(missing) > 3 else ''} for "
            f"{source}={len(layers)}"
        ]
    entries = re.compile(re.escape(pattern).replace("%d", r"\d+"))
    count = sum(1 for name in names if entries.fullmatch(name))
    if count != len(layers):
        return [f"{source}: {len(layers)} but the graph has {count} {pattern!r} entries"]
    return []


def _per_layer(pattern: str, layers: int) -> list[str]:
    """A section's name, or one per decoder layer where it holds "%d" (cross caches)."""
    return [pattern % i for i in range(layers)] if "%d" in pattern else [pattern]


def _check_positions(model_type: str, spec: TensorSpec | None) -> list[str]:
    """The position_ids input has the rank onnxruntime-genai feeds for `model_type`."""
    if spec is None or spec.shape is None:
        return []
    three_d = len(spec.shape) == 3 and spec.dim(0) == 3
    fed_three_d = og_type(model_type).three_d_positions
    if three_d == fed_three_d and len(spec.shape) in (2, 3):
        return []
    found = "[3, batch, seq]" if three_d else f"rank {len(spec.shape)}"
    fed = "[3, batch, seq]" if fed_three_d else "[batch, seq]"
    return [
        f"graph input 'position_ids' is {found} but onnxruntime-genai feeds model.type "
        f"{model_type!r} positions {fed}"
    ]


def _logits_width(logits: str, graph: GraphInfo) -> int | None:
    spec = graph.outputs.get(logits)
    if spec is None or not spec.shape:
        return None
    return spec.dim(len(spec.shape) - 1)


def _check_sizes(
    model: Mapping[str, Any], input_ids: str, graph: GraphInfo, cache_heads: set[int]
) -> list[str]:
    """Head counts, hidden size and context length against what the graph's ops fix. Layers
    may have their own key/value heads where their past inputs state them (og 0.18 reads each
    layer's cache shape from the graph: Gemma 4's full layers); genai_config's are the first
    layer's (checked with its cache shape)."""
    decoder = model["decoder"]
    problems = [
        f"model.decoder.{field}: {decoder[field]} but the graph's attention has {sorted(found)} "
        f"{what}"
        for field, found, what, allowed in (
            ("num_attention_heads", graph.attention_heads, "heads", set()),
            ("num_key_value_heads", graph.attention_kv_heads, "key/value heads", cache_heads),
        )
        if found and not found <= {decoder[field]} | allowed
    ]
    widths = graph.embedding_widths.get(input_ids, frozenset())
    if widths and decoder["hidden_size"] not in widths:
        problems.append(
            f"model.decoder.hidden_size: {decoder['hidden_size']} but graph input {input_ids!r} "
            f"gathers embeddings of width {' and '.join(map(str, sorted(widths)))}"
        )
    positions = graph.rotary_positions
    if positions is not None and model["context_length"] > positions:
        problems.append(
            f"model.context_length: {model['context_length']} but the graph's rotary cos/sin "
            f"tables cover {positions} positions; accepted: at most {positions}"
        )
    return problems


def _check_vocab(vocab: int | None, logits: str, graph: GraphInfo) -> list[str]:
    found = _logits_width(logits, graph)
    if vocab is None or found is None or found == vocab:
        return []
    return [f"model.vocab_size: {vocab} but graph output {logits!r} has {found} logits per token"]


def _vocabulary(config: Mapping[str, Any], graph: GraphInfo) -> tuple[int | None, str]:
    """The ids a token may have: the logits per token, else model.vocab_size; and its source."""
    model = config["model"]
    logits = {**DEFAULT_OUTPUTS, **model["decoder"].get("outputs", {})}["logits"]
    width = _logits_width(logits, graph)
    if width is not None:
        return width, f"graph output {logits!r}"
    vocab = model.get("vocab_size")
    return (vocab, "model.vocab_size") if isinstance(vocab, int) else (None, "")


def _check_kv_shape(decoder: Mapping[str, Any], name: str, spec: TensorSpec) -> list[str]:
    """The past KV layout is [batch, kv_heads, past_seq, head_size]; check its static dims."""
    if spec.shape is None:
        return []
    if len(spec.shape) != 4:
        return [
            f"graph input {name!r}: rank {len(spec.shape)}; accepted: 4 (batch, kv_heads, seq, head_size)"
        ]
    problems = []
    for field, axis in (("num_key_value_heads", 1), ("head_size", 3)):
        found = spec.dim(axis)
        if found is not None and found != decoder[field]:
            problems.append(
                f"model.decoder.{field}: {decoder[field]} but graph input {name!r} has "
                f"{found} at dim {axis}"
            )
    return problems


def _check_external_data(bundle: Path, folder: Path, graph: GraphInfo) -> list[str]:
    """The graph's external data files (relative to `folder`, the graph's) are in `bundle`."""
    problems = []
    for location, needed in sorted(graph.external_data.items()):
        path = folder / location
        if not _inside(bundle, folder, location):
            problems.append(f"{location}: outside the bundle folder; accepted: a file in it")
        elif not path.is_file():
            problems.append(f"{location}: missing; the graph reads its weights from it")
        elif path.stat().st_size < needed:
            problems.append(
                f"{location}: {path.stat().st_size} bytes but the graph reads up to byte "
                f"{needed} (truncated?)"
            )
    return problems


#: Tokenizer files onnxruntime-genai parses as JSON when it loads the tokenizer.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer(folder: Path) -> bool:
    """Whether `folder` holds a tokenizer og.Tokenizer can load (one of TOKENIZER_CHOICES)."""
    return any((folder / name).is_file() for name in TOKENIZER_CHOICES)


def check_tokenizer(folder: Path, vocab: int | None, source: str) -> list[str]:
    """Problems of the tokenizer files og.Tokenizer loads: none present, not JSON, or added
    tokens whose ids are outside [0, `vocab`) (`source` says where `vocab` comes from)."""
    if not has_tokenizer(folder):
        return [f"tokenizer: none of {list(TOKENIZER_CHOICES)} present; og.Tokenizer needs one"]
    problems = []
    for name in TOKENIZER_JSON:
        if not (folder / name).is_file():
            continue
        try:
            document = read_json(folder / name, BundleError, name)
        except BundleError as error:
            problems.append(f"{error}; og.Tokenizer cannot load it")
            continue
        if vocab is not None:
            problems += check_token_ids(_added_token_ids(name, document), vocab, source)
    return problems


def _check_chat_template(folder: Path) -> list[str]:
    """The chat template's problems: above its size bound, or crashing (or hanging)
    onnxruntime-genai's template engine when rendered in a process of its own."""
    try:
        check_chat_template(folder)
    except BundleError as error:
        return [str(error).removeprefix(f"{folder}: ")]
    return []


def _config_token_ids(model: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """genai_config's bos / eos / pad ids (eos may be a list)."""
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = model.get(key)
        for token_id in value if isinstance(value, list) else [value]:
            yield f"model.{key}", token_id


def _added_token_ids(name: str, document: Any) -> Iterator[tuple[str, Any]]:
    """The added tokens of tokenizer.json (`added_tokens`) and tokenizer_config.json
    (`added_tokens_decoder`, keyed by the id as a string)."""
    if not isinstance(document, dict):
        return
    entries = document.get("added_tokens")
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            yield f"{name}: added token {entry.get('content')!r}", entry.get("id")
    decoder = document.get("added_tokens_decoder")
    for key, entry in decoder.items() if isinstance(decoder, dict) else []:
        content = entry.get("content") if isinstance(entry, dict) else None
        token_id = int(key) if _INTEGER.fullmatch(key) else key
        yield f"{name}: added token {content!r}", token_id


def _check_og_limits(recorded: Mapping[str, str] | None, found: Mapping[str, str]) -> list[str]:
    """The manifest's (and so the card's) onnxruntime-genai limits must be the bundle's."""
    if recorded is None or dict(recorded) == dict(found):
        return []
    return [
        f"{MANIFEST_FILENAME}: build.og_limits names {sorted(recorded)}, but the bundle gives "
        f"up {sorted(found)} (bundle/og_support.py)"
    ]


def _check_manifest_files(folder: Path, manifest: Mapping[str, Any], hashes: bool) -> list[str]:
    problems = []
    for name, entry in manifest["files"].items():
        path = folder / name
        if not _inside(folder, folder, name):
            problems.append(f"{name}: listed in {MANIFEST_FILENAME} but outside the bundle folder")
        elif not path.is_file():
            problems.append(f"{name}: listed in {MANIFEST_FILENAME} but missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(
                f"{name}: {path.stat().st_size} bytes, {MANIFEST_FILENAME} says {entry['size']}"
            )
        elif hashes and sha256_file(path) != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from {MANIFEST_FILENAME} (file changed)")
    return problems


def _config_paths(document: Any) -> Iterator[tuple[str, str]]:
    """(dotted field, value) of every PATH_KEYS string in genai_config, at any depth (walked
    without recursion: a free-form section may nest as deep as the JSON reader allows)."""
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        where, node = pending.pop()
        if isinstance(node, dict):
            items: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        for key, value in items:
            field = f"{where}.{key}" if where else str(key)
            if key in PATH_KEYS and isinstance(value, str):
                yield field, value
            else:
                pending.append((field, value))


def _inside(bundle: Path, base: Path, relative: str) -> bool:
    """Whether `relative` (to `base`) names a path inside `bundle`: not absolute, no '..'
    component (onnxruntime-genai's own rule), and not leading out through a link."""
    parts = re.split(r"[/\\]", relative)
    if relative.startswith(("/", "\\")) or _DRIVE.match(relative) or ".." in parts:
        return False
    return (base / relative).resolve().is_relative_to(bundle.resolve())
