"""Test-only helpers for Whisper: tiny random checkpoints written by transformers, our graphs
saved and opened in onnxruntime, and transformers' logits for the same calls."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import WhisperConfig as HFWhisperConfig
from transformers import WhisperForConditionalGeneration

from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.ep.context import build_context
from mobius_genai.models.whisper import WHISPER_ROLES, whisper_graphs
from mobius_genai.optimize.pipeline import optimize_model
from tests._hf import randomize_weights

#: The vocabulary and mel bins of each released layout (English-only lacks the language tokens;
#: large-v3 and turbo have 128 mel bins and one more token).
LAYOUTS = {
    "multilingual": {"vocab_size": 51_865, "num_mel_bins": 80},
    "english": {"vocab_size": 51_864, "num_mel_bins": 80},
    "large-v3": {"vocab_size": 51_866, "num_mel_bins": 128},
}
TINY = {
    "d_model": 64,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 96,
    "decoder_layers": 2,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 96,
    "max_source_positions": 1500,
    "max_target_positions": 448,
}
#: A decoder prompt (start, language, task, no timestamps in the multilingual vocabulary; ids
#: of any layout's vocabulary) and the tokens of three cached steps after it.
PROMPT = [[50258, 50259, 50359, 50363], [50258, 50260, 50358, 50363]]
STEPS = [[11], [262]], [[50257], [1000]], [[4], [51863]]


def write_whisper_checkpoint(
    dest: Path, layout: str = "multilingual", seed: int = 0
) -> WhisperForConditionalGeneration:
    """A tiny random float32 Whisper checkpoint of `layout` in `dest` (biases and norms random,
    tests/_hf.randomize_weights); returns transformers' model of it."""
    config = HFWhisperConfig(**TINY, **LAYOUTS[layout])
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    randomize_weights(model, seed)
    model.save_pretrained(dest)
    return model


def read_config(folder: Path) -> WhisperConfig:
    return WhisperConfig.from_dict(json.loads((folder / "config.json").read_text()))


def build_sessions(
    ckpt: Path,
    directory: Path,
    ep: str = "default",
    *,
    optimize: bool = False,
    dtype: ir.DataType = ir.DataType.FLOAT,
) -> dict[str, ort.InferenceSession]:
    """Our encoder and decoder graphs of `ckpt` for `ep` and `dtype` (optimized for them when
    asked), saved under `directory` and opened on onnxruntime's CPU EP."""
    with build_context(ep, dtype):
        models = whisper_graphs(read_config(ckpt), Checkpoint(ckpt))
    directory.mkdir(parents=True, exist_ok=True)
    sessions = {}
    for key, model in models.items():
        if optimize:
            optimize_model(model, ep, dtype, WHISPER_ROLES[key])
        path = directory / f"{key}.onnx"
        ir.save(model, path, external_data=f"{key}.onnx.data")
        sessions[key] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sessions


def mel_features(num_mel_bins: int, batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, num_mel_bins, 3000), np.float32)


def run_encoder(session: ort.InferenceSession, mel: np.ndarray) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"audio_features": mel}), strict=True))


def run_decoder(
    session: ort.InferenceSession, encoded: dict[str, np.ndarray], steps
) -> list[np.ndarray]:
    """The decoder's logits for each call of `steps` (token ids per row), threading the self
    cache and feeding the encoder's cross cache to every call, as onnxruntime-genai does."""
    feeds = {}
    for info in session.get_inputs():
        if info.name.startswith("past_key_cross") or info.name.startswith("past_value_cross"):
            feeds[info.name] = encoded[info.name.replace("past_", "present_", 1)]
        elif info.name.startswith("past_"):
            dtype = np.float16 if info.type == "tensor(float16)" else np.float32
            shape = (len(steps[0]), info.shape[1], 0, info.shape[3])
            feeds[info.name] = np.zeros(shape, dtype)
    names = [o.name for o in session.get_outputs()]
    all_logits = []
    for ids in steps:
        feeds["input_ids"] = np.array(ids, np.int32)
        results = dict(zip(names, session.run(names, feeds), strict=True))
        all_logits.append(results["logits"])
        for name, value in results.items():
            if name.startswith("present_"):
                feeds[name.replace("present_", "past_", 1)] = value
    return all_logits


