"""compressed-tensors checkpoints in its float-quantized format (llm-compressor's FP8 models:
FP8-dynamic, FP8 block): read as `fp8.Fp8Checkpoint` reads transformers' FP8 checkpoints.

config.json says `quantization_config: {"quant_method": "compressed-tensors", "format":
"float-quantized", "config_groups": {NAME: {"targets": ["Linear"], "weights": {"num_bits": 8,
"type": "float", "strategy": S, ...}, "input_activations": ...}}, "ignore": [...]}`; each
quantized Linear weight `X.weight` is stored F8_E4M3 beside `X.weight_scale`, and
``w = float(q) * weight_scale`` per block (`strategy: "block"`, `block_structure` [R, C]),
per output channel (`"channel"`: scales [rows, 1]) or per tensor (`"tensor"`: one scale).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.prequantized.fp8 import Fp8Scheme, block_sizes
from mobius_genai.errors import ConfigError

__all__ = ["read_compressed_fp8_config"]

METHOD = "compressed-tensors"
FORMAT = "float-quantized"
_WHERE = "config.json: quantization_config"
#: strategy → the block of its scales (None: the whole axis); "block" reads block_structure.
_STRATEGIES: dict[str, tuple[int | None, int | None]] = {
    "tensor": (None, None),
    "channel": (1, None),
}
#: Keys of a group's `weights` and the one value each is read with.
_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}


def read_compressed_fp8_config(raw: Mapping[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme of config.json `raw`'s compressed-tensors quantization_config; None
    unless its quant_method is "compressed-tensors". Raises ConfigError naming the key for
    anything else: another format, static activation scales, an FP8 KV cache, groups that
    quantize weights differently."""
    qc = raw.get("quantization_config")
    if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != METHOD:
        return None
    if qc.get("format") != FORMAT:
        raise ConfigError(
            f"{_WHERE}.format is {qc.get('format')!r} ({METHOD}); accepted: {FORMAT!r} "
            "(FP8 weights)"
        )
    if qc.get("kv_cache_scheme") is not None:
        raise ConfigError(
            f"{_WHERE}.kv_cache_scheme is set ({METHOD}); accepted: null (the scales of an "
            "FP8 KV cache are not read)"
        )
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(f"{_WHERE}.config_groups is {groups!r}; accepted: an object of groups")
    schemes = {
        _group_scheme(f"{_WHERE}.config_groups.{name}", group) for name, group in groups.items()
    }
    if len(schemes) != 1:
        raise ConfigError(
            f"{_WHERE}.config_groups quantize weights in {len(schemes)} ways ({METHOD}); "
            "accepted: one weights scheme for every group"
        )
    return schemes.pop()


def _group_scheme(where: str, group: Any) -> Fp8Scheme:
    """The scheme of one config group's `weights`, its activations checked to be dynamic."""
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        raise ConfigError(f"{where}.weights is missing; accepted: an object ({METHOD})")
    for key, value in _WEIGHTS.items():
        if weights.get(key, value) != value:
            raise ConfigError(
                f"{where}.weights.{key} is {weights.get(key)!r} ({METHOD}); accepted: {value!r}"
            )
    activations = group.get("input_activations")
    if isinstance(activations, Mapping) and not activations.get("dynamic", False):
        raise ConfigError(
            f"{where}.input_activations.dynamic is {activations.get('dynamic')!r} ({METHOD}); "
            "accepted: true or no input_activations (static activation scales are not read)"
        )
    strategy = weights.get("strategy")
    if strategy == "block":
        block = block_sizes(weights.get("block_structure"))
        if block is None:
            raise ConfigError(
                f"{where}.weights.block_structure is {weights.get('block_structure')!r} "
                f"({METHOD}); accepted: two positive integers such as [128, 128]"
            )
        return Fp8Scheme(block, scale_suffix="_scale", words="block_structure")
    if strategy not in _STRATEGIES:
        raise ConfigError(
            f"{where}.weights.strategy is {strategy!r} ({METHOD}); accepted: "
            f"{', '.join(map(repr, [*_STRATEGIES, 'block']))}"
        )
    return Fp8Scheme(_STRATEGIES[strategy], scale_suffix="_scale", words=f"strategy {strategy!r}")
