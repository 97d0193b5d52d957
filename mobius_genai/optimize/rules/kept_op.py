"""KeptOpPass: the row of a Tier-1 op that components emit themselves (MoE, packed attention).

Such an op needs no rewrite: its gate is the decision. Where it admits the group, this pass
counts the nodes the EP's kernel runs (the trace says "kept N <op>"); where it declines, the
pipeline's InlinePass expands the nodes into their standard bodies (the group's `keeps`).
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from mobius_genai.components.tier1 import MS_DOMAIN


class KeptOpPass(ir.passes.InPlacePass):
    """Counts the com.microsoft `op_type` nodes kept (`matched`, `kept_ops`); changes nothing."""

    def __init__(self, op_type: str) -> None:
        super().__init__()
        self.op_type = op_type
        self.matched = 0
        self.kept_ops: collections.Counter[str] = collections.Counter()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.matched = sum(
            1
            for node in model.graph.all_nodes()
            if node.domain == MS_DOMAIN and node.op_type == self.op_type
        )
        self.kept_ops = collections.Counter({self.op_type: self.matched} if self.matched else {})
        return ir.passes.PassResult(model, False)
