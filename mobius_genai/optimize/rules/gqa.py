"""GQAFusion: RotaryEmbedding + Attention + the causal mask → com.microsoft::GroupQueryAttention.

The portable decoder computes, per layer (components/attention.py, components/masks.py)::

    q_rot = RotaryEmbedding(q, cos, sin, position_ids)        # and k_rot alike
    out, present_k, present_v = Attention(q_rot, k_rot, v, bias, past_k, past_v)
    bias[b, 0, i, j] = 0 if j <= past + i and q[b, i] - k[b, j] < window and attention_mask[b, j]
                       else lowest
    (q, k: the query's and the key's positions, position_ids and the mask's ones up to j; for
    rows without padding holes past + i and j; past_k, past_v: the past with the new keys of
    og.Engine's shorter rows placed, components/kv_slots.py. GQA reads the past before that:
    its shared buffer places each row's keys itself)

GroupQueryAttention computes the same thing from two lengths instead of the bias:
``seqlens_k = int32(ReduceSum(attention_mask, 1) - 1)`` and
``total_sequence_length = int32(Shape(attention_mask)[1])`` (derived once per graph and shared
by every layer). It attends causally to keys ``0..seqlens_k[b]``, restricted to the last
``local_window_size`` of them (onnxruntime 1.32, measured on the CPU kernel and matching its
CUDA flash path's ``window_size_left = local_window_size - 1``), so transformers' convention,
query i sees key j when ``i - j < window``, is ``local_window_size = window``. With
``do_rotary=1`` it rotates q and k itself at positions ``past + i`` (``seqlens_k`` in decode)
with the same cos/sin tables.

Math preserved: identical outputs and present key/values when every row of ``attention_mask``
is all ones and ``position_ids`` are ``past + arange(seq)``, which is what onnxruntime-genai
feeds one sequence or a batch of equal length (tests/optimize/test_ep_numerics.py checks it
against transformers). Padded batches follow GQA's own ``seqlens_k`` convention, as in
onnxruntime-genai's builder, not the padding mask. Scale and logit softcap are copied into GQA's
``scale`` / ``softcap``; q/k normalization before the rotation is kept as it is (it lies
outside the matched subgraph); partial rotary maps to cos/sin tables of width
``rotary_dim / 2``, which GQA reads as its rotary width.

The rule declines, with the reason recorded in its MatchResult, when the bias is not the mask
masks.py builds from the ``attention_mask`` graph input, when the mask's window disagrees with
the Attention node's ``mobius.sliding_window`` metadata, when the positions are not the
``position_ids`` graph input, and on any attribute GQA cannot express. A layer whose q and k
are not rotated (or whose rotation cannot move into GQA) fuses with ``do_rotary=0`` through the
second rule, ``GQAFusionNoRope``; the explicit rotation then stays in front of GQA.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchContext, pattern

from mobius_genai.components.alibi import ALIBI_KEY
from mobius_genai.components.attention import SLIDING_WINDOW_KEY
from mobius_genai.components.dynamic_mask import KEY_BIAS_KEY
from mobius_genai.components.image_masks import BIDIRECTIONAL_BLOCKS_KEY
from mobius_genai.components.kv_slots import unplaced
from mobius_genai.components.masks import CHUNKED_KEY
from mobius_genai.components.sparse_indexer import TOP_K_KEY
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.declines import RecordingRuleClassBase

GQA_OP = "GroupQueryAttention"
# GroupQueryAttention input positions.
QUERY, KEY, VALUE, PAST_KEY, PAST_VALUE, SEQLENS_K, TOTAL_SEQ_LEN, COS_CACHE, SIN_CACHE = range(9)
ATTENTION_BIAS = 10
HEAD_SINK = 11

# Metadata marking the nodes that derive GQA's length inputs, so every layer reuses them.
DERIVED_INPUT_KEY = "mobius.gqa_input"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class _CausalMask(pattern.PatternBase):
    """The additive mask of components/masks.py, with or without a sliding window."""

    def __init__(self, windowed: bool) -> None:
        super().__init__("CausalMask" + ("Windowed" if windowed else ""))
        self.windowed = windowed

    def pattern(self, op, input_ids, attention_mask, lowest, window, latest, keys):
        seq = op.Shape(input_ids, start=1, end=2)
        total = op.Shape(attention_mask, start=1, end=2)
        start = op.Squeeze(op.Sub(total, seq), [0])
        end = op.Squeeze(total, [0])
        query_pos = op.Unsqueeze(op.Range(start, end, 1), [1])
        key_pos = op.Unsqueeze(op.Range(0, end, 1), [0])
        not_padding = op.Cast(op.Unsqueeze(attention_mask, [1, 2]), to=ir.DataType.BOOL)
        allowed = op.And(op.Unsqueeze(op.LessOrEqual(key_pos, query_pos), [0]), not_padding)
        if self.windowed:  # in slots or positions (masks.py): GQA counts in its own
            allowed = op.And(allowed, op.Greater(keys, op.Sub(latest, window)))
        return op.Where(allowed, 0.0, lowest)

    def check(self, context, attention_mask, lowest, window=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if not (attention_mask.is_graph_input() and attention_mask.name == ATTENTION_MASK):
            return result.fail("mask is not built from the 'attention_mask' graph input")
        lowest_value = _scalar(lowest)
        dtype = lowest.dtype
        if lowest_value is None or dtype not in _FLOAT_TYPES:
            return result.fail("masked positions do not get a constant float value", lowest)
        if lowest_value != float(ml_dtypes.finfo(dtype.numpy()).min):
            return result.fail(
                f"masked positions get {lowest_value}, not the dtype's lowest value", lowest
            )
        if self.windowed and _scalar(window) is None:
            return result.fail("sliding window of the mask is not a constant", window)
        return result


def bidirectional_blocks(mask: ir.Value | None) -> str | None:
    """Why `mask` lets some keys after a query through (image_masks.py), or None."""
    producer = None if mask is None else mask.producer()
    return None if producer is None else producer.metadata_props.get(BIDIRECTIONAL_BLOCKS_KEY)


def chunks(mask: ir.Value | None) -> str | None:
    """Which keys `mask` keeps a chunked layer's queries to (masks.py), or None."""
    producer = None if mask is None else mask.producer()
    return None if producer is None else producer.metadata_props.get(CHUNKED_KEY)


