"""Whisper checkpoints: config.json (`model_type` "whisper") → one frozen WhisperConfig.

Every released size reads the same keys: tiny to large-v3, the English-only checkpoints (a
vocabulary of 51864 without the language tokens), large-v3's 128 mel bins and turbo's 4-layer
decoder under a 32-layer encoder. Sizes are bounded like a decoder's (size_limits.py) before
anything is sized by them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import activation
from mobius_genai.config.layers import check_layer_count
from mobius_genai.config.limits import SIZE_LIMITS
from mobius_genai.errors import ConfigError

#: The smallest multilingual vocabulary: English-only checkpoints lack the language tokens
#: (transformers' WhisperTokenizer and generate() decide "multilingual" the same way).
MULTILINGUAL_VOCAB = 51_865

#: config.json key → (transformers' WhisperConfig default, the SIZE_LIMITS bound it shares).
_SIZES: dict[str, tuple[int, str]] = {
    "vocab_size": (51_865, "vocab_size"),
    "num_mel_bins": (80, "hidden_size"),
    "d_model": (384, "hidden_size"),
    "encoder_layers": (4, "num_hidden_layers"),
    "encoder_attention_heads": (6, "num_attention_heads"),
    "encoder_ffn_dim": (1536, "intermediate_size"),
    "decoder_layers": (4, "num_hidden_layers"),
    "decoder_attention_heads": (6, "num_attention_heads"),
    "decoder_ffn_dim": (1536, "intermediate_size"),
    "max_source_positions": (1500, "max_position_embeddings"),
    "max_target_positions": (448, "max_position_embeddings"),
}
#: Token ids (WhisperConfig defaults): the decoder prompt starts at decoder_start_token_id.
_TOKEN_IDS = {
    "bos_token_id": 50_257,
    "eos_token_id": 50_257,
    "pad_token_id": 50_256,
    "decoder_start_token_id": 50_258,
}


@dataclasses.dataclass(frozen=True)
class WhisperConfig:
    """Whisper's encoder-decoder sizes.

    encoder  mel [batch, num_mel_bins, 2 * max_source_positions] → two Conv1d (the second of
             stride 2) → + positions → pre-norm layers → LayerNorm [batch, max_source_positions,
             d_model]
    decoder  tokens + learned positions → pre-norm layers (causal self-attention, cross-
             attention over the encoder output, MLP) → LayerNorm → tied output [.., vocab_size]
    """

    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_attention_heads: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int
    activation_function: str = "gelu"
    layer_norm_eps: float = 1e-5
    bos_token_id: int = 50_257
    eos_token_id: int = 50_257
    pad_token_id: int = 50_256
    decoder_start_token_id: int = 50_258

    @property
    def encoder_head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def decoder_head_dim(self) -> int:
        return self.d_model // self.decoder_attention_heads

    @property
    def mel_frames(self) -> int:
        """The mel frames the encoder takes: its two convolutions halve them to the positions."""
        return 2 * self.max_source_positions

    @property
    def multilingual(self) -> bool:
        return self.vocab_size >= MULTILINGUAL_VOCAB

    def first_layers(self, count: int) -> WhisperConfig:
        """The same model with only its decoder's first `count` layers (the smoke test's twin;
        the encoder, run once per audio, stays whole)."""
        check_layer_count(count, self.decoder_layers, "decoder layer count")
        return dataclasses.replace(self, decoder_layers=count)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WhisperConfig:
        """Parse a Whisper config.json (transformers' WhisperConfig defaults where absent)."""
        kind = fields.model_type(raw.get("model_type"))
        if kind != "whisper":
            raise ConfigError(
                f"config.json: field 'model_type' is {kind!r}; accepted: 'whisper' here"
            )
        sizes = {}
        for key, (default, bound) in _SIZES.items():
            sizes[key] = fields.integer(raw.get(key), key, default)
            if sizes[key] > SIZE_LIMITS[bound]:
                raise ConfigError(
                    f"config.json: field {key!r} is {sizes[key]}, above {SIZE_LIMITS[bound]}, "
                    f"more than any released model has; accepted: 1 to {SIZE_LIMITS[bound]}"
                )
        ids = {
            key: fields.integer(raw.get(key), key, default, positive=False)
            for key, default in _TOKEN_IDS.items()
        }
        act = activation(raw.get("activation_function", "gelu"), "activation_function")
        if fields.flag(raw.get("scale_embedding"), "scale_embedding", False):
            raise ConfigError(
                "config.json: field 'scale_embedding' is true; accepted: false (every released "
                "Whisper checkpoint; its embeddings are not scaled)"
            )
        _check_divides(sizes)
        for key, value in ids.items():
            if value >= sizes["vocab_size"]:
                raise ConfigError(
                    f"config.json: field {key!r} is {value}, outside the vocabulary; accepted: "
                    f"0 to vocab_size - 1 ({sizes['vocab_size'] - 1})"
                )
        return cls(**sizes, **ids, activation_function=act)


def _check_divides(sizes: Mapping[str, int]) -> None:
    """d_model splits evenly into each stack's heads, and into sine and cosine halves."""
    for heads in ("encoder_attention_heads", "decoder_attention_heads"):
        if sizes["d_model"] % sizes[heads]:
            raise ConfigError(
                f"config.json: d_model {sizes['d_model']} is not a multiple of {heads} "
                f"{sizes[heads]}"
            )
    if sizes["d_model"] % 2:
        raise ConfigError(
            f"config.json: d_model {sizes['d_model']} is odd; accepted: an even size (the "
            "encoder's positions are sine and cosine halves)"
        )
