"""Checkpoints whose linear weights are quantized already (GPTQ, AWQ, GGUF).

Their integers and scales are taken as stored: `PrequantizedTensor` carries them to the
`quantize.stored_weights` pass, which writes MatMulNBits with the same integers (no second
rounding); read as a float tensor it is the weight the format's own formula gives.
"""

from mobius_genai.checkpoint.prequantized.gptq import QuantizationScheme, prequantized_tensors
from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor, StoredBlocks

__all__ = ["PrequantizedTensor", "QuantizationScheme", "StoredBlocks", "prequantized_tensors"]
