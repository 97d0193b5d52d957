"""FusedMoEPass: the com.microsoft::MoE nodes stay for the EP's fused kernel.

The MoE block (components/moe.py) emits the op itself, a Tier-1 function whose standard body
InlinePass expands for an EP without the kernel; so this group rewrites nothing. It is the MoE
row of the fusion table all the same: its gate (`supports_fused_moe`) is the decision, the trace
says "kept N MoE" where the EP runs the kernel and names the missing capability where it does
not (those nodes then appear under InlinePass).

Math preserved: the graph is unchanged; the kernel computes what the body does (measured in
tests/optimize/test_moe_function.py).
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from mobius_genai.components.tier1 import MS_DOMAIN

OP_TYPE = "MoE"


class FusedMoEPass(ir.passes.InPlacePass):
    """Counts the MoE nodes kept (`matched`, `kept_ops`); changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.matched = 0
        self.kept_ops: collections.Counter[str] = collections.Counter()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.matched = sum(
            1
            for node in model.graph.all_nodes()
            if node.domain == MS_DOMAIN and node.op_type == OP_TYPE
        )
        self.kept_ops = collections.Counter({OP_TYPE: self.matched} if self.matched else {})
        return ir.passes.PassResult(model, False)
