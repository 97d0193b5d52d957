"""What onnxruntime-genai 0.18's own Python API tests and samples exercise that holds for any
model, run on our default bundles through og's public API: logits of every position (values vs
transformers), og.Engine with concurrent requests, n-gram speculative decoding, rewind,
continuous decoding, beam search, batches, guidance, several generators in one process.

Each contract reads the bundle's `og_limits` (bundle/og_support.py, what its card says): an API
the bundle gives up must fail as the card says, every other one must hold. The dense bundle
and two `default` EP bundles (ONNX Attention, a KV cache that grows by concatenation;
tiny-qwen2 and a gemma2 with sliding windows) run every contract by default; the MoE, hybrid
and vision-language bundles are slow-marked
here (tests/runtime/test_og_kinds.py runs their Engine, logits and n-gram checks by default).
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
import torch

from mobius_genai.bundle.og_support import (
    ALL_LOGITS,
    BATCH,
    BEAM,
    ENGINE,
    NGRAM,
    REWIND,
    bundle_og_limits,
)
from tests._hf import hf_reference_logits, load_reference_model
from tests._ort import run_like_reference
from tests.runtime._og import PROMPTS, alone, engine_tokens, finish, generator
from tests.runtime.conftest import open_kind

TOLERANCE = 1e-4  # f32 logits vs transformers
PROMPT = PROMPTS[0]
NEW = 12
ENGINE_NEW = (6, 4, 2)  # new tokens of each of PROMPTS under og.Engine

KINDS = [
    pytest.param("dense", id="dense"),
    pytest.param("default_ep", id="default-ep"),  # a cache that grows by concatenation
    pytest.param("windowed_default_ep", id="windowed-default-ep"),  # gemma2: 5-key windows
    pytest.param("moe", id="moe", marks=pytest.mark.slow),
    pytest.param("delta_net", id="hybrid", marks=pytest.mark.slow),
    pytest.param("vlm", id="vlm", marks=pytest.mark.slow),
]


@pytest.fixture(params=KINDS)
def kind(request):
    """(og.Model, bundle folder, checkpoint folder, transformers class) of one model kind."""
    return open_kind(request, request.param)


def _transformers_logits(checkpoint, model_class, ids: list[int]) -> np.ndarray:
    model = load_reference_model(checkpoint, model_class)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.to(torch.float32).numpy()


def _graph_logits(bundle, checkpoint, ids: list[int]) -> np.ndarray:
    """The prefill logits of the bundle's decoder run by onnxruntime itself."""
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    return run_like_reference(session, hf_reference_logits(checkpoint, np.array([ids]), 0))[0]


def test_logits_of_every_position_equal_transformers(kind):
    """Float bundles: og's logits of every prompt position equal transformers'; int4 bundles
    (whose numbers are not transformers'): equal those of their own graph in onnxruntime."""
    model, bundle, checkpoint, model_class = kind
    made = generator(model, PROMPT, 2)
    logits = made.get_output("logits")
    if ALL_LOGITS in bundle_og_limits(bundle):
        assert logits.shape[1] == 1
        return
    assert logits.shape == (1, len(PROMPT), logits.shape[2])
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    if manifest["build"]["precision"] == "int4":
        assert np.abs(logits - _graph_logits(bundle, checkpoint, PROMPT)).max() <= TOLERANCE
        return
    reference = _transformers_logits(checkpoint, model_class, PROMPT)
    assert np.abs(logits - reference[..., : logits.shape[2]]).max() <= TOLERANCE
    made.generate_next_token()  # the first decode step: one position
    token = int(made.get_next_tokens()[0])
    made.generate_next_token()
    step = made.get_output("logits")
    assert step.shape == (1, 1, logits.shape[2])
    following = _transformers_logits(checkpoint, model_class, [*PROMPT, token])[:, -1:]
    assert np.abs(step - following[..., : step.shape[2]]).max() <= TOLERANCE


def test_engine_requests_of_different_lengths_give_their_tokens_alone(kind):
    """Requests of different lengths and token counts, the longest finishing first (the
    batch's mask then stops growing while the others run: tests/runtime/test_og_feeds.py)."""
    model, bundle, *_ = kind
    expected = [alone(model, prompt, new) for prompt, new in zip(PROMPTS, ENGINE_NEW, strict=True)]
    refusal = bundle_og_limits(bundle).get(ENGINE)
    if refusal is not None:  # og refuses the model, fails its turns, or gives other tokens
        try:
            tokens, failures = engine_tokens(model, PROMPTS, ENGINE_NEW)
        except RuntimeError as error:
            assert "not supported for decoding" in str(error)
        else:
            assert failures or tokens != expected
        return
    tokens, failures = engine_tokens(model, PROMPTS, ENGINE_NEW)
    assert failures == []
    assert tokens == expected
    assert [len(request) for request in tokens] == list(ENGINE_NEW)


