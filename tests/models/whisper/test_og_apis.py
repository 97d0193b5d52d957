"""onnxruntime-genai 0.18's og.Generator APIs on a packaged Whisper bundle, each against
transformers (or what og refuses, the same way for og's own builder's Whisper bundle of the
same checkpoint): the rows the card shows (bundle/og_support.py) say only what runs here."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime_genai as og
import pytest
import torch

from mobius_genai.bundle.og_support import BATCH, BEAM, NGRAM, REWIND, bundle_og_limits
from tests._ort import og_greedy
from tests.models.whisper._whisper import FORCED_PROMPT, hf_new_tokens, tone, write_wav
from tests.runtime.conftest import run_builder

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
IDS = FORCED_PROMPT["multilingual"]
NEW = 6


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    """Two generated audio files of different lengths and pitch."""
    folder = tmp_path_factory.mktemp("apis")
    return (
        write_wav(folder / "a.wav", tone(3.0)),
        write_wav(folder / "b.wav", tone(2.0, frequency=300.0)),
    )


@pytest.fixture(scope="module")
def builder_bundle(speech_bundle, multilingual_checkpoint, tmp_path_factory):
    """og's builder's fp32 cpu bundle of the same checkpoint (its tokenizer written by
    speech_bundle)."""
    out, done = run_builder(tmp_path_factory, multilingual_checkpoint[1], "whisper")
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _opened(bundle, file) -> tuple[og.Model, og.NamedTensors, np.ndarray]:
    """og.Model of `bundle`, its processor's inputs for `file` and their log-mel."""
    model = og.Model(str(bundle))
    inputs = _inputs(model, PROMPT, file)
    return model, inputs, inputs["audio_features"].as_numpy().copy()


def _inputs(model: og.Model, prompts, *files) -> og.NamedTensors:
    return model.create_multimodal_processor()(prompts, audios=og.Audios.open(*map(str, files)))


def _generator(model: og.Model, inputs: og.NamedTensors, **search) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    return generator


def _finish(generator: og.Generator, rows: int = 1) -> list[list[int]]:
    while not generator.is_done():
        generator.generate_next_token()
    return [generator.get_sequence(row).tolist() for row in range(rows)]


def test_a_batch_of_two_audios_gives_each_row_transformers_tokens(
    speech_bundle, multilingual_checkpoint, audio
):
    model_hf, _ = multilingual_checkpoint
    model = og.Model(str(speech_bundle))
    inputs = _inputs(model, [PROMPT, PROMPT], *audio)
    mel = inputs["audio_features"].as_numpy().copy()
    rows = _finish(_generator(model, inputs, max_length=len(IDS) + NEW, batch_size=2), 2)
    expected = [hf_new_tokens(model_hf, mel[i : i + 1], IDS, NEW) for i in range(2)]
    assert [row[len(IDS) :] for row in rows] == expected
    assert expected[0] != expected[1]  # the rows are told apart


def test_every_prompt_positions_logits_equal_transformers(
    speech_bundle, multilingual_checkpoint, audio
):
    model_hf, _ = multilingual_checkpoint
    model, inputs, mel = _opened(speech_bundle, audio[0])
    logits = _generator(model, inputs, max_length=len(IDS) + NEW).get_output("logits")
    with torch.no_grad():
        out = model_hf(input_features=torch.from_numpy(mel), decoder_input_ids=torch.tensor([IDS]))
    assert logits.shape == (1, len(IDS), model_hf.config.vocab_size)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=1e-4, rtol=1e-4)


def test_a_prompt_appended_in_parts_continues_as_transformers(
    speech_bundle, multilingual_checkpoint, audio
):
    model_hf, _ = multilingual_checkpoint
    model, inputs, mel = _opened(speech_bundle, audio[0])
    generator = _generator(model, inputs, max_length=len(IDS) + 2 + NEW)
    generator.append_tokens(np.array([[11, 12]], np.int32))
    sequence = _finish(generator)[0]
    assert sequence[len(IDS) + 2 :] == hf_new_tokens(model_hf, mel, [*IDS, 11, 12], NEW)


def test_sampling_with_top_k_1_and_guidance_run(speech_bundle, audio):
    model = og.Model(str(speech_bundle))
    greedy = og_greedy(model, _inputs(model, PROMPT, audio[0]), NEW)
    search = {"max_length": len(IDS) + NEW, "do_sample": True, "top_k": 1, "random_seed": 3}
    sampled = _finish(_generator(model, _inputs(model, PROMPT, audio[0]), **search))[0]
    assert sampled[len(IDS) :] == greedy
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(IDS) + NEW)
    params.set_guidance("regex", "[ab]+")
    guided = og.Generator(model, params)
    guided.set_inputs(_inputs(model, PROMPT, audio[0]))
    tokens = _finish(guided)[0][len(IDS) :]
    text = og.Tokenizer(model).decode(tokens)
    assert tokens and re.fullmatch("[ab]+", text), text


def test_beam_search_equals_transformers(speech_bundle, multilingual_checkpoint, audio):
    model_hf, _ = multilingual_checkpoint
    model, inputs, mel = _opened(speech_bundle, audio[1])
    ours = _finish(_generator(model, inputs, max_length=len(IDS) + NEW, num_beams=2))[0]
    assert BEAM not in bundle_og_limits(speech_bundle)
    assert ours[len(IDS) :] == hf_new_tokens(model_hf, mel, IDS, NEW, num_beams=2)


@pytest.mark.parametrize("which", ["ours", "builder"])
def test_og_refuses_rewind_and_ngram_alike(speech_bundle, builder_bundle, audio, which):
    bundle = speech_bundle if which == "ours" else builder_bundle
    model = og.Model(str(bundle))
    generator = _generator(model, _inputs(model, PROMPT, audio[0]), max_length=len(IDS) + NEW)
    generator.generate_next_token()
    with pytest.raises(RuntimeError, match="RewindTo is currently not supported for whisper"):
        generator.rewind_to(len(IDS))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(IDS) + NEW)
    params.set_speculative_options(ngram_size=2, max_draft_tokens=3)
    with pytest.raises(RuntimeError, match="N-gram decoding requires a plain decoder-only"):
        og.Generator(model, params)
    assert {NGRAM, REWIND} <= set(bundle_og_limits(speech_bundle))


@pytest.mark.parametrize("which", ["ours", "builder"])
def test_a_shorter_prompt_in_a_batch_is_padded_inside_itself(
    speech_bundle, builder_bundle, audio, which
):
    bundle = speech_bundle if which == "ours" else builder_bundle
    model = og.Model(str(bundle))
    short = "<|startoftranscript|><|en|><|transcribe|>"
    inputs = _inputs(model, [PROMPT, short], *audio)
    rows = _finish(_generator(model, inputs, max_length=len(IDS) + NEW, batch_size=2), 2)
    alone = _finish(_generator(model, _inputs(model, short, audio[1]), max_length=len(IDS) + NEW))
    assert rows[1][: len(IDS)] == [*IDS[:3], 50_256]  # the pad id inside the forced prompt
    assert rows[1][3:] != alone[0][3 : len(rows[1])]
    assert BATCH in bundle_og_limits(speech_bundle)
