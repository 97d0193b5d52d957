"""Upper bounds of model sizes: a config.json asking for more is refused before anything is
sized by it (per-layer lists, rotary tables, the graph), instead of hanging or allocating
gigabytes. The one place these bounds live; config.py applies them to config.json fields and
build.py to the context length a build asks for."""

from __future__ import annotations

from mobius_genai.errors import ConfigError

#: Field → bound, each well above every released model (the largest known in the comment).
#: `context_length` is the bundle's context (--context-length), bounded like the positions.
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 1024,  # 126 (Llama 3.1 405B)
    "hidden_size": 131_072,  # 16384 (Llama 3.1 405B)
    "intermediate_size": 524_288,  # 73728 (Nemotron-4 340B)
    "vocab_size": 4_194_304,  # 262144 (Gemma 3)
    "num_attention_heads": 1024,  # 128 (Llama 3.1 405B)
    "num_key_value_heads": 1024,  # as num_attention_heads
    "head_dim": 2048,  # 256 (Gemma)
    "max_position_embeddings": 16_777_216,  # 10485760 (Llama 4 Scout)
    "context_length": 16_777_216,  # as max_position_embeddings
}


def check_size(field: str, value: int, source: str = "config.json: field") -> None:
    """Refuse `value` of the size `field` when it is above its SIZE_LIMITS bound."""
    limit = SIZE_LIMITS[field]
    if value > limit:
        raise ConfigError(
            f"{source} {field!r} is {value}, above {limit}, more than any released model "
            f"has; accepted: 1 to {limit}"
        )
