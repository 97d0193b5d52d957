"""GPT-2's names, shared by the families whose checkpoints keep them (gpt2, gptj, exaone), and
GPT-2's layer, shared by the families that keep it (gpt2, gpt_bigcode, gpt_neo, openai-gpt); GPT-J's layer
and names, shared by gptj and codegen."""

from mobius_genai.config import fields
from mobius_genai.models.families.adapter import FusedWeight
from mobius_genai.models.families.heads import kv_head_per_head, split_hidden
from mobius_genai.models.families.rope import gptj_partial_rotary, gptj_rope
from mobius_genai.models.families.scales import gpt2_scale

# GPT-2's tensor layout (gpt2, gptj, exaone): the renames besides attention and MLP names.
GPT2_LAYOUT = (
    (r"\.input_layernorm\.", ".ln_1."),
    (r"^model\.layers\.", "transformer.h."),
    (r"^model\.embed_tokens\.", "transformer.wte."),
    (r"^model\.norm\.", "transformer.ln_f."),
)
# GPT-2's q, k and v as one Conv1D c_attn, [in, 3 * hidden] (gpt2, openai-gpt).
GPT2_FUSED_QKV = FusedWeight(
    r"\.self_attn\.(?P<part>q|k|v)_proj\.(weight|bias)$",
    r".self_attn.c_attn.\2",
    ("q", "k", "v"),
    axis=-1,
)
# GPT-2's attention and MLP names (gpt2, openai-gpt).
GPT2_BLOCK_NAMES = (
    (r"\.self_attn\.o_proj\.", ".attn.c_proj."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.fc1\.", ".mlp.c_fc."),
    (r"\.mlp\.fc2\.", ".mlp.c_proj."),
)
# GPT-2's attention buffers, the causal mask and its fill value (gpt2, gptj: transformers'
# _keys_to_ignore_on_load_unexpected).
GPT2_BUFFERS = (r"\.attn\.(bias|masked_bias)$",)
# GPT-2's config.json names (gpt2, gptj).
GPT2_CONFIG_NAMES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "n_inner": "intermediate_size",
    "activation_function": "hidden_act",
}
# GPT2Config's defaults of the keys GPT-2's layer reads (gpt2, gpt_bigcode; each its activation).
GPT2_DEFAULTS = {
    "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
    "tie_word_embeddings": True,
    "layer_norm_epsilon": 1e-5,
}
# GPT-2's layer: LayerNorms, biases everywhere, an FC MLP, learned positions (gpt2, gpt_bigcode).
GPT2_BLOCK = {
    "norm_type": "layer",
    "gated_mlp": False,
    "qkv_bias": True,
    "o_bias": True,
    "mlp_bias": True,
    "position_embedding": "learned",
    "attention_scale": gpt2_scale,
    "head_dim": split_hidden,  # GPT2Attention never reads config.json's head_dim
}
# GPTJConfig's defaults of the keys GPT-J's layer reads (gptj, codegen).
GPTJ_DEFAULTS = {
    "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
    "hidden_act": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "partial_rotary_factor": gptj_partial_rotary,
}
# GPT-J's layer: one shared LayerNorm feeding attention beside an FC MLP, unbiased attention,
# a biased lm_head, rotary on the first channels of each head by adjacent pairs (gptj, codegen).
GPTJ_BLOCK = {
    "head_dim": split_hidden,
    "num_key_value_heads": kv_head_per_head,
    "norm_type": "layer",
    "parallel_residual": True,  # one shared norm (ln_1) feeds attention and MLP
    "gated_mlp": False,
    "qkv_bias": False,
    "o_bias": False,
    "mlp_bias": True,
    "lm_head_bias": True,
    "rope_interleaved": True,  # rotate_every_two
    "rope": gptj_rope,
}
# GPT-J's tensor names (gptj, codegen).
GPTJ_LAYOUT = (
    (r"\.self_attn\.o_proj\.", ".attn.out_proj."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.fc1\.", ".mlp.fc_in."),
    (r"\.mlp\.fc2\.", ".mlp.fc_out."),
    *GPT2_LAYOUT,
)
