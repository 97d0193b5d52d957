"""Which onnxruntime-genai 0.18 APIs run a bundle, and why og refuses the others.

Every fact here was checked on onnxruntime-genai 0.18 through its public API (tests/runtime/,
which runs each contract and expects these refusals), and where og's own builder writes the same
kind of bundle (a pruned LM head, lfm2, gated delta nets) on the builder's bundle too
(test_og_limits.py); the builder writes no CPU bundle of the other kinds that og runs, so those
rows quote og:

- A pruned LM head (`package --prune-lm-head`: logits [batch, 1, vocab]) is what og calls
  "Trimmed Prefill Logits". og.Generator samples from it, but og.Engine's static-batch decoder
  binds a logits buffer [batch, sequence, vocab] ("Got invalid dimensions for output: logits"),
  n-gram decoding needs the logits of every verified token, and `get_output("logits")` holds
  the last position only. The only position-selecting input og feeds (`logits_indices`) belongs
  to its paged-attention graphs (the builder's `use_paged_attention`: PagedAttention, CUDA or
  WebGPU, fp16/bf16, a flat token axis), not to the portable graphs mobius-genai writes.
- og.Engine runs the models og loads as plain decoders: a vision-language model.type (og's
  multimodal pipeline) and lfm2 are refused ("The model type is not supported for decoding").
  og's 0.18 builder writes no multimodal pipeline: of a Qwen2.5-VL checkpoint it writes the text
  decoder alone (model.type qwen2_5_vl_text, input_ids in, no images), or with exclude_embeds a
  lone inputs_embeds decoder (model.type qwen2_5_vl) that og.Model does not load ("Loading a
  model package from a directory path is not supported"). og.Engine takes the text decoder's
  model type but fails every turn of it: the Engine feeds 2-D position_ids, and the builder's
  vision-language and Qwen3.5 decoders take mrope's 3-D ones ("Invalid rank for input:
  position_ids Got: 2 Expected: 3"; beam search fails on them too). So og.Engine runs no
  bundle of a vision-language checkpoint, ours or the builder's, with other words for each.
- og.Engine's static batch (measured on 0.18 by echoing its feeds, tests/runtime/
  test_og_feeds.py) keeps requests of different lengths in one cache: input_ids right-padded
  to the most new tokens, each row's attention_mask ones over its own length and zeros after
  it, as long as the longest row's (a finished row's included), position_ids from the row's
  own length, past and present as long as the previous and the current mask. That is
  GroupQueryAttention's shared buffer, where each row's keys are contiguous. A graph that
  appends the new keys after the whole past (ONNX Attention's concatenation) puts a shorter
  row's key where its mask says 0 and reads padding where it says 1: other tokens than alone,
  with no error, and a failed batch once the longest request has finished (the mask stops
  growing, the concatenation does not: "The output OrtValue provided for output
  'present.0.key' ... has shape"). The information is in what og feeds, though: the portable
  graph now writes each token whose own concatenated slot the mask hides at its position,
  cuts the past to the mask's length, and counts sliding windows back from that slot
  (components/kv_slots.py, masks.py), which leaves og.Generator's feeds exactly as before; so
  og.Engine runs `default` and `onnx-standard` bundles too. Bundles written before keep the
  limit (`_unplaced_cache`: no ScatterElements in the graph).
- og's multimodal pipeline fails beam search (its embedding output is bound one token long per
  beam; the builder's vision-language bundle fails too) and, on a concatenated cache, rewind.
- Gated delta nets (model.type qwen3_5_text, qwen3_5_moe_text) load, but the Engine's
  static-batch decoder feeds no recurrent state ("Missing Input: ...conv_state"), whether og
  derives their names from the KV names (as mobius-genai leaves it) or genai_config declares
  them as og's builder does (`past_conv_names` / `past_recurrent_names` and their present_
  pair: the same "Missing Input", with the declared name). og 0.18 feeds them only through
  the builder's `state_groups` (`fixed_conv` / `fixed_recurrent`), which "require
  engine.dynamic_batching", whose packed execution takes paged attention's flat token axis
  ("Packed hybrid execution requires position_ids with dynamic int64 [num_tokens] or [3,
  num_tokens] geometry": the builder's CUDA/WebGPU paged graphs, not a portable one; checked
  on our qwen3_5_text bundle, test_og_limits.py). Their states cannot be rewound without a
  snapshot (rewind_to, n-gram verification), and beam search does not reorder them with the
  beams. og's builder's bundle of the same decoder (it reads the
  hub's Qwen3_5ForConditionalGeneration layout; its states named in genai_config, 3-D mrope
  position_ids) gives og.Generator the same greedy tokens, is refused rewind and n-gram
  decoding with the same words, and fails every og.Engine turn too, on its position_ids first
  ("Invalid rank for input: position_ids Got: 2 Expected: 3"), as it fails beam search.
- og's multimodal pipeline also continues the padded rows of a text batch from the wrong
  positions.
- og.Generator's append_tokens after generate_next_token runs only the appended tokens: the
  generated token, added to the sequence to be run by the next generate_next_token, never is.
  The positions count it (for mrope, past length plus the image's rope delta) but its keys are
  never written (in GroupQueryAttention's shared buffer the new tokens attend to a zero slot):
  logits of neither sequence, on every bundle (og's builder's too, test_og_limits.py). Where
  og rewinds the bundle, rewinding over the token and appending it with the new ones gives
  transformers' logits (tests/models/test_qwen_vl_append.py).
- og's multimodal pipeline runs the vision model, and computes mrope's 3-D positions, for a
  generator's first prompt only: a second set_inputs with an image runs without a word, its
  image tokens embedded as text at text positions (tests/models/test_qwen_vl_append.py). A new
  generator over the whole conversation, every image set at once, sees them all.
- Whisper (og's `whisper` type, tests/models/whisper/test_og_apis.py, against og's builder's
  Whisper bundle too): og.Engine, n-gram decoding and rewind are refused with og's words; a
  batch of audios runs when the forced prompts have one length, and a shorter prompt is padded
  inside itself; og.Generator's greedy, sampling, guidance, a prompt appended in parts, every
  prompt position's logits and beam search run.

`og_limits` is recorded in the manifest's build section (`og_limits`) and shown on the card;
`engine_support(folder)` answers for a bundle on disk (`run` and `chat` read it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mobius_genai.bundle.genai_config import CONFIG_FILENAME
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.recurrent import delta_layers
from mobius_genai.bundle.schema import read_bundle_json
from mobius_genai.kinds.og_types import og_type

ENGINE = "og.Engine"
NGRAM = "n-gram speculative decoding (GeneratorParams.set_speculative_options)"
ALL_LOGITS = 'Generator.get_output("logits") at every prompt position'
REWIND = "Generator.rewind_to"
BEAM = "beam search (num_beams > 1)"
BATCH = "batches of prompts of different lengths (batch_size > 1)"

#: The limits' order in the card and the manifest: the APIs users meet first.
APIS = (ENGINE, NGRAM, ALL_LOGITS, REWIND, BEAM, BATCH)

_Check = Callable[[Mapping[str, Any], GraphInfo], bool]


@dataclasses.dataclass(frozen=True)
class OgLimit:
    """APIs og 0.18 refuses for bundles where `applies`; `reason` says why, in og's terms
    (``{type}`` stands for the bundle's model.type)."""

    apis: tuple[str, ...]
    reason: str
    applies: _Check


def _pruned(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    name = config["model"]["decoder"].get("outputs", {}).get("logits", "logits")
    logits = graph.outputs.get(name)
    return logits is not None and logits.dim(1) == 1


def _multimodal(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    return "vision" in config["model"] or "embedding" in config["model"]


def _speech(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    return og_type(config["model"]["type"]).audio


def _concatenated_cache(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    return not config.get("search", {}).get("past_present_share_buffer", False)


def _unplaced_cache(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    """A concatenated cache without components/kv_slots.py's placement (its ScatterElements):
    a bundle written before mobius-genai placed each row's keys."""
    return _concatenated_cache(config, graph) and "ai.onnx::ScatterElements" not in graph.ops


#: The model types og 0.18 runs with its LFM2 model class (LFM2Cache: attention KV and conv states).
_LFM2_TYPES = frozenset({"lfm2", "lfm2_moe", "lfm2_vl"})


def _lfm2(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    return config["model"]["type"] in _LFM2_TYPES


def _delta_states(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    """Gated delta nets' states: named in genai_config (og's builder) or, as mobius-genai writes
    them, found by og from the KV names (bundle/recurrent.py)."""
    inputs = config["model"]["decoder"].get("inputs", {})
    if "past_recurrent_names" in inputs:
        return True
    return "past_key_names" in inputs and bool(delta_layers(inputs, graph))


def _mrope_positions(config: Mapping[str, Any], graph: GraphInfo) -> bool:
    name = config["model"]["decoder"].get("inputs", {}).get("position_ids", "position_ids")
    positions = graph.inputs.get(name)
    return positions is not None and positions.shape is not None and len(positions.shape) == 3


LIMITS: tuple[OgLimit, ...] = (
    OgLimit(
        (ENGINE, NGRAM, ALL_LOGITS),
        "the LM head is pruned to each sequence's last position (package --prune-lm-head; "
        "og: 'Using Trimmed Prefill Logits'), and these need every position's logits",
        _pruned,
    ),
    OgLimit(
        (ENGINE, NGRAM),
        "model.type {type} is a vision-language model; og 0.18 runs these two on plain "
        "decoder-only text models only ('The model type is not supported for decoding'; og's "
        "builder writes no such pipeline, only the text decoder alone, without images)",
        _multimodal,
    ),
    OgLimit(
        (ENGINE,),
        "model.type {type} is an encoder-decoder speech model; og 0.18's Engine runs "
        "decoder-only text models only ('The model type is not supported for decoding. "
        "Expected a decoder-only model.')",
        _speech,
    ),
    OgLimit(
        (NGRAM, REWIND),
        "og 0.18 refuses these for model.type {type} ('N-gram decoding requires a plain "
        "decoder-only text model in this release'; 'RewindTo is currently not supported for "
        "whisper'), for og's builder's Whisper bundle alike",
        _speech,
    ),
    OgLimit(
        (BATCH,),
        "og 0.18 pads a shorter forced prompt with the pad token inside the prompt (a row "
        "without <|notimestamps|> beside one with it continues from other tokens than alone; "
        "og's builder's Whisper bundle alike); audios with prompts of one length batch well",
        _speech,
    ),
    OgLimit(
        (BEAM,),
        "og 0.18's multimodal pipeline binds an embedding output one prompt long per beam "
        "('The output OrtValue provided for output 'inputs_embeds' ... has shape {{2,2,64}} but "
        "the computed output shape for this run is {{2,5,64}}'); og's builder's "
        "vision-language bundle fails beam search too",
        _multimodal,
    ),
    OgLimit(
        (BATCH,),
        "og 0.18's multimodal pipeline continues a padded row from other positions than the "
        "row alone (its first token agrees, the next ones differ); og's builder's Qwen2.5-VL "
        "bundle refuses text batches ('Not enough image_grid_thw data for image tokens')",
        _multimodal,
    ),
    OgLimit(
        (REWIND,),
        "og 0.18's multimodal pipeline does not cut a KV cache that grows by concatenation "
        "when it rewinds (onnxruntime: 'inconsistent total_sequence_length (between attn_mask "
        "and past_key ...)'); the same graph kind rewinds as a text-only bundle",
        lambda config, graph: _multimodal(config, graph) and _concatenated_cache(config, graph),
    ),
    OgLimit(
        (ENGINE,),
        "the KV cache grows by concatenation and this graph appends each request's keys after "
        "the longest request's past, where og 0.18's Engine does not look for them: shorter "
        "requests get other tokens than alone, and a batch fails once its longest request has "
        "finished; package the bundle again (mobius-genai now places them as og's mask says)",
        _unplaced_cache,
    ),
    OgLimit(
        (ENGINE, NGRAM, REWIND),
        "og 0.18 runs model.type {type} with a model class of its own (LFM2's), which these do not "
        "support ('The model type is not supported for decoding'; 'RewindTo is currently not "
        "supported for lfm2')",
        _lfm2,
    ),
    OgLimit(
        (ENGINE,),
        "og 0.18's static-batch Engine feeds no recurrent state to model.type {type} (the conv "
        "and recurrent states of its gated delta nets or Mamba2 layers: 'Missing Input: "
        "past_key_values.N.conv_state', also where genai_config declares them as og's builder "
        "does); it feeds them only in dynamic batching over paged attention's packed tokens, "
        "and og's builder's CPU bundle fails every turn too ('Invalid rank for input: "
        "position_ids')",
        _delta_states,
    ),
    OgLimit(
        (BEAM,),
        "og 0.18 does not reorder recurrent states with the beams (its RecurrentState updates "
        "without beam indices, unlike the KV cache): beam search gives other sequences than "
        "transformers' for model.type {type} (og's builder's bundle fails beam search: 'Got "
        "invalid dimensions for input: position_ids')",
        _delta_states,
    ),
    OgLimit(
        (ENGINE, BEAM),
        "the decoder takes mrope's 3-D position_ids (og's builder's vision-language and Qwen3.5 "
        "decoders), and og 0.18's Engine and beam search feed 2-D ones ('Invalid rank for "
        "input: position_ids Got: 2 Expected: 3'; 'Got invalid dimensions for input: "
        "position_ids')",
        _mrope_positions,
    ),
    OgLimit(
        (NGRAM, REWIND),
        "og 0.18 cannot rewind the recurrent states of model.type {type} without a snapshot "
        "('RecurrentState::RewindTo ... is not supported without a snapshot'; og's builder's "
        "bundle alike)",
        _delta_states,
    ),
)


def og_limits(config: Mapping[str, Any], graph: GraphInfo) -> dict[str, str]:
    """The og 0.18 APIs that do not run the bundle of genai_config `config` and decoder
    `graph`, each with the first reason that applies; {} when every API runs it."""
    found: dict[str, str] = {}
    for limit in LIMITS:
        if limit.applies(config, graph):
            reason = limit.reason.format(type=config["model"]["type"])
            for api in limit.apis:
                found.setdefault(api, reason)
    return {api: found[api] for api in APIS if api in found}


def bundle_og_limits(folder: str | Path) -> dict[str, str]:
    """`og_limits` of the bundle in `folder` (its genai_config and decoder graph)."""
    folder = Path(folder)
    config = read_bundle_json(folder / CONFIG_FILENAME)
    graph = GraphInfo.from_file(folder / config["model"]["decoder"]["filename"])
    return og_limits(config, graph)


def engine_support(folder: str | Path) -> str | None:
    """None when og.Engine runs the bundle in `folder`, else why not (one line)."""
    reason = bundle_og_limits(folder).get(ENGINE)
    return None if reason is None else f"{ENGINE} does not run this bundle: {reason}"
