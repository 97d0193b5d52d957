"""Graph-building blocks (onnxscript.nn modules) that emit standard ONNX and know no EP."""

from mobius_genai.components.attention import Attention
from mobius_genai.components.decoder import DecoderLayer
from mobius_genai.components.embedding import Embedding
from mobius_genai.components.linear import Linear
from mobius_genai.components.mlp import FCMLP, GatedMLP
from mobius_genai.components.norms import HeadwiseNorm, LayerNorm, RMSNorm
from mobius_genai.components.rope import RotaryEmbedding

__all__ = [
    "FCMLP",
    "Attention",
    "DecoderLayer",
    "Embedding",
    "GatedMLP",
    "HeadwiseNorm",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "RotaryEmbedding",
]
