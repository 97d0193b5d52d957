"""The smoke test's own process: onnxruntime-genai generates a few tokens from a bundle.

`smoke.smoke_test` runs this module in a process of its own (`_child_process`), writes
one JSON request to its stdin and reads one JSON answer from its stdout, so a native crash in
onnxruntime-genai (it segfaults, for one, on a chat template with a long Jinja comment) ends
this process, not `package`. Only onnxruntime-genai, onnxruntime and numpy are imported here,
not the graph-building stack.

On CPU the tokens must equal those of a plain onnxruntime greedy loop over the same graph,
feeding the KV cache by hand; that catches a genai_config that loads but wires the graph
wrongly. A bundle for an EP this onnxruntime-genai build lacks runs its graph on CPU instead
(DESIGN.md: the same graph runs once the providers are cleared); when its ops cannot run on
CPU either, the test is skipped with a note, not failed. Every step's logits must be finite,
in both loops. onnxruntime-genai's model is released before the reference loop loads the graph
again, so one copy of the weights is in memory at a time.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mobius_genai._child_process import PHASE_PREFIX, exit_with_parent
from mobius_genai._json import read_json
from mobius_genai.bundle._og_errors import PROVIDER_UNAVAILABLE
from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.bundle.graph import KV_ROLES, cache_roles, layer_names
from mobius_genai.errors import BundleError
from mobius_genai.runtime.audio import has_audio
from mobius_genai.runtime.generate import (
    greedy_tokens,
    load_model,
    load_tokenizer,
    require_finite,
)
from mobius_genai.runtime.mtp import smoke_mtp
from mobius_genai.runtime.ort_session import ort_session
from mobius_genai.runtime.smoke_audio import AudioPrompt, audio_greedy, audio_note, cross_caches
from mobius_genai.runtime.smoke_image import (
    ImagePrompt,
    has_vision,
    image_embedder,
    image_greedy,
    image_note,
)

if TYPE_CHECKING:
    import onnxruntime_genai as og

SMOKE_PROMPT = "The capital of France is"

_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}

_report_phases = False


def run_smoke(
    folder: str | Path,
    ep_name: str,
    genai_provider: str | None,
    session_options: Mapping[str, str],
    max_new_tokens: int = 8,
    cpu_refusal: str | None = None,
    *,
    cpu_provider: str,
) -> dict[str, Any]:
    """Generate `max_new_tokens` greedily from the bundle in `folder`, made for the EP `ep_name`
    (onnxruntime-genai provider `genai_provider`, None for CPU), with `session_options` (ORT
    config entries) laid over the bundle's. `cpu_refusal` says why the graph cannot run on
    onnxruntime's CPU provider (None: it can); where the EP is missing, the test is then skipped.
    `cpu_provider` is onnxruntime's name of its CPU EP (the reference loop's), passed in so that
    this process need not import the EP tables.

    Returns {"ran", "note", "tokens"}; a bundle that fails is a BundleError.
    """
    folder = Path(folder)
    config = read_json(folder / "genai_config.json", BundleError, "genai_config.json")
    try:
        prompt, tokens, text = _generate(folder, config, max_new_tokens, False, session_options)
    except BundleError as error:
        if genai_provider is None or not PROVIDER_UNAVAILABLE.search(str(error)):
            raise
        missing = f"the {_ep_words(ep_name, genai_provider)} is not available here"
        if cpu_refusal is not None:
            return {"ran": False, "note": f"smoke test skipped: {missing}, and {cpu_refusal}"}
        return _smoke_on_cpu(folder, config, missing, max_new_tokens, session_options, cpu_provider)
    note = f"smoke test: generated {len(tokens)} tokens {text!r}{_with_image(prompt)}"
    if genai_provider is None:
        note += _compare(folder, config, prompt, tokens, session_options, cpu_provider)
    answer = {"ran": True, "note": note, "tokens": tokens}
    if "mtp" in config["model"] and isinstance(prompt, list):
        _phase("generating with the MTP head (og.MtpGenerator)")
        answer["mtp"] = smoke_mtp(folder, prompt, tokens, session_options)
    return answer


def _ep_words(ep_name: str, genai_provider: str) -> str:
    """The EP's name, with onnxruntime-genai's provider name after it only where that is
    another word (not "cuda EP (cuda)")."""
    if genai_provider.lower() == ep_name.lower():
        return f"{ep_name} EP"
    return f"{ep_name} EP ({genai_provider})"


def _smoke_on_cpu(
    folder: Path,
    config: Mapping[str, Any],
    missing: str,
    max_new_tokens: int,
    options: Mapping[str, str],
    cpu_provider: str,
) -> dict[str, Any]:
    """Skipped when the graph does not load on CPU (e.g. ops without CPU kernels); a graph that
    loads must generate, or the error is raised like any other bundle's."""
    try:
        _phase("loading the bundle on CPU")
        model = load_model(folder, cpu=True, session_options=options)
    except BundleError as error:
        cause = str(error.__cause__ or error).strip().splitlines()[0]
        return {"ran": False, "note": f"smoke test skipped: {missing}, and on CPU: {cause}"}
    prompt, tokens, text = _greedy(model, folder, config, max_new_tokens)
    del model  # released before the reference loop loads the graph again
    note = f"smoke test on CPU ({missing}): generated {len(tokens)} tokens {text!r}"
    note += _with_image(prompt)
    note += _compare(folder, config, prompt, tokens, options, cpu_provider)
    return {"ran": True, "note": note, "tokens": tokens}