def test_ngram_speculative_decoding_gives_the_greedy_tokens(kind, request):
    model, bundle, *_ = kind
    context = json.loads((bundle / "genai_config.json").read_text())["model"]["context_length"]
    new = min(90, context) - len(PROMPT)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + new)
    params.set_speculative_options(ngram_size=2, max_draft_tokens=3)
    if NGRAM in bundle_og_limits(bundle):
        with pytest.raises(RuntimeError, match="N-gram decoding requires|RewindTo"):
            made = og.Generator(model, params)
            made.append_tokens(np.asarray([PROMPT], np.int32))
            finish(made, len(PROMPT))
        return
    made = og.Generator(model, params)
    made.append_tokens(np.asarray([PROMPT], np.int32))
    assert finish(made, len(PROMPT)) == alone(model, PROMPT, new)
    stats = made.get_speculative_stats()
    assert stats["draft_tokens_proposed"] > 0
    # the dense tiny-qwen2 bundle's greedy text repeats itself: drafts get accepted
    if request.node.callspec.params["kind"] == "dense":
        assert stats["draft_tokens_accepted"] > 0


def test_rewind_then_generate_again(kind):
    model, bundle, *_ = kind
    expected = alone(model, PROMPT, NEW)
    made = generator(model, PROMPT, NEW)
    for _ in range(6):
        made.generate_next_token()
    if REWIND in bundle_og_limits(bundle):
        with pytest.raises(RuntimeError, match="RewindTo|rewind"):
            made.rewind_to(len(PROMPT) + 2)
            made.generate_next_token()
        return
    made.rewind_to(len(PROMPT) + 2)
    assert made.token_count() == len(PROMPT) + 2
    assert finish(made, len(PROMPT)) == expected


def test_continuous_decoding_over_several_appends(kind):
    """A prompt appended in three parts: the same tokens as the whole prompt at once. (An
    append after generate_next_token gives other tokens in og 0.18, on the builder's bundle
    too: test_og_limits.py.)"""
    model, *_ = kind
    made = generator(model, PROMPT[:3], len(PROMPT) - 3 + NEW)
    made.append_tokens(np.asarray([PROMPT[3:5]], np.int32))
    made.append_tokens(np.asarray([PROMPT[5:]], np.int32))
    assert made.token_count() == len(PROMPT)
    assert finish(made, len(PROMPT)) == alone(model, PROMPT, NEW)


def test_beam_search_equals_transformers(kind):
    model, bundle, checkpoint, model_class = kind
    search = {"num_beams": 3, "num_return_sequences": 2, "early_stopping": True}
    reference = load_reference_model(checkpoint, model_class).generate(
        torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, length_penalty=1.0, **search
    )
    try:
        made = generator(model, PROMPT, 8, **search)
        finish(made, len(PROMPT))
        ours = [[int(t) for t in made.get_sequence(i)] for i in range(2)]
    except RuntimeError as error:  # og's multimodal pipeline
        assert BEAM in bundle_og_limits(bundle), error
        assert "inputs_embeds" in str(error)
        return
    assert (ours == reference.tolist()) is (BEAM not in bundle_og_limits(bundle))


def test_right_padded_batch_gives_each_prompt_its_tokens(kind):
    """og pads a batch on the right with the pad id (it finds each row's last token from it)."""
    model, bundle, *_ = kind
    pad = json.loads((bundle / "genai_config.json").read_text())["model"]["pad_token_id"]
    prompts = [[t for t in prompt if t != pad] for prompt in PROMPTS[:2]]
    width = max(map(len, prompts))
    batch = [prompt + [pad] * (width - len(prompt)) for prompt in prompts]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=width + 6, batch_size=2)
    made = og.Generator(model, params)
    made.append_tokens(np.asarray(batch, np.int32))
    while not made.is_done():
        made.generate_next_token()
    batched = [[int(t) for t in made.get_sequence(i)][width:] for i in range(2)]
    separately = [alone(model, prompt, 6) for prompt in prompts]
    assert (batched == separately) is (BATCH not in bundle_og_limits(bundle))
    assert batched[1][0] == separately[1][0]  # og's first token is right even where it errs


@pytest.mark.parametrize(
    ("kind_name", "grammar", "check"),
    [
        ("regex", "[a-z]{3}", lambda text: re.fullmatch("[a-z]{3}", text)),
        ("json_schema", json.dumps({"enum": ["yes", "no"]}), lambda text: json.loads(text)),
        (
            "json_schema",
            json.dumps(
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                    "required": ["a"],
                    "additionalProperties": False,
                    "x-guidance": {"whitespace_flexible": False},
                }
            ),
            lambda text: 0 <= json.loads(text)["a"] <= 99,
        ),
    ],
)
def test_guidance_output_matches_its_grammar(kind, kind_name, grammar, check):
    model, *_ = kind
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + 30)
    params.set_guidance(kind_name, grammar)
    made = og.Generator(model, params)
    made.append_tokens(np.asarray([PROMPT], np.int32))
    tokens = finish(made, len(PROMPT))
    text = og.Tokenizer(model).decode(np.asarray(tokens, np.int32))
    assert check(text), text


def test_several_generators_in_one_process_interleaved(kind):
    model, *_ = kind
    first, second = PROMPTS[0], PROMPTS[2]
    one, two = generator(model, first, NEW), generator(model, second, NEW)
    while not (one.is_done() and two.is_done()):
        for made in (one, two):
            if not made.is_done():
                made.generate_next_token()
    assert [int(t) for t in one.get_sequence(0)][len(first) :] == alone(model, first, NEW)
    assert [int(t) for t in two.get_sequence(0)][len(second) :] == alone(model, second, NEW)
