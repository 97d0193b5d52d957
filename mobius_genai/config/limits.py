"""Upper bounds of model sizes: a config.json asking for more is refused before anything is
sized by it (per-layer lists, rotary tables, the graph), instead of hanging or allocating
gigabytes. The one place these bounds live; config.py applies them to config.json fields,
build.py to the context length a build asks for, and bundle/chat_template.py to the chat
templates of checkpoints and bundles."""

from __future__ import annotations

from mobius_genai.errors import ConfigError, MobiusError

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


#: Bytes (UTF-8) of a chat template; the largest known are ~16 KB (MiroThinker-v1: 15,569;
#: Gemma 4: 12,133). onnxruntime-genai 0.18's template engine takes time quadratic in a
#: template's statements: 60 KB of them took ~4 s to load and ~4 s to render (one loaded core),
#: 100 KB ~12 s each, 1 MB beyond two minutes (a 200 MB template hung `run`).
CHAT_TEMPLATE_BYTES = 65_536


def check_chat_template_size(
    template: str, source: str, error: type[MobiusError] = ConfigError
) -> None:
    """Refuse a chat `template` (read from `source`, a file) above CHAT_TEMPLATE_BYTES."""
    size = len(template.encode("utf-8", errors="surrogatepass"))
    if size > CHAT_TEMPLATE_BYTES:
        raise error(
            f"{source}: the chat template is {size} bytes, above {CHAT_TEMPLATE_BYTES}, more "
            f"than any released model's; accepted: up to {CHAT_TEMPLATE_BYTES} bytes"
        )
