"""Gemma 4 bundles with the audio tower (E2B/E4B's kind): og's gemma4 pipeline (its
Gemma4LogMel features, speech, embedding and decoder graphs) against transformers with one
clip; text-only and image prompts on the same bundle; the files og reads."""

from __future__ import annotations

import io
import json
import math
import shutil

import numpy as np
import onnxruntime_genai as og
import pytest
import torch

from mobius_genai.build import build
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError, ConfigError
from mobius_genai.models.audio_processors import feature_extractor_settings, gemma4_log_mel
from mobius_genai.packager import package
from mobius_genai.runtime.audio import Clip, tone_bytes
from mobius_genai.runtime.decoding import stream_text
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._gemma4_audio import (
    FEATURES,
    MEL_BINS,
    log_mel,
    reference_audio_features,
    tone_wav,
    wav_samples,
    write_gemma4_audio_checkpoint,
)
from tests._gemma4_vision import (
    KEPT_SIZES,
    og_image_inputs,
    og_prefill_logits,
    random_pixels,
    reference_inputs,
)
from tests._hf import generated_tokens
from tests._ort import (
    assert_only_the_decoder_fuses_gqa,
    model_ops,
    og_greedy,
    package_sessions,
    saved_ops,
)

#: every position of a 3-layer prefill: logits up to ~9 agree to 2e-4; the speech graph alone
#: holds 1e-4 (tests/models/test_gemma4_audio.py)
TOLERANCE = 2e-4
PROMPT = "Listen: <|audio|> What is it?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-audio-ckpt")
    return write_gemma4_audio_checkpoint(folder), folder


@pytest.fixture(scope="module")
def bundle(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4-audio-bundle") / "bundle"
    return package(checkpoint[1], "cpu", out, quiet=True, smoke_test=False)


def _audio_inputs(bundle, tmp_path, samples: int, prompt: str = PROMPT):
    """(og.Model, og's processor inputs, the WAV's bytes) for a tone of `samples`."""
    wav = tone_wav(samples)
    path = tmp_path / "clip.wav"
    path.write_bytes(wav)
    model = og.Model(str(bundle))
    inputs = model.create_multimodal_processor()(prompt, audios=og.Audios.open(str(path)))
    return model, inputs, wav


def test_genai_config_and_audio_processor_config_are_what_og_reads(bundle):
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    speech = config["speech"]
    assert speech["filename"] == "speech.onnx"
    assert speech["inputs"] == {
        "audio_embeds": "input_features",
        "attention_mask": "input_features_mask",
    }
    assert speech["outputs"] == {"audio_features": "audio_features"}
    assert config["embedding"]["inputs"]["audio_features"] == "audio_features"
    processor = json.loads((bundle / speech["config_filename"]).read_text())
    steps = [step["operation"] for step in processor["feature_extraction"]["sequence"]]
    assert [step["type"] for step in steps] == ["AudioDecoder", "Gemma4LogMel"]
    assert steps[1]["attrs"] == {"feature_size": MEL_BINS}
    validate_bundle(bundle)
    card = (bundle / "README.md").read_text()
    assert "`speech.onnx` (speech: input_features, input_features_mask → audio_features)" in card
    assert "| `speech.onnx` | the audio tower" in card
    assert '--audio clip.wav --prompt "Transcribe the audio."' in card


@pytest.mark.parametrize("samples", [16_000, 17_000, 4_321])
def test_og_features_and_prompt_are_transformers(bundle, tmp_path, samples):
    """og's log-mel frames are transformers' real frames (its padding to 128 samples masked),
    its mask all true, and `<|audio|>` becomes a blank line, `<|audio>`, one `<|audio|>` per
    token (frames / 4, rounded up twice) and `<audio|>`."""
    model, inputs, wav = _audio_inputs(bundle, tmp_path, samples)
    features, mask = log_mel(wav_samples(wav))
    ours = inputs["audio_embeds"].as_numpy()
    frames = int(mask.sum())
    assert ours.shape == (1, frames, MEL_BINS)
    np.testing.assert_allclose(ours[0], features[0, :frames], atol=1e-5, rtol=0)
    assert inputs["audio_attention_mask"].as_numpy().all()
    tokens = math.ceil(math.ceil(frames / 2) / 2)
    tokenizer = og.Tokenizer(model)
    ids = inputs["input_ids"].as_numpy().reshape(-1).tolist()
    boa, audio, eoa = (int(tokenizer.encode(t)[-1]) for t in ("<|audio>", "<|audio|>", "<audio|>"))
    start = ids.index(boa)
    assert ids[start : start + tokens + 2] == [boa, *[audio] * tokens, eoa]


def test_og_computes_the_features_of_other_extractor_settings(bundle, tmp_path):
    """Every setting Gemma4LogMel takes, away from its default (booleans written as 0 / 1):
    og's frames equal transformers' extractor's with the same settings."""
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )

    rng = np.random.default_rng(0)
    settings = {
        **FEATURES,
        "frame_length_ms": 32.0,
        "hop_length_ms": 12.0,
        "min_frequency": 60.0,
        "max_frequency": 7000.0,
        "preemphasis": 0.97,
        "preemphasis_htk_flavor": False,
        "fft_overdrive": True,
        "mel_floor": 1e-4,
        "per_bin_mean": rng.normal(size=MEL_BINS).tolist(),
        "per_bin_stddev": (1 + rng.random(MEL_BINS)).tolist(),
    }
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    document = gemma4_log_mel(settings, copy / "preprocessor_config.json")
    (copy / "audio_processor_config.json").write_text(json.dumps(document))
    _, inputs, wav = _audio_inputs(copy, tmp_path, 17_000)
    out = Gemma4AudioFeatureExtractor(**settings)([wav_samples(wav)], return_tensors="np")
    frames = int(out["input_features_mask"].sum())
    ours = inputs["audio_embeds"].as_numpy()
    assert ours.shape == (1, frames, MEL_BINS)
    np.testing.assert_allclose(ours[0], out["input_features"][0, :frames], atol=1e-5, rtol=0)


