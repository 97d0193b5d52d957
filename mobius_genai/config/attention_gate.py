"""An attention output gate read from a projection of its own, `g_proj`.

The attention output, before o_proj, is multiplied by act(x @ g_proj), where x is the layer's
normed input and act is softplus (Laguna) or sigmoid (AFMoE, whose checkpoint calls the
projection `gate_proj`: its row renames it), computed in float32 as Laguna's transformers does.
The gate has one value per head (`per_head`: broadcast over the head's channels, Laguna's
"per-head" gating) or one per channel (AFMoE). Qwen3.5's gate, which q_proj yields beside the
queries, is ArchitectureConfig's `attention_output_gate` instead.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.errors import ConfigError, UnsupportedModelError

GATE_ACTIVATIONS = ("softplus", "sigmoid")
#: Laguna's `gating` values: True and "per-head" gate each head, "per-element" each channel.
_GRANULARITIES = {True: True, "per-head": True, "per-element": False}


@dataclasses.dataclass(frozen=True)
class AttentionGate:
    """act(x @ g_proj) times the attention output (see the module docstring)."""

    activation: str = "softplus"
    per_head: bool = True


def read_gating(value: object, model_type: str) -> AttentionGate | None:
    """Laguna's `gating` switch: None (False) or the gate's granularity; others refused."""
    if value is False:
        return None
    if isinstance(value, bool | str) and value in _GRANULARITIES:
        return AttentionGate(per_head=_GRANULARITIES[value])
    raise UnsupportedModelError(
        f"config.json: gating is {value!r}; {model_type} models are supported with gating "
        "true, false, 'per-head' or 'per-element'"
    )


def validate_attention_gate(gate: AttentionGate | None) -> None:
    """Refuse a gate the attention cannot compute."""
    if gate is None:
        return
    if not isinstance(gate, AttentionGate) or gate.activation not in GATE_ACTIVATIONS:
        raise ConfigError(
            f"config.json: attention gate {gate!r}; accepted: an AttentionGate with activation "
            f"in {list(GATE_ACTIVATIONS)}"
        )
