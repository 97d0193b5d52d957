"""config.json of every Whisper size → WhisperConfig, and one-line errors for bad fields."""

from __future__ import annotations

import pytest
from transformers import WhisperConfig as HFWhisperConfig

from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.errors import ConfigError

#: The released shapes (openai/whisper-*): d_model, layers, heads, ffn, mel bins, vocabulary.
SIZES = {
    "tiny": (384, 4, 4, 6, 1536, 80, 51_865),
    "tiny.en": (384, 4, 4, 6, 1536, 80, 51_864),
    "base": (512, 6, 6, 8, 2048, 80, 51_865),
    "small.en": (768, 12, 12, 12, 3072, 80, 51_864),
    "medium": (1024, 24, 24, 16, 4096, 80, 51_865),
    "large-v2": (1280, 32, 32, 20, 5120, 80, 51_865),
    "large-v3": (1280, 32, 32, 20, 5120, 128, 51_866),
    "large-v3-turbo": (1280, 32, 4, 20, 5120, 128, 51_866),
}


def _raw(size: str) -> dict:
    """config.json as transformers writes it for `size`."""
    d_model, encoder, decoder, heads, ffn, mels, vocab = SIZES[size]
    return HFWhisperConfig(
        d_model=d_model,
        encoder_layers=encoder,
        decoder_layers=decoder,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        num_mel_bins=mels,
        vocab_size=vocab,
    ).to_dict()


@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_released_size_parses(size):
    d_model, encoder, decoder, heads, ffn, mels, vocab = SIZES[size]
    config = WhisperConfig.from_dict(_raw(size))
    assert config.encoder_attention_heads == config.decoder_attention_heads == heads
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (
        d_model,
        encoder,
        decoder,
    )
    assert (config.encoder_ffn_dim, config.num_mel_bins, config.vocab_size) == (ffn, mels, vocab)
    assert config.decoder_head_dim == config.encoder_head_dim == 64
    assert config.mel_frames == 3000
    assert config.max_target_positions == 448
    assert config.multilingual == (not size.endswith(".en"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "'model_type' is 'llama'; accepted: 'whisper'"),
        (
            {"decoder_attention_heads": 7},
            "d_model 384 is not a multiple of decoder_attention_heads 7",
        ),
        ({"encoder_layers": 5000}, "field 'encoder_layers' is 5000, above 1024"),
        ({"d_model": 0}, "field 'd_model' must be a positive integer, found 0"),
        ({"scale_embedding": True}, "'scale_embedding' is true; accepted: false"),
        ({"eos_token_id": 51_865}, "field 'eos_token_id' is 51865, outside the vocabulary"),
        ({"activation_function": "swish"}, "'activation_function' is 'swish'; accepted"),
    ],
)
def test_bad_fields_are_one_line_errors(change, message):
    with pytest.raises(ConfigError) as error:
        WhisperConfig.from_dict({**_raw("tiny"), **change})
    assert message in str(error.value)
    assert "\n" not in str(error.value)
