"""`mobius-genai run BUNDLE --audio FILE`: a packaged Whisper bundle prints the transcript
transformers' generate() gives for the same audio features, decoded by the tokenizer; bad
input is one line each (no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og
import pytest
from tokenizers import Tokenizer

from mobius_genai.cli import main
from mobius_genai.packager import package
from tests.models.whisper._whisper import (
    FORCED_PROMPT,
    hf_new_tokens,
    tone,
    write_encoded,
    write_wav,
    write_whisper_checkpoint,
    write_whisper_tokenizer,
)

NEW_TOKENS = 6
EOS = 50_257
_ONLY_WAV = "over the encoder's 30 s, and only a WAV, FLAC or MP3 file is cut into windows here"


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    return write_wav(tmp_path_factory.mktemp("audio") / "tone.wav", tone(3.0))


def _run(capsys, *arguments: str) -> tuple[int, str, str]:
    code = main(["run", *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_audio_prints_the_transcript_transformers_generates(
    speech_bundle, multilingual_checkpoint, wav, capsys
):
    model_hf, _ = multilingual_checkpoint
    prompt = FORCED_PROMPT["multilingual"]
    processor = og.Model(str(speech_bundle)).create_multimodal_processor()
    text = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    mel = processor(text, audios=og.Audios.open(str(wav)))["audio_features"].as_numpy()
    expected = [t for t in hf_new_tokens(model_hf, mel.copy(), prompt, NEW_TOKENS) if t != EOS]
    tokenizer = Tokenizer.from_file(str(speech_bundle / "tokenizer.json"))
    code, out, err = _run(
        capsys, str(speech_bundle), "--audio", str(wav), "--max-new-tokens", str(NEW_TOKENS)
    )
    assert code == 0, err
    assert expected and out == tokenizer.decode(expected, skip_special_tokens=False) + "\n"


def test_run_audio_with_another_language_and_task_forces_their_tokens(
    speech_bundle, multilingual_checkpoint, wav, capsys
):
    model_hf, _ = multilingual_checkpoint
    french_translate = [50258, 50260, 50358, 50363]  # <|fr|> is 50260 in this tokenizer
    processor = og.Model(str(speech_bundle)).create_multimodal_processor()
    text = "<|startoftranscript|><|fr|><|translate|><|notimestamps|>"
    inputs = processor(text, audios=og.Audios.open(str(wav)))
    assert inputs["input_ids"].as_numpy().tolist() == [french_translate]
    mel = inputs["audio_features"].as_numpy().copy()
    expected = [t for t in hf_new_tokens(model_hf, mel, french_translate, 4) if t != EOS]
    tokenizer = Tokenizer.from_file(str(speech_bundle / "tokenizer.json"))
    command = [str(speech_bundle), "--audio", str(wav), "--language", "fr", "--task", "translate"]
    code, out, err = _run(capsys, *command, "--max-new-tokens", "4")
    assert code == 0, err
    assert out == tokenizer.decode(expected, skip_special_tokens=False) + "\n"


def _bad_audio(folder: Path) -> dict[str, tuple[Path, str]]:
    """File name → (file, what the one-line error says)."""
    folder.mkdir(exist_ok=True)
    junk = folder / "notes.wav"
    junk.write_bytes(b"not audio at all " * 20)
    return {
        "not audio": (junk, "not an audio file onnxruntime-genai can decode"),
        "8 kHz": (
            write_wav(folder / "low.wav", tone(2.0, rate=8000), rate=8000),
            "8000 Hz is sampled below 16000 Hz",
        ),
        "missing": (folder / "absent.wav", "not a file"),
        "MP3 over 30 s, frames after other bytes": (_junk_between(folder, tone(20.0)), _ONLY_WAV),
        "MP3 at 8 kHz": (
            write_encoded(folder / "low.mp3", tone(2.0, rate=8000), rate=8000),
            "8000 Hz is sampled below 16000 Hz",
        ),
        "OGG": (write_encoded(folder / "speech.ogg", tone(2.0)), "not an audio file"),
        "empty": (_written(folder / "empty.wav", b""), "onnxruntime-genai cannot process it"),
        "damaged FLAC": (_damaged_flac(folder), "onnxruntime-genai cannot process it"),
    }


def _written(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _junk_between(folder: Path, signal) -> Path:
    """Two MP3 encodings of `signal` with other bytes between them (og's decoder skips them)."""
    one = write_encoded(folder / "one.mp3", signal).read_bytes()
    return _written(folder / "joined.mp3", one + b"\x12\x34" * 50 + one)


def _damaged_flac(folder: Path) -> Path:
    """A FLAC file whose header is whole and whose frames are noise."""
    head = write_encoded(folder / "whole.flac", tone(2.0)).read_bytes()[:200]
    return _written(folder / "damaged.flac", head + bytes(range(256)) * 40)


BAD_AUDIO = ("not audio", "8 kHz", "missing", "MP3 over 30 s, frames after other bytes")


@pytest.mark.parametrize("case", [*BAD_AUDIO, "MP3 at 8 kHz", "OGG", "empty", "damaged FLAC"])
def test_bad_audio_is_one_clear_line(speech_bundle, tmp_path, capsys, case):
    path, said = _bad_audio(tmp_path / "audio")[case]
    code, out, err = _run(capsys, str(speech_bundle), "--audio", str(path))
    assert code == 1 and out == ""
    assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("suffix", [".flac", ".mp3"])
def test_flac_and_mp3_up_to_30_s_are_transcribed(speech_bundle, wav, tmp_path, capsys, suffix):
    """og decodes both; lossless FLAC gives the WAV file's transcript."""
    path = write_encoded(tmp_path / f"speech{suffix}", tone(29.9))
    code, out, err = _run(capsys, str(speech_bundle), "--audio", str(path), "--max-new-tokens", "3")
    assert code == 0, err
    assert out.strip()
    if suffix == ".flac":
        same = write_encoded(tmp_path / "tone.flac", tone(3.0))
        assert (
            _run(capsys, str(speech_bundle), "--audio", str(same))[1]
            == _run(capsys, str(speech_bundle), "--audio", str(wav))[1]
        )


def test_a_44_1_khz_file_is_resampled_by_og(speech_bundle, tmp_path, capsys):
    signal = tone(2.0, rate=44_100)
    path = write_wav(tmp_path / "cd.wav", signal, rate=44_100)
    code, out, err = _run(capsys, str(speech_bundle), "--audio", str(path), "--max-new-tokens", "2")
    assert code == 0, err
    assert out.strip()


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--language", "xx"], "--language xx: not a language of this tokenizer; accepted: en, fr"),
        (["--format", "srt", "--timestamps"], "--format srt writes a transcript"),
    ],
)
def test_bad_options_with_audio_are_one_clear_line(speech_bundle, wav, capsys, arguments, said):
    code, _, err = _run(capsys, str(speech_bundle), "--audio", str(wav), *arguments)
    assert code == 1 and said in err and "Traceback" not in err


