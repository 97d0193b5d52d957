"""The speech lines of gpu_check.py: Whisper's encoder and decoder graphs on cuda, run by
onnxruntime-genai from a generated tone through its own audio processor, against transformers
(the same log-mel features, og's greedy tokens fed back) and against the cpu bundle's tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from _gpu_lines import TOLERANCE
from _gpu_run import Run, cpu_greedy, device_models, greedy, relative_error, tokens_step

AUDIO_SECONDS = 3.0


def check_speech(run: Run, cuda: Path | None, cpu: Path | None, hf_model: Any) -> None:
    """`cpu` greedy tokens, then with graph capture off and on the `logits-*` and `tokens-*`
    steps."""
    from tests.models.whisper._whisper import tone, write_wav

    wav = write_wav(run.folder / "tone.wav", tone(AUDIO_SECONDS))
    expected = None
    if cpu is not None:
        expected = run.step("cpu", lambda: cpu_greedy(run, cpu, lambda m: _inputs(m, cpu, wav)))
    if cuda is None:
        return
    for capture, model in device_models(run, cuda, ("logits", "tokens")):
        run.step(
            f"logits-{capture}",
            lambda m=model, c=capture: _logits(run, m, _inputs(m, cuda, wav), hf_model, c),
        )
        if expected is not None:
            run.step(
                f"tokens-{capture}",
                lambda m=model, c=capture: tokens_step(run, m, expected, c, _inputs(m, cuda, wav)),
            )


def _inputs(model: Any, bundle: Path, wav: Path) -> Any:
    """og's audio processor's inputs for the bundle's transcription prompt and `wav`."""
    import onnxruntime_genai as og

    from mobius_genai.runtime.audio import prompt_text

    config = json.loads((bundle / "genai_config.json").read_text())
    text = prompt_text(bundle, config, None, "transcribe")
    return model.create_multimodal_processor()(text, audios=og.Audios.open(str(wav)))


def _logits(run: Run, model: Any, inputs: Any, hf_model: Any, capture: str) -> None:
    """og's logits of each greedy step against transformers' for the same log-mel features
    and the same tokens (og's, fed back in one cacheless pass), float32 on the device."""
    import torch

    prompt = inputs["input_ids"].as_numpy().astype(np.int64)
    mel = inputs["audio_features"].as_numpy().astype(np.float32)
    ours = greedy(model, run.new_tokens, inputs)
    sequence = np.concatenate([prompt, np.array([ours["tokens"][:-1]], np.int64)], axis=1)
    hf_model = hf_model.to(run.device)
    with torch.no_grad():
        out = hf_model(
            input_features=torch.from_numpy(mel).to(run.device),
            decoder_input_ids=torch.from_numpy(sequence).to(run.device),
        )
    reference = out.logits[0, prompt.shape[1] - 1 :].float().cpu().numpy()
    relative = relative_error(ours["logits"], reference)
    tolerance = TOLERANCE[run.line.precision]
    note = f"{relative:.2e} of the largest logit (tolerance {tolerance:g}), {len(reference)} steps"
    run.record(f"logits-{capture}", relative <= tolerance, note, value=relative)
