"""Test-only writer of BitNet b1.58 checkpoints in the forms the hub has them, from a tiny
float bitnet checkpoint (tests/_hf.py): each projection of the layers ternarized
(absmean, as transformers' WeightQuant), then packed by transformers' own `pack_weights`
with its `weight_scale`, or kept as bf16 master weights for quantization_mode "online"."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers.integrations.bitnet import pack_weights

_PROJECTION = re.compile(r"\.layers\.\d+\..*_proj\.weight$")

#: form → config.json's quantization_config.
FORMS = {
    "autobitlinear": {
        "quant_method": "bitnet",
        "linear_class": "autobitlinear",
        "quantization_mode": "offline",
    },
    "bitlinear": {"quant_method": "bitnet", "linear_class": "bitlinear"},
    "bf16_online": {
        "quant_method": "bitnet",
        "linear_class": "autobitlinear",
        "quantization_mode": "online",
    },
}


def ternary_checkpoint(float_ckpt: Path, out: Path, form: str) -> Path:
    """`float_ckpt` rewritten in `form` (a key of FORMS) at `out`."""
    shutil.copytree(float_ckpt, out)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if _PROJECTION.search(n)]:
        weight = tensors[name].float()
        if form == "bf16_online":
            tensors[name] = weight.to(torch.bfloat16)
            continue
        mean = weight.abs().mean().clamp(min=1e-5)
        values = (weight / mean).round().clamp(-1, 1)
        tensors[name] = pack_weights(values.clone())
        scale = mean if form == "autobitlinear" else 1 / mean
        tensors[f"{name}_scale"] = scale.reshape(1).float()
    save_file(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = FORMS[form]
    (out / "config.json").write_text(json.dumps(config))
    return out


def ternary_values(packed: np.ndarray) -> np.ndarray:
    """transformers' `unpack_weights` of a packed uint8 tensor, as int8."""
    from transformers.integrations.bitnet import unpack_weights

    return unpack_weights.__wrapped__(torch.from_numpy(packed), torch.int8).numpy()