def test_no_audio_on_a_speech_bundle_is_one_clear_line(speech_bundle, capsys):
    code, _, err = _run(capsys, str(speech_bundle), "hello")
    assert code == 1 and "a speech bundle (model.type 'whisper') transcribes audio" in err
    assert "accepted: --audio FILE" in err and "Traceback" not in err


def test_timestamps_without_audio_is_one_clear_line(packaged, capsys):
    code, out, err = _run(capsys, str(packaged("cpu")), "hello", "--timestamps")
    assert code == 1 and out == "" and "Traceback" not in err
    assert "--timestamps times a transcript; accepted: with --audio FILE" in err


def test_format_without_audio_is_one_clear_line(packaged, capsys):
    code, out, err = _run(capsys, str(packaged("cpu")), "hello", "--format", "vtt")
    assert code == 1 and out == "" and "Traceback" not in err
    assert "--format vtt writes a transcript; accepted: with --audio FILE" in err


def test_audio_on_a_text_bundle_is_one_clear_line(packaged, wav, capsys):
    bundle = packaged("cpu")
    code, _, err = _run(capsys, str(bundle), "--audio", str(wav))
    assert code == 1 and "model.type 'qwen2' takes no audio" in err
    assert "speech bundle (model.type whisper)" in err and "Traceback" not in err


def test_english_only_bundle_refuses_another_language(tmp_path, wav, capsys):
    folder = tmp_path / "ckpt"
    write_whisper_checkpoint(folder, "english")
    write_whisper_tokenizer(folder, "english")
    bundle = package(folder, "cpu", tmp_path / "en", quiet=True, smoke_test=False)
    code, _, err = _run(capsys, str(bundle), "--audio", str(wav), "--language", "fr")
    assert code == 1 and "an English-only model (vocab_size 51864)" in err


def test_bench_audio_reports_the_real_time_factor(speech_bundle, wav, capsys):
    command = ["bench", str(speech_bundle), "--audio", str(wav), "--rounds", "1", "--json"]
    assert main([*command, "--ep", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["audio_seconds"] == 3.0  # the WAV file's length, read from its header
    assert result["seconds"] > 0 and result["tokens"] > 0
    assert result["real_time_factor"] == pytest.approx(result["seconds"] / 3.0)


def test_bench_audio_without_a_file_transcribes_a_generated_tone(speech_bundle, capsys):
    command = ["bench", str(speech_bundle), "--audio", "--rounds", "1", "--json", "--ep", "cpu"]
    assert main(command) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["audio"], result["audio_seconds"]) == ("a generated 2 s tone", 2.0)
    assert result["real_time_factor"] == pytest.approx(result["seconds"] / 2.0)