def linear_biases(mask: ir.Value | None) -> str | None:
    """What `mask` adds besides the causal mask in an ALiBi layer (alibi.py), or None."""
    producer = None if mask is None else mask.producer()
    return None if producer is None else producer.metadata_props.get(ALIBI_KEY)


def _tag(mask: ir.Value | None, key: str) -> str | None:
    """The metadata `key` on the node yielding `mask`, or None."""
    producer = None if mask is None else mask.producer()
    return None if producer is None else producer.metadata_props.get(key)


def key_biases(mask: ir.Value | None) -> str | None:
    """What `mask` adds to each key in a dynamic mask layer (dynamic_mask.py), or None."""
    return _tag(mask, KEY_BIAS_KEY)


def top_k_keys(mask: ir.Value | None) -> str | None:
    """Which keys a sparse attention layer's indexer keeps (sparse_indexer.py), or None."""
    return _tag(mask, TOP_K_KEY)


def mask_stays(mask: ir.Value | None) -> str | None:
    """Why an Attention with `mask` is meant to stay (a mask GroupQueryAttention cannot take:
    bidirectional blocks, chunks, ALiBi's, Doge's or an indexer's biases), or None."""
    for reason in (bidirectional_blocks, chunks, linear_biases, key_biases, top_k_keys):
        found = reason(mask)
        if found is not None:
            return found
    return None


def _scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant, or None."""
    if value is None or value.const_value is None:
        return None
    array = value.const_value.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 else None


def _match_mask(context: MatchContext, mask: ir.Value) -> tuple[ir.Value, int | None] | None:
    """(attention_mask, window or None) when `mask` is the masks.py bias, else None."""
    producer = mask.producer()
    if producer is None:
        return None
    # Fresh patterns each time: a pattern's matcher keeps the last graph it matched, and a
    # module-level one would keep the whole model (and the checkpoint it maps) alive.
    for mask_pattern in (_CausalMask(windowed=False), _CausalMask(windowed=True)):
        match = mask_pattern.match(
            context.model, context.graph_or_function, producer, check_nodes_are_removable=False
        )
        if match:
            window = match.bindings.get("window") if mask_pattern.windowed else None
            return match.bindings["attention_mask"], (
                int(_scalar(window)) if window is not None else None
            )
    return None


def metadata_window(node: ir.Node) -> int | None:
    """The sliding window an Attention node's metadata names, or None."""
    raw = node.metadata_props.get(SLIDING_WINDOW_KEY)
    return int(raw) if raw is not None else None


