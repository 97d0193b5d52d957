"""A SigLIP vision tower and Gemma 3's multimodal projector, as standard ONNX.

    patches  = Conv(pixels, patch_size, stride patch_size) + learned position embeddings
    layer    h = x + attn(LayerNorm(x));  out = h + fc2(act(fc1(LayerNorm(h))))
             attention is bidirectional over one image's patches (no mask, no cache)
    tower    post_layernorm(layers(patches))                       [images, patches, hidden]
    project  AveragePool to tokens_per_side² tokens → RMSNorm → @ mm_input_projection_weight

Module names follow transformers' (`vision_tower.embeddings.patch_embedding`, ...), so the
checkpoint name map stays a prefix.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.embedding import Embedding
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import FCMLP
from mobius_genai.components.norms import LayerNorm, RMSNorm
from mobius_genai.config.vision import VisionConfig, VisionLanguageConfig


class PatchEmbeddings(nn.Module):
    """Non-overlapping patches projected by a Conv, plus one learned embedding per patch."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.hidden_size = config.hidden_size
        size, channels = config.patch_size, config.num_channels
        self.patch_embedding = _Conv(config.hidden_size, channels, size)
        self.position_embedding = Embedding(config.patches_per_side**2, config.hidden_size)

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        patches = self.patch_embedding(op, pixel_values, self.patch_size)
        flat = op.Reshape(patches, op.Constant(value_ints=[0, self.hidden_size, -1]))
        return op.Add(op.Transpose(flat, perm=[0, 2, 1]), self.position_embedding(op))


class _Conv(nn.Module):
    """Conv2d with weight [out, in, k, k] and bias, stride k (weights as stored)."""

    def __init__(self, out_channels: int, in_channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = parameter([out_channels, in_channels, kernel, kernel])
        self.bias = parameter([out_channels])

    def forward(self, op, x: ir.Value, stride: int) -> ir.Value:
        return op.Conv(x, self.weight, self.bias, strides=[stride, stride])


class VisionAttention(nn.Module):
    """Multi-head self-attention over all patches of an image (ONNX Attention, no mask)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = Linear(hidden, hidden, bias=True)
        self.k_proj = Linear(hidden, hidden, bias=True)
        self.v_proj = Linear(hidden, hidden, bias=True)
        self.out_proj = Linear(hidden, hidden, bias=True)

    def forward(self, op, x: ir.Value) -> ir.Value:
        output = op.Attention(
            self.q_proj(op, x),
            self.k_proj(op, x),
            self.v_proj(op, x),
            q_num_heads=self.num_heads,
            kv_num_heads=self.num_heads,
        )
        return self.out_proj(op, output)


class VisionEncoderLayer(nn.Module):
    """Pre-norm residual attention and MLP blocks (SigLIP's layer_norm1 / layer_norm2)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = LayerNorm(hidden, eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = LayerNorm(hidden, eps)
        self.mlp = FCMLP(hidden, config.intermediate_size, config.hidden_act)

    def forward(self, op, x: ir.Value) -> ir.Value:
        x = op.Add(x, self.self_attn(op, self.layer_norm1(op, x)))
        return op.Add(x, self.mlp(op, self.layer_norm2(op, x)))


class _Encoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [VisionEncoderLayer(config) for _ in range(config.num_hidden_layers)]
        )

    def forward(self, op, x: ir.Value) -> ir.Value:
        for layer in self.layers:
            x = layer(op, x)
        return x


class SiglipVisionTower(nn.Module):
    """pixel_values [images, channels, size, size] → last hidden state [images, patches, hidden]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.embeddings = PatchEmbeddings(config)
        self.encoder = _Encoder(config)
        self.post_layernorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        return self.post_layernorm(op, self.encoder(op, self.embeddings(op, pixel_values)))


class Gemma3Projector(nn.Module):
    """Patches average-pooled to `image_tokens` per image, RMS-normed (1 + weight, applied
    when the weight is read) and projected to the text hidden size."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        vision = config.vision
        self.hidden = vision.hidden_size
        self.patches = vision.patches_per_side
        self.kernel = config.pool_kernel
        self.mm_input_projection_weight = parameter([vision.hidden_size, config.text.hidden_size])
        self.mm_soft_emb_norm = RMSNorm(vision.hidden_size, vision.layer_norm_eps)

    def forward(self, op, hidden: ir.Value) -> ir.Value:
        grid = op.Reshape(
            op.Transpose(hidden, perm=[0, 2, 1]),
            op.Constant(value_ints=[0, self.hidden, self.patches, self.patches]),
        )
        kernel = [self.kernel, self.kernel]
        pooled = op.AveragePool(grid, kernel_shape=kernel, strides=kernel)
        tokens = op.Transpose(
            op.Reshape(pooled, op.Constant(value_ints=[0, self.hidden, -1])), perm=[0, 2, 1]
        )
        return op.MatMul(self.mm_soft_emb_norm(op, tokens), self.mm_input_projection_weight)
