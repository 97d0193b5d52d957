"""config.json's bitnet `quantization_config` (transformers' BitNetQuantConfig), checked: read
by the config (whether projections take int8 activations) and by the checkpoint reader (how the
ternary weights are stored), without the weight readers' imports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.errors import ConfigError

_WHERE = "config.json: quantization_config"
#: linear_class → the quantization modes transformers builds it with.
_CLASSES = {"bitlinear": ("offline", "online"), "autobitlinear": ("offline", "online")}


def bitnet_quantization(raw: Mapping[str, Any]) -> tuple[str, str] | None:
    """(linear_class, quantization_mode) of a bitnet `quantization_config`; None when
    config.json has another or none. Raises ConfigError for values transformers would not
    build."""
    qc = raw.get("quantization_config")
    if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != "bitnet":
        return None
    linear_class = str(qc.get("linear_class", "bitlinear")).lower()
    mode = str(qc.get("quantization_mode", "offline")).lower()
    if linear_class not in _CLASSES:
        raise ConfigError(
            f"{_WHERE}.linear_class is {qc.get('linear_class')!r}; accepted: {', '.join(_CLASSES)}"
        )
    if mode not in _CLASSES[linear_class]:
        raise ConfigError(
            f"{_WHERE}.quantization_mode is {qc.get('quantization_mode')!r}; accepted: "
            f"{', '.join(_CLASSES[linear_class])}"
        )
    if qc.get("use_rms_norm"):
        raise ConfigError(
            f"{_WHERE}.use_rms_norm is {qc['use_rms_norm']!r}; accepted: false (the model's "
            "own attn_sub_norm and ffn_sub_norm)"
        )
    kept = [m for m in qc.get("modules_to_not_convert") or () if m != "lm_head"]
    if kept:
        raise ConfigError(
            f"{_WHERE}.modules_to_not_convert is {qc['modules_to_not_convert']!r}; accepted: "
            "none but lm_head (every projection of the layers ternary)"
        )
    return linear_class, mode