def _derived(graph: ir.Graph, tag: str) -> ir.Value | None:
    for node in graph:
        if node.metadata_props.get(DERIVED_INPUT_KEY) == tag:
            return node.outputs[0]
    return None


def sequence_lengths(op, graph: ir.Graph, attention_mask: ir.Value) -> tuple[ir.Value, ir.Value]:
    """GQA's (seqlens_k, total_sequence_length), reusing those an earlier rewrite derived."""
    seqlens_k = _derived(graph, "seqlens_k")
    total = _derived(graph, "total_sequence_length")
    if seqlens_k is None:
        lengths = op.ReduceSum(attention_mask, op.Constant(value_ints=[1]), keepdims=0)
        lengths = op.Sub(lengths, op.Constant(value=ir.tensor(np.array(1, dtype=np.int64))))
        seqlens_k = op.Cast(lengths, to=ir.DataType.INT32, _outputs=["seqlens_k"])
        seqlens_k.producer().metadata_props[DERIVED_INPUT_KEY] = "seqlens_k"
    if total is None:
        length = op.Shape(attention_mask, start=1, end=2)
        length = op.Squeeze(length, op.Constant(value_ints=[0]))
        total = op.Cast(length, to=ir.DataType.INT32, _outputs=["total_sequence_length"])
        total.producer().metadata_props[DERIVED_INPUT_KEY] = "total_sequence_length"
    return seqlens_k, total


def _static_dim(value: ir.Value | None, axis: int) -> int | None:
    if value is None or value.shape is None or len(value.shape) <= axis:
        return None
    dim = value.shape[axis]
    return dim if isinstance(dim, int) else None


def rotated_attention(
    op, query, key, value, mask, past_key, past_value, cos, sin, position_ids, *, scores=False
):
    """The pattern GQA fuses: Attention over rotary-rotated q and k with past key/value and a
    mask; with `scores`, also the Attention's qk output (sinks read it)."""
    q_rot = op.RotaryEmbedding(
        query, cos, sin, position_ids, _allow_other_attributes=True, _outputs=["q_rot"]
    )
    k_rot = op.RotaryEmbedding(
        key, cos, sin, position_ids, _allow_other_attributes=True, _outputs=["k_rot"]
    )
    return unrotated_attention(op, q_rot, k_rot, value, mask, past_key, past_value, scores=scores)


def unrotated_attention(op, query, key, value, mask, past_key, past_value, *, scores=False):
    """The do_rotary=0 pattern: Attention over q and k as given, with past key/value and a
    mask; with `scores`, also its qk output."""
    outputs = ["attention", "present_key", "present_value"] + (["scores"] if scores else [])
    return op.Attention(
        query,
        key,
        value,
        mask,
        past_key,
        past_value,
        _allow_other_attributes=True,
        _outputs=outputs,
    )


