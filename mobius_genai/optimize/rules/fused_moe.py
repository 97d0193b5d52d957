"""FusedMoEPass: the com.microsoft::MoE nodes stay for the EP's fused kernel.

The MoE block (components/moe.py) emits the op itself, a Tier-1 function whose standard body
InlinePass expands for an EP without the kernel; so this group rewrites nothing. It is the MoE
row of the fusion table all the same: its gate (`supports_fused_moe`) is the decision, the trace
says "kept N MoE" where the EP runs the kernel and names the missing capability where it does
not (those nodes then appear under InlinePass).

Math preserved: the graph is unchanged; the kernel computes what the body does (measured in
tests/components/test_moe_function.py).
"""

from __future__ import annotations

from mobius_genai.optimize.rules.kept_op import KeptOpPass

OP_TYPE = "MoE"


class FusedMoEPass(KeptOpPass):
    """Counts the MoE nodes kept; changes nothing."""

    def __init__(self) -> None:
        super().__init__(OP_TYPE)
