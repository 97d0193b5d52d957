"""SeparateRoPE: GQA with fused rotary → RotaryEmbedding on q and k + GQA(do_rotary=0).

Math preserved: GQA(do_rotary=1) rotates the first ``2 * cos_cache.shape[1]`` channels of every
q and k head with the cos/sin rows of each token's position, then attends. The rewrite applies
the same rotation (same tables, same ``interleaved``) with onnxruntime's
``com.microsoft::RotaryEmbedding`` and hands the rotated q and k to a GQA that no longer rotates.
The contrib op, not ONNX's opset-23 RotaryEmbedding: an EP that runs GroupQueryAttention runs
onnxruntime's contrib ops, and DirectML, the EP this lowering is for, has a kernel for the
contrib RotaryEmbedding and none for the opset-23 one (that node would fall back to the CPU).

Positions: the rotation reads the ``position_ids`` graph input rather than re-deriving
positions from ``attention_mask``. onnxruntime-genai feeds ``position_ids`` on every call of a
model that declares it (prefill and each cached decode step, padded or not), and these are the
positions the portable graph and transformers use, so they are right in every case. A
derivation from the mask (``cumsum(mask) - 1`` of the last ``seq`` columns) matches them only
with padding on the left, and GQA's own internal positions (``past + i``) only without padding.
The fused GQA left ``position_ids`` unused, but the pipeline removes dead inputs only after
lowering, so the input is still there; this rule makes it live again. When it is missing the
rule declines.

For EPs whose GQA cannot rotate (``supports_fused_rope=False``, e.g. DirectML). A packed GQA
must be unpacked first: the rule declines it, naming UnpackQKV.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules.gqa import (
    COS_CACHE,
    GQA_OP,
    KEY,
    MS_DOMAIN,
    PAST_KEY,
    POSITION_IDS,
    SIN_CACHE,
    VALUE,
)

# Attributes that only concern GQA's own rotation.
_ROTARY_ATTRIBUTES = ("do_rotary", "rotary_interleaved")


def _graph_input(graph: ir.Graph, name: str) -> ir.Value | None:
    return next((value for value in graph.inputs if value.name == name), None)


class SeparateRoPE(RecordingRuleClassBase):
    """GQA(q, k, v, ..., cos, sin, do_rotary=1) → GQA(RoPE(q), RoPE(k), v, ..., do_rotary=0)."""

    def __init__(self) -> None:
        super().__init__("SeparateRoPE")
        self._position_ids: ir.Value | None = None

    def pattern(self, op, query):
        return op.GroupQueryAttention(
            query,
            do_rotary=1,
            _domain=MS_DOMAIN,
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=["attention", "present_key", "present_value"],
        )

    def check(self, context, attention, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = attention.producer()
        inputs = node.inputs
        if len(inputs) <= VALUE or inputs[KEY] is None or inputs[VALUE] is None:
            return result.fail("GQA takes packed QKV; UnpackQKV has to run first", node)
        if len(inputs) > SIN_CACHE + 1 and any(v is not None for v in inputs[SIN_CACHE + 1 :]):
            return result.fail("GQA has inputs after sin_cache (positions, bias, ...)", node)
        if len(inputs) <= SIN_CACHE or inputs[COS_CACHE] is None or inputs[SIN_CACHE] is None:
            return result.fail("GQA rotates but has no cos/sin cache", node)
        cos = inputs[COS_CACHE]
        if cos.shape is None or len(cos.shape) != 2 or not isinstance(cos.shape[1], int):
            return result.fail("cos cache is not 2-D with a known width", cos)
        if node.attributes.get_int("num_heads", 0) <= 0:
            return result.fail("GQA has no num_heads", node)
        if node.attributes.get_int("kv_num_heads", 0) <= 0:
            return result.fail("GQA has no kv_num_heads", node)
        position_ids = _graph_input(context.graph_or_function, POSITION_IDS)
        if position_ids is None:
            return result.fail("no 'position_ids' graph input to rotate with", node)
        if position_ids.dtype != ir.DataType.INT64:
            return result.fail("'position_ids' is not int64", position_ids)
        self._position_ids = position_ids
        return result

    def rewrite(self, op, query, attention, **_):
        node = attention.producer()
        key, value = node.inputs[KEY], node.inputs[VALUE]
        cos, sin = node.inputs[COS_CACHE], node.inputs[SIN_CACHE]
        interleaved = node.attributes.get_int("rotary_interleaved", 0)
        rotary = {"rotary_embedding_dim": 2 * int(cos.shape[1]), "interleaved": interleaved}
        q_rot = op.RotaryEmbedding(
            query,
            self._position_ids,
            cos,
            sin,
            num_heads=node.attributes.get_int("num_heads"),
            _domain=MS_DOMAIN,
            **rotary,
        )
        k_rot = op.RotaryEmbedding(
            key,
            self._position_ids,
            cos,
            sin,
            num_heads=node.attributes.get_int("kv_num_heads"),
            _domain=MS_DOMAIN,
            **rotary,
        )
        attributes = {
            name: attr for name, attr in node.attributes.items() if name not in _ROTARY_ATTRIBUTES
        }
        attributes["do_rotary"] = 0
        return op.op(
            GQA_OP,
            q_rot,
            k_rot,
            value,
            *node.inputs[PAST_KEY:COS_CACHE],
            _domain=MS_DOMAIN,
            _outputs=3,
            **attributes,
        )


def rules() -> pattern.RewriteRuleSet:
    """The SeparateRoPE rule."""
    return pattern.RewriteRuleSet([SeparateRoPE.rule()])
