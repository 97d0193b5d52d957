"""A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), read and
checked: what og's adapters can carry is plain LoRA on linear projections, nothing else.

Each projection's pair is returned as the graph wants it (components/lora.py): A = PEFT's
``lora_A.weight`` transposed, [in, r]; B = ``lora_B.weight`` transposed and multiplied by the
scale PEFT applies (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA), r and
lora_alpha per module where ``rank_pattern`` / ``alpha_pattern`` name it (matched as PEFT
matches them: a pattern is the end of the module's dotted name, as a regular expression).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np

from mobius_genai._json import read_json
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.errors import WeightsError

ADAPTER_CONFIG = "adapter_config.json"
#: PEFT's saved key: base_model.model.<module>.lora_A.weight (or lora_B).
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
#: adapter_config.json settings whose non-default value changes the math beyond plain LoRA.
_REFUSED = {
    "use_dora": (False, None),
    "bias": ("none", None),
    "modules_to_save": (None, []),
    "lora_bias": (False, None),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, []),
}


@dataclasses.dataclass(frozen=True)
class LoraPair:
    """One projection's LoRA weights, as float32: a [in, r], b [r, out] (scale applied)."""

    a: np.ndarray
    b: np.ndarray

    @property
    def rank(self) -> int:
        return int(self.a.shape[1])


@dataclasses.dataclass(frozen=True)
class PeftAdapter:
    """A PEFT LoRA adapter: its projections by module name (the checkpoint's), their leaf
    names (PEFT's target modules) and its largest rank."""

    folder: Path
    pairs: dict[str, LoraPair]
    rank: int

    @property
    def targets(self) -> list[str]:
        return sorted({module.rsplit(".", 1)[-1] for module in self.pairs})


def _fail(folder: Path, what: str) -> WeightsError:
    return WeightsError(f"adapter {folder}: {what}")


def read_peft_adapter(folder: str | Path) -> PeftAdapter:
    """Read and check the LoRA adapter in `folder`; WeightsError (one line) on anything that
    is not plain LoRA of linear projections: another PEFT type, DoRA, biases, saved modules,
    rank 0, pickled weights."""
    folder = Path(folder)
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise _fail(folder, f"no {ADAPTER_CONFIG}; accepted: a PEFT LoRA adapter folder")
    config = read_json(config_path, WeightsError, ADAPTER_CONFIG)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise _fail(folder, f"peft_type {peft_type!r}; accepted: 'LORA'")
    for key, accepted in _REFUSED.items():
        if config.get(key, accepted[0]) not in accepted:
            raise _fail(
                folder, f"{key}={config[key]!r} is not plain LoRA; accepted: {accepted[0]!r}"
            )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise _fail(folder, f"rank r={rank!r}; accepted: a positive integer")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _fail(folder, f"lora_alpha={alpha!r}; accepted: a number")
    checkpoint = Checkpoint(folder)  # safetensors only: pickled weights are refused there
    halves: dict[str, dict[str, np.ndarray]] = {}
    for name in checkpoint:
        match = _KEY.match(name)
        if match is None:
            raise _fail(
                folder,
                f"tensor {name!r} is not a LoRA weight of a linear projection; accepted: "
                "base_model.model.<module>.lora_A.weight / lora_B.weight",
            )
        array = np.asarray(checkpoint.read(name), dtype=np.float32)
        halves.setdefault(match["module"], {})[match["part"]] = array
    if not halves:
        raise _fail(folder, "no LoRA weights in adapter_model.safetensors")
    use_rslora = bool(config.get("use_rslora", False))
    ranks = _pattern(folder, config, "rank_pattern", halves, _positive_int)
    alphas = _pattern(folder, config, "alpha_pattern", halves, _number)
    pairs = {
        module: _pair(
            folder, module, parts, ranks.get(module, rank), alphas.get(module, alpha), use_rslora
        )
        for module, parts in sorted(halves.items())
    }
    return PeftAdapter(folder, pairs, max(pair.rank for pair in pairs.values()))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pattern(
    folder: Path, config: dict, key: str, modules: dict[str, object], valid
) -> dict[str, float]:
    """The values `config[key]` (PEFT's rank_pattern or alpha_pattern) gives modules, by
    module; each pattern must be valid and match one of the adapter's modules."""
    patterns = config.get(key) or {}
    if not isinstance(patterns, dict) or not all(valid(v) for v in patterns.values()):
        kind = "positive integers" if key == "rank_pattern" else "numbers"
        raise _fail(folder, f"{key}={patterns!r}; accepted: module name patterns to {kind}")
    found: dict[str, float] = {}
    for pattern, value in patterns.items():
        try:
            matched = [m for m in modules if re.match(rf"(.*\.)?({pattern})$", m)]
        except re.error as error:
            raise _fail(
                folder,
                f"{key} {pattern!r} is no regular expression ({error}); accepted: a Python "
                "regular expression matching the end of a module's name",
            ) from None
        if not matched:
            raise _fail(
                folder,
                f"{key} {pattern!r} matches none of the adapter's modules; accepted: the end of "
                f"a module's name, such as {next(iter(sorted(modules)))!r}",
            )
        for module in matched:  # PEFT takes the first pattern that matches a module
            found.setdefault(module, value)
    return found


def _pair(
    folder: Path,
    module: str,
    parts: dict[str, np.ndarray],
    configured: int,
    alpha: float,
    rslora: bool,
) -> LoraPair:
    if set(parts) != {"A", "B"}:
        raise _fail(folder, f"{module}: lora_A and lora_B come in pairs; found {sorted(parts)}")
    a, b = parts["A"], parts["B"]
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise _fail(
            folder,
            f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not make a LoRA "
            "pair; accepted: [r, in] and [out, r]",
        )
    rank = a.shape[0]
    if rank == 0:
        raise _fail(folder, f"{module}: rank 0; accepted: a positive rank")
    if rank != configured:
        raise _fail(
            folder,
            f"{module}: lora_A has rank {rank}, adapter_config.json says {configured}; accepted: "
            "tensors of the rank r (or rank_pattern) gives the module",
        )
    scale = alpha / (math.sqrt(rank) if rslora else rank)
    return LoraPair(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T * np.float32(scale)))
