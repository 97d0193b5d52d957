"""transformers' defaults of the text config classes whose text_config a vision-language row
(models/vision_language.py) fills where a nested text_config leaves a key out, as transformers
builds it: the keys each text family's row requires, which hub configs may omit."""

from __future__ import annotations

#: Lfm2Config's defaults: Lfm2VlConfig's text_config, given or left out.
LFM2_DEFAULTS = {
    "vocab_size": 65_536,
    "hidden_size": 2560,
    "intermediate_size": 12_288,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 128_000,
    "norm_eps": 1e-5,
    "rope_theta": 1_000_000.0,
}

#: The defaults of the classes a Mistral 3 text_config's model_type names (MistralConfig,
#: Ministral3Config, DeepseekV3Config), for the keys their rows require.
MISTRAL3_TEXT_CLASSES = {
    "mistral": {
        "vocab_size": 32_000,
        "hidden_size": 4096,
        "intermediate_size": 14_336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 131_072,
    },
    "ministral3": {
        "vocab_size": 131_072,
        "hidden_size": 4096,
        "intermediate_size": 14_336,
        "num_hidden_layers": 34,
        "num_attention_heads": 32,
    },
    "deepseek_v3": {
        "vocab_size": 129_280,
        "hidden_size": 7168,
        "intermediate_size": 18_432,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "n_group": 8,
        "num_experts_per_tok": 8,
        "max_position_embeddings": 4096,
    },
}