def hf_decoder_logits(
    model: WhisperForConditionalGeneration, mel: np.ndarray, steps
) -> list[np.ndarray]:
    """transformers' logits of the same calls, each from the whole sequence so far without a
    cache (the new positions' rows), so the graph's cache is checked against a cacheless run."""
    sequence = np.zeros((len(steps[0]), 0), np.int64)
    logits = []
    with torch.no_grad():
        encoded = model.model.encoder(torch.from_numpy(mel))  # once: it does not change
        for ids in steps:
            sequence = np.concatenate([sequence, np.array(ids, np.int64)], axis=1)
            out = model(encoder_outputs=encoded, decoder_input_ids=torch.from_numpy(sequence))
            logits.append(out.logits[:, -len(ids[0]) :].numpy())
    return logits


def hf_new_tokens(
    model: WhisperForConditionalGeneration,
    mel: np.ndarray,
    prompt: list[int],
    count: int,
    num_beams: int = 1,
) -> list[int]:
    """transformers' greedy (or beam search's) generate() after the forced `prompt`: the
    `count` new tokens (without suppressed tokens, which onnxruntime-genai does not apply)."""
    model.generation_config.suppress_tokens = None
    model.generation_config.begin_suppress_tokens = None
    with torch.no_grad():
        generated = model.generate(
            input_features=torch.from_numpy(mel),
            decoder_input_ids=torch.tensor([prompt]),
            max_new_tokens=count,
            do_sample=False,
            num_beams=num_beams,
        )[0].tolist()
    return generated[len(prompt) :] if generated[: len(prompt)] == prompt else generated


#: The decoder prompt transformers' generate() forces for English transcription without
#: timestamps, per layout (English-only checkpoints have no language or task token).
FORCED_PROMPT = {
    "multilingual": [50258, 50259, 50359, 50363],
    "english": [50257, 50362],
    "large-v3": [50258, 50259, 50360, 50364],
}


def tone(seconds: float = 2.0, frequency: float = 440.0, rate: int = 16_000) -> np.ndarray:
    """A generated test signal: a tone with a little seeded noise, float32 in [-1, 1]."""
    time = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(0).standard_normal(time.size)
    return (0.5 * np.sin(2 * np.pi * frequency * time) + 0.01 * noise).astype(np.float32)


def write_bundle(ckpt: Path, dest: Path, ep: str = "cpu") -> Path:
    """A Whisper bundle folder written by hand (graphs, genai_config.json,
    audio_processor_config.json), until the packager takes Whisper as a kind."""
    from mobius_genai.bundle.whisper_config import (
        AUDIO_PROCESSOR_CONFIG,
        audio_processor_config,
        whisper_genai_config,
    )
    from mobius_genai.ep.registry import get_ep

    config = read_config(ckpt)
    with build_context(ep, ir.DataType.FLOAT):
        models = whisper_graphs(config, Checkpoint(ckpt))
    dest.mkdir(parents=True, exist_ok=True)
    for key, model in models.items():
        optimize_model(model, ep, ir.DataType.FLOAT, WHISPER_ROLES[key])
        ir.save(model, dest / f"{key}.onnx", external_data=f"{key}.onnx.data")
    document = whisper_genai_config(config, get_ep(ep))
    (dest / "genai_config.json").write_text(json.dumps(document, indent=2))
    (dest / AUDIO_PROCESSOR_CONFIG).write_text(json.dumps(audio_processor_config(config)))
    return dest


def write_wav(path: Path, signal: np.ndarray, rate: int = 16_000) -> Path:
    """`signal` (float in [-1, 1]) as a 16-bit mono WAV file."""
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm16(signal).tobytes())
    return path


