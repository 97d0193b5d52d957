"""BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T and its -bf16 master weights): llama's layer
with an RMSNorm before o_proj and down_proj, a relu² gated MLP, and with a bitnet
quantization_config ternary projections reading int8 activations (config/bitlinear.py,
components/bitlinear.py; the weights: checkpoint/prequantized/bitnet.py).

Defaults are what transformers' BitNetConfig fills in when config.json lacks the key.
"""

from __future__ import annotations

from mobius_genai.config.bitlinear import bitlinear_config
from mobius_genai.models.families.adapter import FamilyAdapter

BITNET = FamilyAdapter(
    model_type="bitnet",
    config_defaults={
        "vocab_size": 128256,
        "hidden_size": 2560,
        "intermediate_size": 6912,
        "num_hidden_layers": 30,
        "num_attention_heads": 20,
        "num_key_value_heads": 5,
        "hidden_act": "relu2",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    config_overrides={"bitlinear": bitlinear_config},
    weight_renames=(
        (r"\.self_attn\.o_proj\.pre\.sub_norm\.", ".self_attn.attn_sub_norm."),
        (r"\.mlp\.down_proj\.pre\.sub_norm\.", ".mlp.ffn_sub_norm."),
    ),
)
