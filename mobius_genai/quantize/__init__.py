"""Weight quantization: INT4 (com.microsoft MatMulNBits, or DequantizeLinear for standard ONNX).

Names are imported on first use (`mobius_genai._lazy`), so the search's worker processes
(`search_pool.py`) load numpy and the rounding code without the graph-building stack.
"""

from mobius_genai._lazy import export_lazily

#: Public name → the module that defines it.
_EXPORTS = {
    **{name: "mobius_genai.quantize.plan" for name in ("BLOCK_SIZES", "Int4Options")},
    **{
        name: "mobius_genai.quantize.int4"
        for name in (
            "DEFAULT_QUALITY",
            "QUALITIES",
            "Int4Report",
            "QuantizedWeight",
            "quantize_int4",
        )
    },
}

__all__ = sorted(_EXPORTS)

export_lazily(__name__, _EXPORTS)