@pytest.mark.parametrize("samples", [16_000, 9_000])
def test_og_logits_and_greedy_tokens_with_audio_equal_transformers(
    checkpoint, bundle, tmp_path, samples
):
    """og's prefill logits with one clip are transformers' (fed og's ids, its features of the
    same samples) and the greedy tokens are equal."""
    model, _ = checkpoint
    og_model, inputs, wav = _audio_inputs(bundle, tmp_path, samples)
    ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    features, mask = (torch.from_numpy(a) for a in log_mel(wav_samples(wav)))
    audio = {"input_features": features, "input_features_mask": mask}
    with torch.no_grad():
        expected = model(input_ids=ids, **audio).logits.numpy()
    np.testing.assert_allclose(
        og_prefill_logits(og_model, inputs), expected, atol=TOLERANCE, rtol=0
    )
    assert og_greedy(og_model, inputs, 6) == generated_tokens(model, ids, 6, **audio)


def test_text_and_image_prompts_run_on_the_audio_bundle(checkpoint, bundle, tmp_path):
    """The speech graph idle: a text prompt (through the processor, and as token ids) and an
    image prompt give transformers' logits."""
    model, _ = checkpoint
    og_model = og.Model(str(bundle))
    processor = og_model.create_multimodal_processor()
    text = processor("The capital of France is")
    ids = text["input_ids"].as_numpy().astype(np.int64)
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(og_prefill_logits(og_model, text), expected, atol=TOLERANCE, rtol=0)
    params = og.GeneratorParams(og_model)  # token ids appended, no processor (`run --prompt`)
    params.set_search_options(do_sample=False, max_length=ids.shape[1] + 1)
    generator = og.Generator(og_model, params)
    generator.append_tokens(ids.astype(np.int32))
    np.testing.assert_allclose(generator.get_output("logits"), expected, atol=TOLERANCE, rtol=0)
    pixels = [random_pixels(*KEPT_SIZES[0], seed=2)]
    og_model, inputs = og_image_inputs(bundle, tmp_path, pixels)
    ids = inputs["input_ids"].as_numpy().astype(np.int64)
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    ours = og_prefill_logits(og_model, inputs)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_int4_keeps_the_speech_graph_float(checkpoint, tmp_path):
    """int4 quantizes the decoder and the embedding's token table (read by the token ids, the
    image and audio tokens mapped to row 0); the audio tower, like the vision one, stays float;
    the smoke test runs with the tone."""
    out = package(checkpoint[1], "cpu", tmp_path / "int4", precision="int4", quiet=True)
    assert ("com.microsoft", "MatMulNBits") in saved_ops(out / "decoder.onnx")
    assert ("com.microsoft", "GatherBlockQuantized") in saved_ops(out / "embedding.onnx")
    assert ("com.microsoft", "MatMulNBits") not in saved_ops(out / "speech.onnx")
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert record["ran"] and "image and a 1 s tone" in record["note"]


