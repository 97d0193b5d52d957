"""Smoke test of a written bundle: onnxruntime-genai loads it and generates a few tokens.

On CPU the tokens must equal those of a plain onnxruntime greedy loop over the same graph,
feeding the KV cache by hand; that catches a genai_config that loads but wires the graph
wrongly. A bundle for an EP this onnxruntime-genai build lacks runs its graph on CPU instead
(DESIGN.md: the same graph runs once the providers are cleared); when its ops cannot run on
CPU either, the test is skipped with a note, not failed.

The test checks the bundle, not onnxruntime's kernels, and is kept cheap: onnxruntime-genai's
model is released before the reference loop loads the graph again, so only one copy of the
weights is in memory at a time, and for graphs without MatMulNBits both run with ORT's weight
prepacking off (``session.disable_prepacking``): the weights are then read from the mapped
external data file as they are used instead of being copied into packed buffers first, which
for a float model takes longer than generating the tokens. MatMulNBits keeps prepacking: its
unpacked fallback dequantizes every weight on every call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from mobius_genai.bundle.generate import greedy_tokens, load_model, load_tokenizer
from mobius_genai.bundle.graph import CACHE_ROLES, GraphInfo, layer_names
from mobius_genai.bundle.smoke_image import (
    ImagePrompt,
    has_vision,
    image_embedder,
    image_greedy,
    image_note,
)
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import EpCapabilities, get_ep
from mobius_genai.errors import BundleError

SMOKE_PROMPT = "The capital of France is"

# How onnxruntime-genai 0.18 says an EP is missing from this build (og.is_webgpu_available()
# answers True even where ORT lacks WebGPU, so the load error is the reliable signal).
_UNAVAILABLE = re.compile(
    r"not available|not supported in this build|not been built with|Unknown provider name"
    r"|Failed to load library"
)

#: Ops whose CPU kernels need prepacked weights to run at a usable speed.
_NEEDS_PREPACKING = frozenset({"com.microsoft::MatMulNBits"})
_NO_PREPACKING = {"session.disable_prepacking": "1"}

_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}

if TYPE_CHECKING:
    import onnxruntime_genai as og


@dataclasses.dataclass(frozen=True)
class SmokeResult:
    """Whether the smoke test ran, the tokens generated and a one-line note for the user."""

    ran: bool
    note: str
    tokens: tuple[int, ...] = ()


def smoke_test(folder: str | Path, ep: EpCapabilities, *, max_new_tokens: int = 8) -> SmokeResult:
    """Load the bundle in `folder` with onnxruntime-genai and generate `max_new_tokens` greedily.

    On CPU the tokens must equal a plain onnxruntime loop's. A bundle for an EP missing here
    runs its graph on CPU instead (genai's providers cleared), where the graph's ops allow;
    otherwise the test is skipped with a note.
    """
    folder = Path(folder)
    config = read_genai_config(folder)
    options = session_options(folder, config)
    try:
        prompt, tokens, text = _generate(folder, config, max_new_tokens, False, options)
    except BundleError as error:
        if ep.runtime.genai_provider is None or not _UNAVAILABLE.search(str(error)):
            raise
        return _smoke_on_cpu(folder, config, ep, max_new_tokens, options)
    note = f"smoke test: generated {len(tokens)} tokens {text!r}{_with_image(prompt)}"
    if ep.runtime.genai_provider is None:
        note += _compare(folder, config, prompt, tokens, options)
    return SmokeResult(True, note, tuple(tokens))


def session_options(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """ORT config entries for the smoke test's sessions: prepacking off unless an op needs it.

    An unreadable graph gets the defaults: loading it then fails with onnxruntime-genai's error.
    """
    try:
        graph = GraphInfo.from_file(folder / config["model"]["decoder"]["filename"])
    except BundleError:
        return {}
    return {} if graph.ops & _NEEDS_PREPACKING else dict(_NO_PREPACKING)


def _smoke_on_cpu(
    folder: Path,
    config: Mapping[str, Any],
    ep: EpCapabilities,
    max_new_tokens: int,
    options: Mapping[str, str],
) -> SmokeResult:
    """Skipped when the graph does not load on CPU (e.g. ops without CPU kernels); a graph that
    loads must generate, or the error is raised like any other bundle's."""
    missing = f"the {ep.name} EP ({ep.runtime.genai_provider}) is not available here"
    try:
        model = load_model(folder, cpu=True, session_options=options)
    except BundleError as error:
        cause = str(error.__cause__ or error).strip().splitlines()[0]
        return SmokeResult(False, f"smoke test skipped: {missing}, and on CPU: {cause}")
    prompt, tokens, text = _greedy(model, folder, config, max_new_tokens)
    del model  # released before the reference loop loads the graph again
    note = f"smoke test on CPU ({missing}): generated {len(tokens)} tokens {text!r}"
    note += _with_image(prompt)
    note += _compare(folder, config, prompt, tokens, options)
    return SmokeResult(True, note, tuple(tokens))


def _generate(
    folder: Path,
    config: Mapping[str, Any],
    max_new_tokens: int,
    cpu: bool,
    options: Mapping[str, str],
) -> tuple[list[int] | ImagePrompt, list[int], str]:
    """(prompt, generated ids, generated text) of a greedy run after SMOKE_PROMPT (or after
    an image prompt for a vision-language bundle).

    The model is loaded here and released on return, before any reference loop loads the
    graph again.
    """
    model = load_model(folder, cpu=cpu, session_options=options)
    return _greedy(model, folder, config, max_new_tokens)


def _greedy(
    model: og.Model, folder: Path, config: Mapping[str, Any], max_new_tokens: int
) -> tuple[list[int] | ImagePrompt, list[int], str]:
    if has_vision(config):
        return image_greedy(model, folder, config, max_new_tokens)
    tokenizer = load_tokenizer(model, folder)
    prompt = [int(token) for token in tokenizer.encode(SMOKE_PROMPT)]
    if not prompt:
        prompt = [config["model"].get("bos_token_id", 0)]
    max_length = min(len(prompt) + max_new_tokens, config["model"]["context_length"])
    tokens = greedy_tokens(model, prompt, max_length)
    return prompt, tokens, tokenizer.decode(tokens)


def _with_image(prompt: Sequence[int] | ImagePrompt) -> str:
    return image_note(prompt) if isinstance(prompt, ImagePrompt) else ""


def _compare(
    folder: Path,
    config: Mapping[str, Any],
    prompt: Sequence[int] | ImagePrompt,
    tokens: list[int],
    options: Mapping[str, str],
) -> str:
    """The note's tail when a plain onnxruntime loop agrees; BundleError when it does not."""
    model_path = folder / config["model"]["decoder"]["filename"]
    eos = config["model"].get("eos_token_id", [])
    eos_ids = eos if isinstance(eos, list) else [eos]
    embed = None
    if isinstance(prompt, ImagePrompt):
        embed = image_embedder(folder, config, prompt, options)
        prompt = prompt.input_ids
    reference = ort_greedy_tokens(model_path, prompt, len(tokens), eos_ids, options, embed=embed)
    if reference is None:
        return "; no onnxruntime reference loop for this dtype"
    if reference != tokens:
        pairs = enumerate(zip(tokens, reference, strict=False))
        first = next((i for i, (ours, theirs) in pairs if ours != theirs), len(reference))
        raise BundleError(
            f"smoke test: onnxruntime-genai generated {tokens} but a plain onnxruntime "
            f"loop over the same graph generated {reference} (first difference at "
            f"token {first}); genai_config.json does not drive the graph as built"
        )
    return ", same as a plain onnxruntime loop"


def ort_greedy_tokens(
    model_path: Path,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_ids: Iterable[int] = (),
    config_entries: Mapping[str, str] | None = None,
    *,
    embed: Callable[[Sequence[int]], Mapping[str, np.ndarray]] | None = None,
) -> list[int] | None:
    """Greedy tokens of a plain onnxruntime loop on CPU, or None when it cannot feed the graph.

    Independent of genai_config.json: names follow the graph contract (input_ids,
    attention_mask, position_ids, logits; past/present pairs matched by layer index and role),
    and each step feeds the new tokens, an all-ones mask, their positions and the previous
    step's present KV as past KV. None when the KV dtype has no numpy type (bfloat16) or the
    head dims are not static. `config_entries` are ORT session config entries. `embed` gives
    the extra inputs of a step's new tokens (a vision-language decoder's inputs_embeds).
    """
    options = ort.SessionOptions()
    for key, value in (config_entries or {}).items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(
        str(model_path), options, providers=[get_ep("cpu").runtime.ort_provider]
    )
    inputs = {value.name: value for value in session.get_inputs()}
    outputs = [value.name for value in session.get_outputs()]
    cache = _cache_pairs(inputs, outputs)
    past: dict[str, np.ndarray] = {}
    for past_name, _ in cache:
        value = inputs[past_name]
        kv_type = _NUMPY_TYPES.get(value.type)
        # a KV cache starts empty along its sequence axis; a recurrent state (rank 3) as zeros
        shape = (
            [1, *value.shape[1:]]
            if len(value.shape) == 3
            else [1, *value.shape[1:2], 0, *value.shape[3:]]
        )
        if kv_type is None or not all(isinstance(dim, int) for dim in shape):
            return None
        past[past_name] = np.zeros(shape, kv_type)
    eos = set(eos_ids)
    new, total, tokens = list(prompt_ids), len(prompt_ids), []
    for _ in range(max_new_tokens):
        feed = {"input_ids": _ints(inputs, "input_ids", [new]), **past}
        if embed is not None:
            feed.update(embed(new))
        if "attention_mask" in inputs:
            feed["attention_mask"] = _ints(inputs, "attention_mask", np.ones((1, total)))
        if "position_ids" in inputs:
            positions = np.arange(total - len(new), total)[None]
            feed["position_ids"] = _ints(inputs, "position_ids", positions)
        results = session.run(["logits", *(present for _, present in cache)], feed)
        token = int(np.argmax(results[0][0, -1]))
        tokens.append(token)
        past = {
            past_name: result for (past_name, _), result in zip(cache, results[1:], strict=True)
        }
        new, total = [token], total + 1
        if token in eos:
            break
    return tokens


def _cache_pairs(inputs: Mapping[str, Any], outputs: Sequence[str]) -> list[tuple[str, str]]:
    """(past input, present output) name pairs, matched by role and layer index."""
    pairs = []
    for role in CACHE_ROLES:
        past, present = layer_names(inputs, role), layer_names(outputs, role)
        if role == "conv" and past is None and present is None:
            continue  # only hybrid decoders have recurrent states
        if past is None or present is None or past.indices != present.indices:
            raise BundleError(
                f"graph: past/present {role} inputs and outputs do not pair up by layer"
            )
        pairs += [(past.pattern % i, present.pattern % i) for i in past.indices]
    return pairs


def _ints(inputs: Mapping[str, Any], name: str, values: Any) -> np.ndarray:
    return np.asarray(values, dtype=_NUMPY_TYPES.get(inputs[name].type, np.int64))