def _generate(
    folder: Path,
    config: Mapping[str, Any],
    max_new_tokens: int,
    cpu: bool,
    options: Mapping[str, str],
) -> tuple[list[int] | ImagePrompt | AudioPrompt, list[int], str]:
    """(prompt, generated ids, generated text) of a greedy run after SMOKE_PROMPT (or after
    an image prompt for a vision-language bundle, a tone for a speech bundle).

    The model is loaded here and released on return, before any reference loop loads the
    graph again.
    """
    _phase("loading the bundle")
    model = load_model(folder, cpu=cpu, session_options=options)
    return _greedy(model, folder, config, max_new_tokens)


def _greedy(
    model: og.Model, folder: Path, config: Mapping[str, Any], max_new_tokens: int
) -> tuple[list[int] | ImagePrompt | AudioPrompt, list[int], str]:
    if has_audio(config):
        _phase("transcribing generated audio")
        return audio_greedy(model, folder, config, max_new_tokens)
    if has_vision(config):
        _phase("generating with an image")
        return image_greedy(model, folder, config, max_new_tokens)
    _phase("creating the tokenizer")
    tokenizer = load_tokenizer(model, folder)
    prompt = with_bos(tokenizer.encode(SMOKE_PROMPT), required_bos(folder))
    if not prompt:
        prompt = [config["model"].get("bos_token_id", 0)]
    max_length = min(len(prompt) + max_new_tokens, config["model"]["context_length"])
    _phase("generating")
    tokens = greedy_tokens(model, prompt, max_length)
    return prompt, tokens, tokenizer.decode(tokens)


def _with_image(prompt: Sequence[int] | ImagePrompt | AudioPrompt) -> str:
    if isinstance(prompt, AudioPrompt):
        return audio_note(prompt)
    return image_note(prompt) if isinstance(prompt, ImagePrompt) else ""