def test_feature_extractor_settings_og_cannot_apply_are_refused(tmp_path):
    for key, value in (("dither", 1e-4), ("input_scale_factor", 2.0)):
        with pytest.raises(ConfigError, match=f"{key} is {value!r}; accepted"):
            gemma4_log_mel({key: value}, tmp_path / "processor_config.json")
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 64})
    )
    settings, path = feature_extractor_settings(tmp_path)
    assert (settings["feature_size"], path.name) == (64, "preprocessor_config.json")


def test_run_with_audio_beside_the_prompt_gives_og_greedy_tokens(bundle, tmp_path, capsys):
    """`run --audio FILE --prompt ...`: the clip's placeholder goes in front of the prompt and
    the text is og's greedy tokens of the processor's inputs."""
    og_model, inputs, _ = _audio_inputs(bundle, tmp_path, 12_000, prompt="<|audio|> Hi")
    tokens = og_greedy(og_model, inputs, 5)
    text_only = og_model.create_multimodal_processor()("Hi")
    assert tokens != og_greedy(og_model, text_only, 5)  # the clip changes the reply
    stream = og.Tokenizer(og_model).create_stream()
    expected = "".join(stream.decode(token) for token in tokens)
    opened = open_bundle(bundle, command="run")
    pieces = stream_text(
        opened,
        "Hi",
        max_new_tokens=5,
        max_length=512,
        use_chat_template=False,
        audio=Clip.read(tmp_path / "clip.wav"),
    )
    assert "".join(pieces) == expected
    command = ["run", str(bundle), "--audio", str(tmp_path / "clip.wav"), "--prompt", "Hi"]
    assert main([*command, "--max-new-tokens", "4"]) == 0
    assert "mobius-genai: 4 tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--timestamps"], "--timestamps times a transcript; accepted: with --audio FILE on a"),
        ([], None),
    ],
)
def test_run_refuses_what_an_audio_prompt_cannot_do(bundle, tmp_path, capsys, extra, words):
    """--timestamps is a transcript's; a Gemma 4 bundle without a speech graph takes no
    audio (one line, no traceback)."""
    path = tmp_path / "clip.wav"
    path.write_bytes(tone_wav(8_000))
    folder = bundle
    if words is None:  # the same bundle without its speech section
        folder = tmp_path / "no-speech"
        shutil.copytree(bundle, folder)
        config = json.loads((folder / "genai_config.json").read_text())
        config["model"]["speech"] = {"config_filename": ""}
        (folder / "genai_config.json").write_text(json.dumps(config))
        words = "takes no audio; accepted: --audio with a speech bundle"
    assert main(["run", str(folder), "--audio", str(path), "--prompt", "Hi", *extra]) != 0
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("prompt", "audio", "placed"),
    [
        ("<|audio|> Hi", False, "places 1 <|audio|> but 0 clip(s) are given"),
        ("<|audio|> and <|audio|>", True, "places 2 <|audio|> but 1 clip(s) are given"),
        ("<|image> Hi", False, "places 1 <|image> but 0 image(s) are given"),
        ("<|image|> Hi", False, "holds <|image|>, the token og fills with an image's features"),
    ],
)
def test_run_refuses_placeholders_without_their_files(
    bundle, tmp_path, capsys, prompt, audio, placed
):
    """A prompt placing a clip or an image with no file given is one line and exit code 1,
    before og (which takes such tokens as text, or beside an image fails on them in its
    session run with "Gather ... out of bounds")."""
    path = tmp_path / "clip.wav"
    path.write_bytes(tone_wav(8_000))
    given = ["--audio", str(path)] if audio else []
    assert main(["run", str(bundle), *given, "--prompt", prompt, "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Gather" not in err
    assert f"the prompt {placed}; accepted: " in err


def test_chat_refuses_a_message_placing_an_image_and_goes_on(bundle, monkeypatch, capsys):
    """`chat` takes no files: a message placing an image or a clip is refused in one line and
    the next message is answered."""
    monkeypatch.setattr("sys.stdin", io.StringIO("<|image|> Hi\n<|audio|>\nHi\n"))
    assert main(["chat", str(bundle), "--max-new-tokens", "3", "--quiet"]) == 0
    captured = capsys.readouterr()
    refusals = [line for line in captured.err.splitlines() if "the prompt " in line]
    assert len(refusals) == 2 and "Traceback" not in captured.err
    assert captured.err.count("[… reply cut at 3 tokens") == 1  # the third message's reply


def test_smoke_test_runs_a_tone_beside_the_image(bundle):
    """og with an image and a tone against a plain onnxruntime loop over the same graphs
    (speech, vision, embedding, decoder)."""
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran
    assert result.note.endswith(
        "with a 96x96 image and a 1 s tone, same as a plain onnxruntime loop"
    )


def test_validate_checks_the_speech_graph_against_its_section(bundle, tmp_path):
    folder = tmp_path / "renamed"
    shutil.copytree(bundle, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["speech"]["inputs"]["attention_mask"] = "audio_mask"
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(BundleError, match="model.speech") as caught:
        validate_bundle(folder, check_hashes=False)
    assert "input_features_mask" in str(caught.value)


def _audio_layers(graph) -> set[str]:
    return {
        name.split(".")[2]
        for name in graph.graph.initializers
        if name.startswith("audio_tower.layers.")
    }


def test_the_smoke_twin_keeps_the_audio_towers_first_layer(checkpoint):
    """A twin (the decoder's first layers) cuts the audio tower to its first layer too, its
    other layers' tensors left unread, as the vision tower's."""
    _, folder = checkpoint
    assert _audio_layers(build(folder, "cpu", progress=False)["speech"]) == {"0", "1"}
    assert _audio_layers(build(folder, "cpu", num_layers=2, progress=False)["speech"]) == {"0"}


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep_and_the_float16_speech_graph(checkpoint, ep):
    """No EP fuses the tower's attention into GroupQueryAttention; cuda's float16 speech graph
    on onnxruntime's CPU kernels (attention in float32, clip bounds within float16) keeps a
    clip's tokens within float16's tolerance of transformers'."""
    model, folder = checkpoint
    built = build(folder, ep, progress=False)
    assert_only_the_decoder_fuses_gqa(built, ep)
    assert {("", "Conv"), ("", "Softplus"), ("", "Tanh")} <= model_ops(built["speech"])
    if ep != "cuda":
        return
    sessions = package_sessions(built)
    features, mask = log_mel(wav_samples(tone_wav(12_000)))
    feeds = {"input_features": features.astype(np.float16), "input_features_mask": mask}
    (ours,) = sessions["speech"].run(None, feeds)
    assert ours.dtype == np.float16
    expected = reference_audio_features(model, features, mask)
    np.testing.assert_allclose(ours.astype(np.float32), expected, atol=5e-2, rtol=0)


def test_og_logits_with_an_image_and_a_clip_equal_transformers(checkpoint, bundle, tmp_path):
    """One prompt with both: the vision and speech graphs' features each land at their own
    tokens."""
    model, _ = checkpoint
    pixels = [random_pixels(*KEPT_SIZES[1], seed=4)]
    (tmp_path / "image.png").write_bytes(png_bytes(pixels[0]))
    (tmp_path / "clip.wav").write_bytes(tone_wav(10_000))
    og_model = og.Model(str(bundle))
    inputs = og_model.create_multimodal_processor()(
        "<|image> <|audio|> Describe both.",
        images=og.Images.open(str(tmp_path / "image.png")),
        audios=og.Audios.open(str(tmp_path / "clip.wav")),
    )
    ids = inputs["input_ids"].as_numpy().astype(np.int64)
    features, mask = (torch.from_numpy(a) for a in log_mel(wav_samples(tone_wav(10_000))))
    reference = reference_inputs(model, ids, pixels, blocks=False)
    with torch.no_grad():
        expected = model(
            **reference, input_features=features, input_features_mask=mask
        ).logits.numpy()
    ours = og_prefill_logits(og_model, inputs)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_bench_audio_times_the_first_token_after_a_generated_clip(bundle, capsys):
    """`bench DIR --audio` (no file): a generated 2 s tone in front of the bench prompt, its
    prompt og's processor's, its first token against the prompt's without the clip."""
    command = ["bench", str(bundle), "--audio", "--rounds", "1", "--new-tokens", "3", "--json"]
    assert main(command) == 0
    result = json.loads(capsys.readouterr().out)
    processor = og.Model(str(bundle)).create_multimodal_processor()
    clip = og.Audios.open_bytes(tone_bytes(2.0))
    expected = processor("<|audio|> Describe the audio.", audios=clip)["input_ids"].as_numpy()
    assert (result["audio"], result["audio_seconds"]) == ("a generated 2 s tone", 2.0)
    assert result["prompt_tokens"] == expected.shape[-1] and result["tokens"] == 3
    assert result["ttft_ms"] > 0 and result["text_ttft_ms"] > 0
    assert result["clip_cost"] == pytest.approx(result["ttft_ms"] / result["text_ttft_ms"])