def write_encoded(path: Path, signal: np.ndarray, rate: int = 16_000) -> Path:
    """`signal` as a mono file in the format `path`'s suffix names: .flac or .ogg (Vorbis,
    through libsndfile) or .mp3 (64 kbit/s, through LAME)."""
    if path.suffix != ".mp3":
        import soundfile

        soundfile.write(path, signal, rate)
        return path
    import lameenc

    encoder = lameenc.Encoder()
    encoder.set_bit_rate(64)
    encoder.set_in_sample_rate(rate)
    encoder.set_channels(1)
    path.write_bytes(encoder.encode(pcm16(signal).tobytes()) + encoder.flush())
    return path


def pcm16(signal: np.ndarray) -> np.ndarray:
    return (np.clip(signal, -1, 1) * 32767).astype("<i2")


#: Per layout: the ids below the special tokens, the language tokens and the no-speech token.
_TOKENIZER_LAYOUTS = {
    "multilingual": (50_257, 99, "<|nospeech|>"),
    "english": (50_256, 99, "<|nocaptions|>"),
}


def write_multilingual_tokenizer(dest: Path) -> None:
    """`write_whisper_tokenizer` of the multilingual layout."""
    write_whisper_tokenizer(dest, "multilingual")


def write_whisper_tokenizer(dest: Path, layout: str) -> None:
    """tokenizer.json and tokenizer_config.json with the special tokens of `layout` at their ids
    (multilingual: <|endoftext|> 50257, <|startoftranscript|> 50258, <|en|> 50259,
    <|transcribe|> 50359, <|notimestamps|> 50363, timestamps up to 51864; English-only: each one
    lower) over a byte-level BPE without merges; the other ids below <|endoftext|> are
    placeholders the BPE never emits."""
    base, language_count, no_speech = _TOKENIZER_LAYOUTS[layout]
    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {f"<|unused_{i}|>": i for i in range(len(vocab), base)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    languages = ["<|en|>", "<|fr|>", *(f"<|lang_{i}|>" for i in range(language_count - 2))]
    tasks = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>"]
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *languages,
        *tasks,
        no_speech,
        "<|notimestamps|>",
        *timestamps,
    ]
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tokenizer.save(str(dest / "tokenizer.json"))
    end = "<|endoftext|>"
    config = {
        "tokenizer_class": "WhisperTokenizer",
        **{f"{kind}_token": end for kind in ("bos", "eos", "unk", "pad")},
        "model_max_length": 448,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config))


def hf_timestamp_tokens(
    model: WhisperForConditionalGeneration,
    mel: np.ndarray,
    count: int,
    layout: str = "multilingual",
) -> tuple[list[int], list[int]]:
    """transformers' generate(return_timestamps=True), English transcription on a multilingual
    layout: (its forced prompt, the `count` tokens its one 30 s window generated), with the
    generation config a released checkpoint of `layout` has for timestamps (no suppressed
    tokens, which onnxruntime-genai does not apply)."""
    multilingual = layout == "multilingual"
    config = model.generation_config
    config.no_timestamps_token_id = 50_363 if multilingual else 50_362
    config.max_initial_timestamp_index = 50
    config.is_multilingual = multilingual
    config.decoder_start_token_id = 50_258 if multilingual else 50_257
    config.suppress_tokens = config.begin_suppress_tokens = None
    forced = {}
    if multilingual:
        config.lang_to_id = {"<|en|>": 50_259, "<|fr|>": 50_260}
        config.task_to_id = {"translate": 50_358, "transcribe": 50_359}
        forced = {"language": "en", "task": "transcribe"}
    with torch.no_grad():
        out = model.generate(
            input_features=torch.from_numpy(mel),
            return_timestamps=True,
            max_new_tokens=count,
            return_dict_in_generate=True,
            return_segments=True,
            **forced,
        )
    window = out["segments"][0][0]["result"]["sequences"].tolist()  # the raw call's ids
    start = 3 if multilingual else 1
    return window[:start], window[start:]