def _compare(
    folder: Path,
    config: Mapping[str, Any],
    prompt: Sequence[int] | ImagePrompt | AudioPrompt,
    tokens: list[int],
    options: Mapping[str, str],
    cpu_provider: str,
) -> str:
    """The note's tail when a plain onnxruntime loop agrees; BundleError when it does not."""
    model_path = folder / config["model"]["decoder"]["filename"]
    eos = config["model"].get("eos_token_id", [])
    eos_ids = eos if isinstance(eos, list) else [eos]
    embed = None
    if isinstance(prompt, ImagePrompt):
        embed = image_embedder(folder, config, prompt, options, cpu_provider)
        prompt = prompt.input_ids
    elif isinstance(prompt, AudioPrompt):
        embed = cross_caches(folder, config, prompt, options, cpu_provider)
        prompt = prompt.input_ids
    _phase("running the onnxruntime reference loop")
    reference = ort_greedy_tokens(
        model_path, prompt, len(tokens), eos_ids, options, provider=cpu_provider, embed=embed
    )
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
    provider: str,
    embed: Callable[[Sequence[int]], Mapping[str, np.ndarray]] | None = None,
) -> list[int] | None:
    """Greedy tokens of a plain onnxruntime loop on CPU, or None when it cannot feed the graph.

    Independent of genai_config.json: names follow the graph contract (input_ids,
    attention_mask, position_ids, logits; past/present pairs matched by layer index and role),
    and each step feeds the new tokens, an all-ones mask, their positions and the previous
    step's present KV as past KV. None when the KV dtype has no numpy type (bfloat16) or the
    head dims are not static. `config_entries` are ORT session config entries, `provider` the
    name of onnxruntime's CPU EP. `embed` gives the extra inputs of a step's new tokens (a
    vision-language decoder's inputs_embeds, 3-D mrope position_ids); inputs the graph does
    not declare are left out. Logits
    that are not finite are a BundleError naming the step.
    """
    session = ort_session(model_path, config_entries or {}, provider)
    inputs = {value.name: value for value in session.get_inputs()}
    outputs = [value.name for value in session.get_outputs()]
    cache = _cache_pairs(inputs, outputs)
    past: dict[str, np.ndarray] = {}
    for past_name, _, role in cache:
        value = inputs[past_name]
        kv_type = _NUMPY_TYPES.get(value.type)
        # a KV cache starts empty along its sequence axis; a recurrent state as zeros
        shape = (
            [1, *value.shape[1:2], 0, *value.shape[3:]]
            if role in KV_ROLES
            else [1, *value.shape[1:]]
        )
        if kv_type is None or not all(isinstance(dim, int) for dim in shape):
            return None
        past[past_name] = np.zeros(shape, kv_type)
    eos = set(eos_ids)
    new, total, tokens = list(prompt_ids), len(prompt_ids), []
    for step in range(max_new_tokens):
        feed = {"input_ids": _ints(inputs, "input_ids", [new]), **past}
        if "attention_mask" in inputs:
            feed["attention_mask"] = _ints(inputs, "attention_mask", np.ones((1, total)))
        if "position_ids" in inputs:
            positions = np.arange(total - len(new), total)[None]
            feed["position_ids"] = _ints(inputs, "position_ids", positions)
        if embed is not None:  # may give other positions (3-D mrope ones)
            feed.update(embed(new))
        feed = {name: value for name, value in feed.items() if name in inputs}
        results = session.run(["logits", *(present for _, present, _ in cache)], feed)
        require_finite(results[0][0, -1], step, "a plain onnxruntime loop")
        token = int(np.argmax(results[0][0, -1]))
        tokens.append(token)
        past = {
            past_name: result for (past_name, _, _), result in zip(cache, results[1:], strict=True)
        }
        new, total = [token], total + 1
        if token in eos:
            break
    return tokens


def _cache_pairs(inputs: Mapping[str, Any], outputs: Sequence[str]) -> list[tuple[str, str, str]]:
    """(past input, present output, role) of each cache tensor, matched by role and layer."""
    pairs = []
    for role in cache_roles():
        past, present = layer_names(inputs, role), layer_names(outputs, role)
        if past is None and present is None:
            continue  # only hybrid decoders have recurrent states; a Mamba2-only one no KV
        if past is None or present is None or past.indices != present.indices:
            raise BundleError(
                f"graph: past/present {role} inputs and outputs do not pair up by layer"
            )
        pairs += [(past.pattern % i, present.pattern % i, role) for i in past.indices]
    return pairs


def _ints(inputs: Mapping[str, Any], name: str, values: Any) -> np.ndarray:
    return np.asarray(values, dtype=_NUMPY_TYPES.get(inputs[name].type, np.int64))


def _phase(text: str) -> None:
    if _report_phases:
        print(f"{PHASE_PREFIX}{text}", file=sys.stderr, flush=True)


def main() -> None:
    """Answer one request read from stdin (`smoke._run_child` writes it) on stdout."""
    global _report_phases
    request = json.loads(sys.stdin.read())
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # native output must not mix in
    exit_with_parent(request["parent"])
    _report_phases = True
    try:
        answer = run_smoke(
            request["folder"],
            request["ep"],
            request["genai_provider"],
            request["session_options"],
            request["max_new_tokens"],
            request.get("cpu_refusal"),
            cpu_provider=request["cpu_provider"],
        )
    except BundleError as error:
        answer = {"error": str(error)}
    except Exception as error:  # reported to the parent as a failed smoke test, not lost
        answer = {"error": f"smoke test failed: {type(error).__name__}: {error}"}
    with answers:
        json.dump(answer, answers)


if __name__ == "__main__":
    main()
