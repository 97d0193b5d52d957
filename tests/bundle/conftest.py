"""A graph description for the bundle tests that need no ONNX file (the shared bundles and the
tiny checkpoint: tests/conftest.py)."""

from __future__ import annotations

from mobius_genai.bundle.graph import GQA_OP, GraphInfo, TensorSpec

_FLOAT = 1
_INT64 = 7


def toy_graph(
    *,
    layers: int = 2,
    kv_heads: int = 2,
    head_size: int = 16,
    vocab: int = 384,
    position_ids: bool = True,
    gqa: bool = False,
) -> GraphInfo:
    """A GraphInfo with the standard decoder I/O contract, without any ONNX file."""
    inputs = {
        "input_ids": TensorSpec(_INT64, ("batch", "seq")),
        "attention_mask": TensorSpec(_INT64, ("batch", "total")),
    }
    if position_ids:
        inputs["position_ids"] = TensorSpec(_INT64, ("batch", "seq"))
    outputs = {"logits": TensorSpec(_FLOAT, ("batch", "seq", vocab))}
    for i in range(layers):
        for role in ("key", "value"):
            inputs[f"past_key_values.{i}.{role}"] = TensorSpec(
                _FLOAT, ("batch", kv_heads, "past", head_size)
            )
            outputs[f"present.{i}.{role}"] = TensorSpec(
                _FLOAT, ("batch", kv_heads, "total", head_size)
            )
    ops = {"ai.onnx::MatMul", GQA_OP if gqa else "ai.onnx::Attention"}
    return GraphInfo(inputs=inputs, outputs=outputs, ops=frozenset(ops))
