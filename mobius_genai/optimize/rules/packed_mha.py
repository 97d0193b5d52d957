"""PackedMHAPass: a vision tower's com.microsoft::PackedMultiHeadAttention nodes stay for the
EP's kernel.

Qwen2.5-VL's vision attention (components/qwen_vision.py) emits the op itself: each window (or
frame, for the full-attention blocks) one packed sequence. It is a Tier-1 function whose
standard body (components/attention_bodies.py: the sequences padded, standard Attention with
the keys past each sequence masked, gathered back) InlinePass expands where this group's gate
declines: an EP without `supports_packed_multi_head_attention`, a role other than vision, or a
dtype the op's schema does not admit (float and float16 only).

Math preserved: the graph is unchanged; the kernel computes what the body does (the body is
checked against transformers' vision features, tests/models/test_qwen2_5_vl_packed.py).
"""

from __future__ import annotations

from mobius_genai.optimize.rules.kept_op import KeptOpPass

OP_TYPE = "PackedMultiHeadAttention"


class PackedMHAPass(KeptOpPass):
    """Counts the PackedMultiHeadAttention nodes kept; changes nothing."""

    def __init__(self) -> None:
        super().__init__(OP_TYPE)
