"""Reading a checkpoint: where its files are (`source`), its tensors read lazily and checked
(`weights`, `checks`, safetensors headers), and the layouts some checkpoints store (MoE experts,
grouped projections, GPTQ/AWQ and MXFP4 integers, GGUF files)."""
