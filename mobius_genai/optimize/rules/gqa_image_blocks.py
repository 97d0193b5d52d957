"""GQAImageBlockFusion: Attention with Gemma 3's image-block bias, a chunked layer's bias
(Llama 4, components/masks.py: a key visible only from its own chunk's queries) or an ALiBi
bias (Bloom, MPT, components/alibi.py: [batch, heads, seq, total], the causal mask plus each
head's linear biases) → GroupQueryAttention with ``causal=0`` and that bias as its
``attention_bias``; an ALiBi bias laid out by key position (alibi.position_bias), as GQA's
buffer holds each row's keys.

components/image_masks.py builds, per sliding window of the decoder, the additive bias::

    bias[b, 0, i, j] = 0 if (j <= past + i or i, j in one image run) and (no window or
                       i - j < window) and attention_mask[b, j], else lowest

onnxruntime 1.32's GroupQueryAttention takes ``attention_bias`` [batch, 1 or heads, seq, total]
(input 10, indexed by absolute key position) and, with ``causal=0``, applies no causal mask of its own:
it attends to keys ``0..seqlens_k[b]`` with the bias added to the scaled scores (measured on the
CPU kernel against a float64 reference, prefill and decode with a past, with and without a
window; tests/optimize/test_gqa_image_blocks.py). ``local_window_size`` must stay -1 with
``causal=0``, so the window lives in the bias, as it already does.

Math preserved: GQAFusion's (the same q/k rotation, scale, softcap, lengths from
``attention_mask``), with the bias the Attention node read: the image tokens of one image keep
seeing each other in both directions, a chunked layer's queries their own chunk's keys only
(tests/models/families/test_llama4.py), an ALiBi layer's each head's linear biases
(tests/models/families/test_alibi.py). The rule runs only where the EP's GQA kernel takes the
bias (`ep/kernels.py`: "GroupQueryAttention.attention_bias") and rotates q/k itself
(SeparateRoPE, which would take the rotation out, keeps no bias), and not when graph capture
is on: onnxruntime-genai then feeds a static attention_mask [batch, max_length], whose width is
no longer the total length the bias counts query positions from.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, pattern

from mobius_genai.components.alibi import position_bias
from mobius_genai.components.attention import SLIDING_WINDOW_KEY
from mobius_genai.components.image_masks import BIDIRECTIONAL_WINDOW_KEY
from mobius_genai.optimize.rules.gqa import (
    ATTENTION_MASK,
    GQAFusion,
    GQAFusionNoRope,
    bidirectional_blocks,
    chunks,
    linear_biases,
    metadata_window,
)


class GQAImageBlockFusion(GQAFusion):
    """Attention over rotated q/k with the image-block bias → GroupQueryAttention(do_rotary=1,
    causal=0, attention_bias)."""

    def __init__(self, name: str = "GQAImageBlockFusion") -> None:
        super().__init__(name)

    def mask_input(
        self,
        context: MatchContext,
        mask: ir.Value,
        node: ir.Node,
        attributes: dict[str, Any],
        result: pattern.MatchResult,
    ) -> ir.Value | None:
        window = metadata_window(node)
        if chunks(mask) is not None or linear_biases(mask) is not None:
            raw = ""  # masks.py's chunked layers and the ALiBi layers slide no window
        elif bidirectional_blocks(mask) is not None:
            raw = mask.producer().metadata_props.get(BIDIRECTIONAL_WINDOW_KEY)
        else:
            result.fail(
                "mask has no image blocks, chunks or ALiBi (GQAFusion fuses causal masks)", mask
            )
            return None
        if raw is None or window != (int(raw) if raw else None):
            result.fail(f"bias window {raw!r} disagrees with {SLIDING_WINDOW_KEY}={window}", node)
            return None
        graph = context.graph_or_function
        inputs = [value for value in graph.inputs if value.name == ATTENTION_MASK]
        if not inputs:
            result.fail("graph has no 'attention_mask' input for GQA's lengths", mask)
            return None
        attributes["causal"] = 0  # the bias holds the causal part, the blocks and the window
        return inputs[0]

    def attention_bias(self, op, query: ir.Value, bindings: dict[str, Any]) -> ir.Value | None:
        """The mask; an ALiBi bias laid out by key position, as GQA's buffer holds the keys."""
        mask = bindings["mask"]
        if linear_biases(mask) is None:
            return mask
        return position_bias(op, mask, self._attention_mask, query)


class GQAImageBlockFusionNoRope(GQAImageBlockFusion):
    """The do_rotary=0 form, for layers whose rotation stays in front of GQA."""

    do_rotary = False
    pattern = GQAFusionNoRope.pattern

    def __init__(self) -> None:
        super().__init__("GQAImageBlockFusionNoRope")


def rules() -> pattern.RewriteRuleSet:
    """GQAImageBlockFusion, then its do_rotary=0 form for layers the first rule leaves."""
    return pattern.RewriteRuleSet([GQAImageBlockFusion.rule(), GQAImageBlockFusionNoRope.rule()])
