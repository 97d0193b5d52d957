"""The vision lines of gpu_check.py: the vision graph (Qwen2.5-VL's PackedMultiHeadAttention on
cuda, Gemma 3's SigLIP tower, Qwen3-VL's, Pixtral's and LFM2-VL's SigLIP2 towers) against
transformers' vision tower, and onnxruntime-genai's greedy
tokens with an image against the cpu bundle's (Gemma 3: its decoder's GroupQueryAttention with
the image-block attention_bias)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from _gpu_lines import TOLERANCE
from _gpu_run import (
    Run,
    cpu_copy,
    cpu_greedy,
    cpu_refusal,
    device_models,
    relative_error,
    tokens_step,
)

_FLOAT16 = "tensor(float16)"


def check_vision(run: Run, cuda: Path | None, cpu: Path | None, hf_model: Any) -> None:
    """The `features` step and, with graph capture off and on, the `tokens-*` steps."""
    from mobius_genai.runtime.smoke_image import png_bytes, smoke_pixels

    pixels = smoke_pixels(*run.line.vision.image_size)
    image = run.folder / "image.png"
    image.write_bytes(png_bytes(pixels))
    expected = None
    if cpu is not None:
        expected = run.step("cpu", lambda: cpu_greedy(run, cpu, lambda m: _inputs(m, cpu, image)))
    if cuda is None:
        return
    run.step("features", lambda: _features(run, cuda, hf_model, pixels))
    for capture, model in device_models(run, cuda, ("tokens",)):
        if expected is not None:
            run.step(
                f"tokens-{capture}",
                lambda m=model, c=capture: tokens_step(
                    run, m, expected, c, _inputs(m, cuda, image)
                ),
            )


def _inputs(model: Any, bundle: Path, image: Path) -> Any:
    """The multimodal processor's inputs for an image and a few words."""
    import onnxruntime_genai as og

    from mobius_genai.runtime.generate import image_placeholder

    config = json.loads((bundle / "genai_config.json").read_text())
    placeholder = image_placeholder(bundle, config)
    processor = model.create_multimodal_processor()
    return processor(f"{placeholder} Describe.", images=og.Images.open(str(image)))


def _qwen_vl_tower(model: Any, pixels: np.ndarray, device: str) -> tuple[dict, Any]:
    """Qwen2.5-VL: merged patches and their grid; the tower's merged features."""
    import torch

    from tests._qwen_vl import patches

    pixel_values, grid = patches(pixels)
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(pixel_values).to(device), torch.from_numpy(grid).to(device)
        )
    parts = getattr(output, "pooler_output", output)  # older transformers: the tensors
    reference = parts if torch.is_tensor(parts) else torch.cat(list(parts))
    return {"pixel_values": pixel_values, "image_grid_thw": grid}, reference


def _gemma3_tower(model: Any, pixels: np.ndarray, device: str) -> tuple[dict, Any]:
    """Gemma 3: the processor's pixels (rescaled, normalized, channels first); SigLIP's
    features pooled and projected into the decoder's width."""
    import torch

    pixel_values = ((pixels / 255 - 0.5) / 0.5).astype(np.float32).transpose(2, 0, 1)[None]
    with torch.no_grad():
        output = model.model.get_image_features(torch.from_numpy(pixel_values).to(device))
    return {"pixel_values": pixel_values}, getattr(output, "pooler_output", output)


def _qwen3_vl_tower(model: Any, pixels: np.ndarray, device: str) -> tuple[dict, Any]:
    """Qwen3-VL: Qwen2.5-VL's patches; the merged features and the DeepStack mergers' beside
    them, as the vision graph's image_features carries them."""
    import torch

    from tests._qwen_vl import patches

    pixel_values, grid = patches(pixels)
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(pixel_values).to(device), torch.from_numpy(grid).to(device)
        )
    parts = [output.pooler_output, *output.deepstack_features]
    reference = torch.cat([torch.cat(list(part)) for part in parts], dim=-1)
    return {"pixel_values": pixel_values, "image_grid_thw": grid}, reference


def _mistral3_tower(model: Any, pixels: np.ndarray, device: str) -> tuple[dict, Any]:
    """Mistral 3: Pixtral's pixels at the image's size; the tower's merged, projected tokens."""
    import torch

    from tests._mistral3 import pixel_values

    values = pixel_values(pixels)
    sizes = torch.tensor([list(pixels.shape[:2])], device=device)
    with torch.no_grad():
        output = model.model.get_image_features(torch.from_numpy(values).to(device), sizes)
    return {"pixel_values": values}, torch.cat(list(output.pooler_output))


def _lfm2_vl_tower(model: Any, pixels: np.ndarray, device: str) -> tuple[dict, Any]:
    """LFM2-VL: SigLIP2's padded patches, their mask and grid; the projected tokens."""
    import torch

    from tests._lfm2_vl import image_inputs

    feeds = image_inputs([pixels])
    keys = ("pixel_values", "spatial_shapes", "pixel_attention_mask")
    with torch.no_grad():
        output = model.model.get_image_features(
            *(torch.from_numpy(feeds[key]).to(device) for key in keys)
        )
    return feeds, torch.cat(list(output.pooler_output))


#: Per vision family: (transformers' model, uint8 pixels, device) → the vision graph's feeds
#: (float32 pixels) and transformers' image features for them.
_TOWERS: Mapping[str, Callable[[Any, np.ndarray, str], tuple[dict, Any]]] = MappingProxyType(
    {
        "qwen2_5_vl": _qwen_vl_tower,
        "gemma3": _gemma3_tower,
        "qwen3_vl": _qwen3_vl_tower,
        "mistral3": _mistral3_tower,
        "lfm2_vl": _lfm2_vl_tower,
    }
)


def _features(run: Run, bundle: Path, hf_model: Any, pixels: np.ndarray) -> None:
    """The bundle's vision graph on the device against transformers' vision tower (float32)."""
    session = _vision_session(run, bundle)
    if session is None:
        return
    kind = session.get_inputs()[0].type
    if kind not in (_FLOAT16, "tensor(float)"):
        run.record("features", None, f"pixel_values is {kind}: numpy has no such array for it")
        return
    feeds, reference = _TOWERS[run.line.family](hf_model.to(run.device), pixels, run.device)
    feeds["pixel_values"] = feeds["pixel_values"].astype(
        np.float16 if kind == _FLOAT16 else np.float32
    )
    ours = session.run(["image_features"], feeds)[0].astype(np.float32)
    reference = reference.float().cpu().numpy().reshape(ours.shape)
    relative = relative_error(ours, reference)
    tolerance = TOLERANCE[run.line.precision]
    note = f"{relative:.2e} of the largest feature (tolerance {tolerance:g})"
    run.record("features", relative <= tolerance, note, value=relative)


def _vision_session(run: Run, bundle: Path) -> Any:
    """An onnxruntime session of the vision graph: CUDA, or (dry run) CPU on the bundle's CPU
    copy (PackedMultiHeadAttention's standard body inlined: the CPU provider has no kernel)."""
    import onnxruntime as ort

    if run.dry_run:
        refusal = cpu_refusal(run)
        if refusal is not None:
            run.record("features", None, refusal)
            return None
        bundle = cpu_copy(bundle)
    config = json.loads((bundle / "genai_config.json").read_text())
    path = str(bundle / config["model"]["vision"]["filename"])
    provider = "CPUExecutionProvider" if run.dry_run else "CUDAExecutionProvider"
    return ort.InferenceSession(path, providers=[provider])
