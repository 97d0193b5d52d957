"""Weight quantization: INT4 (com.microsoft MatMulNBits, or DequantizeLinear for standard ONNX)."""

from mobius_genai.quantize.int4 import (
    BLOCK_SIZES,
    DEFAULT_QUALITY,
    QUALITIES,
    Int4Options,
    Int4Report,
    QuantizedWeight,
    quantize_int4,
)

__all__ = [
    "BLOCK_SIZES",
    "DEFAULT_QUALITY",
    "QUALITIES",
    "Int4Options",
    "Int4Report",
    "QuantizedWeight",
    "quantize_int4",
]
