"""GPT-2's names, shared by the families whose checkpoints keep them (gpt2, gptj, exaone)."""

# GPT-2's tensor layout (gpt2, gptj, exaone): the renames besides attention and MLP names.
GPT2_LAYOUT = (
    (r"\.input_layernorm\.", ".ln_1."),
    (r"^model\.layers\.", "transformer.h."),
    (r"^model\.embed_tokens\.", "transformer.wte."),
    (r"^model\.norm\.", "transformer.ln_f."),
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