class GQAFusion(RecordingRuleClassBase):
    """Attention over rotated q/k with the masks.py bias → GroupQueryAttention(do_rotary=1)."""

    do_rotary = True
    scores_mode = 0  # the qk_matmul_output_mode whose scores the matched subgraph reads

    def __init__(self, name: str = "GQAFusion") -> None:
        # The portable graph's key placement (components/kv_slots.py) also reads the rotated
        # key: the matched nodes stay until the rule set removes what nothing reads any more.
        super().__init__(name, remove_nodes=False)
        self._attributes: dict[str, Any] = {}
        self._attention_mask: ir.Value | None = None

    def pattern(self, op, query, key, value, mask, past_key, past_value, cos, sin, position_ids):
        return rotated_attention(
            op, query, key, value, mask, past_key, past_value, cos, sin, position_ids
        )

    def check(self, context, query, mask, past_key, attention, **bindings) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = attention.producer()
        if not (attention.uses() or attention.is_graph_output()):
            return result.fail("Attention already rewritten (nothing reads its output)", node)
        attributes = _attention_attributes(node, query, result, self.scores_mode)
        if attributes is None:
            return result
        head_dim = _head_dim(query, past_key, attributes["num_heads"])
        if head_dim is not None and head_dim % 8:
            return result.fail(f"head_dim {head_dim} is not a multiple of 8, which GQA requires")
        if self.do_rotary:
            rotary = _rotary_attributes(attributes, head_dim, result, **bindings)
            if rotary is None:
                return result
            attributes.update(rotary)
        attention_mask = self.mask_input(context, mask, node, attributes, result)
        if attention_mask is None:
            return result
        self._attributes = attributes
        self._attention_mask = attention_mask
        return result

    def mask_input(
        self,
        context: MatchContext,
        mask: ir.Value,
        node: ir.Node,
        attributes: dict[str, Any],
        result: pattern.MatchResult,
    ) -> ir.Value | None:
        """The 'attention_mask' graph input the causal mask `mask` is built from (its window
        set in `attributes`), or None with `result` failed."""
        blocks = bidirectional_blocks(mask)
        if blocks is not None:
            result.fail(f"{blocks}; causal GroupQueryAttention cannot see later keys", mask)
            return None
        chunked = chunks(mask)
        if chunked is not None:
            result.fail(f"{chunked}; GroupQueryAttention's window is not a chunk", mask)
            return None
        linear = linear_biases(mask)
        if linear is not None:
            result.fail(f"{linear}; causal GroupQueryAttention adds no bias", mask)
            return None
        sparse = top_k_keys(mask)
        if sparse is not None:
            result.fail(f"{sparse}, read from the concatenated past; GQA shares a buffer", mask)
            return None
        matched = _match_mask(context, mask)
        if matched is None:
            result.fail(
                "attention bias is not the causal/padding mask masks.py builds from "
                "'attention_mask'",
                mask,
            )
            return None
        attention_mask, mask_window = matched
        window = metadata_window(node)
        if window != mask_window:
            result.fail(
                f"mask window {mask_window} disagrees with {SLIDING_WINDOW_KEY}={window}", node
            )
            return None
        if window is not None:
            attributes["local_window_size"] = window  # keys attended, the query's own included
        return attention_mask

    def attention_bias(self, op, query: ir.Value, bindings: dict[str, Any]) -> ir.Value | None:
        """GQA's attention_bias input: none, the mask is GQA's own causal one."""
        return None

    def head_sink(self) -> ir.Value | None:
        """GQA's head_sink input: none (gqa_sinks.py's rules give the layer's sinks)."""
        return None

    def rewrite(self, op, query, key, value, past_key, past_value, attention, **bindings):
        graph = attention.producer().graph
        seqlens_k, total = sequence_lengths(op, graph, self._attention_mask)
        # GQA's shared buffer places each row's tokens itself: it reads the past unplaced
        inputs = [query, key, value, unplaced(past_key), unplaced(past_value), seqlens_k, total]
        if self.do_rotary:
            inputs += [bindings["cos"], bindings["sin"]]
        optional = {ATTENTION_BIAS: self.attention_bias(op, query, bindings)}
        optional[HEAD_SINK] = self.head_sink()
        for index, given in optional.items():
            if given is not None:
                inputs += [None] * (index - len(inputs)) + [given]
        return op.GroupQueryAttention(*inputs, _domain=MS_DOMAIN, _outputs=3, **self._attributes)


class GQAFusionNoRope(GQAFusion):
    """Attention over unrotated (or explicitly rotated) q/k → GroupQueryAttention(do_rotary=0)."""

    do_rotary = False

    def __init__(self) -> None:
        super().__init__("GQAFusionNoRope")

    def pattern(self, op, query, key, value, mask, past_key, past_value):
        return unrotated_attention(op, query, key, value, mask, past_key, past_value)


def _attention_attributes(
    node: ir.Node, query: ir.Value, result: pattern.MatchResult, scores_mode: int = 0
) -> dict[str, Any] | None:
    """GQA attributes equivalent to the Attention node's, or None (with `result` failed)."""
    attrs = node.attributes
    num_heads = attrs.get_int("q_num_heads", 0)
    kv_num_heads = attrs.get_int("kv_num_heads", 0)
    if num_heads <= 0 or kv_num_heads <= 0 or (query.shape is not None and len(query.shape) != 3):
        result.fail("Attention does not take 3-D q/k/v with q_num_heads/kv_num_heads", node)
        return None
    if num_heads % kv_num_heads:
        result.fail(f"q_num_heads {num_heads} is not a multiple of kv_num_heads", node)
        return None
    if attrs.get_int("is_causal", 0) != 0:
        result.fail("Attention applies its own is_causal on top of the mask", node)
        return None
    if attrs.get_int("qk_matmul_output_mode", 0) != scores_mode:
        result.fail(
            "Attention outputs its qk matmul to a subgraph this rule does not fuse (attention "
            "sinks fuse through GQASinkFusion)",
            node,
        )
        return None
    if query.dtype not in _FLOAT_TYPES:
        result.fail(f"query dtype {query.dtype} is not a float type GQA supports", query)
        return None
    attributes: dict[str, Any] = {"num_heads": num_heads, "kv_num_heads": kv_num_heads}
    if "scale" in attrs:
        attributes["scale"] = attrs.get_float("scale")
    softcap = attrs.get_float("softcap", 0.0)
    if softcap < 0:
        result.fail(f"negative softcap {softcap}", node)
        return None
    if softcap > 0:
        attributes["softcap"] = softcap
    return attributes


def _head_dim(query: ir.Value, past_key: ir.Value | None, num_heads: int) -> int | None:
    head_dim = _static_dim(past_key, 3)
    if head_dim is None:
        hidden = _static_dim(query, 2)
        head_dim = hidden // num_heads if hidden is not None else None
    return head_dim


def _rotary_attributes(
    attributes: dict[str, Any],
    head_dim: int | None,
    result: pattern.MatchResult,
    *,
    q_rot: ir.Value,
    k_rot: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    position_ids: ir.Value,
    **_: Any,
) -> dict[str, Any] | None:
    """GQA's rotary attributes for the two RotaryEmbedding nodes, or None."""
    q_node, k_node = q_rot.producer(), k_rot.producer()
    if not (position_ids.is_graph_input() and position_ids.name == POSITION_IDS):
        result.fail("rotary positions are not the 'position_ids' graph input", position_ids)
        return None
    q_attrs, k_attrs = q_node.attributes, k_node.attributes
    if q_attrs.get_int("num_heads", 0) not in (0, attributes["num_heads"]) or k_attrs.get_int(
        "num_heads", 0
    ) not in (0, attributes["kv_num_heads"]):
        result.fail("RotaryEmbedding num_heads disagree with the Attention node", q_node)
        return None
    interleaved = q_attrs.get_int("interleaved", 0)
    if k_attrs.get_int("interleaved", 0) != interleaved:
        result.fail("q and k rotations differ in 'interleaved'", k_node)
        return None
    rotary_dim = q_attrs.get_int("rotary_embedding_dim", 0)
    if k_attrs.get_int("rotary_embedding_dim", 0) != rotary_dim:
        result.fail("q and k rotations differ in rotary_embedding_dim", k_node)
        return None
    if rotary_dim == 0:
        rotary_dim = head_dim
    if rotary_dim is None:
        result.fail("rotary width unknown (no rotary_embedding_dim, head_dim not static)", q_node)
        return None
    table_width = _static_dim(cos, 1)
    if table_width is None or len(cos.shape) != 2 or sin.shape != cos.shape:
        result.fail("cos/sin tables are not 2-D of one known width", cos)
        return None
    if 2 * table_width != rotary_dim:
        result.fail(
            f"cos/sin tables are {table_width} wide but {rotary_dim} channels rotate; GQA "
            "takes its rotary width from the tables",
            cos,
        )
        return None
    if table_width % 8:
        result.fail(f"cos/sin tables are {table_width} wide; GQA needs a multiple of 8", cos)
        return None
    if head_dim is not None and rotary_dim > head_dim:
        result.fail(f"rotary width {rotary_dim} exceeds head_dim {head_dim}", q_node)
        return None
    return {"do_rotary": 1, "rotary_interleaved": interleaved}


def rules() -> pattern.RewriteRuleSet:
    """GQAFusion, then its do_rotary=0 form for layers the first rule leaves."""
    return pattern.RewriteRuleSet([GQAFusion.rule(), GQAFusionNoRope.rule()])
