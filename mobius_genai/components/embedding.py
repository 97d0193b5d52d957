"""Token embedding lookup."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import parameter


class Embedding(nn.Module):
    """Gather rows of a [vocab, hidden] table by token id, times `multiplier` when not 1."""

    def __init__(self, vocab_size: int, hidden_size: int, multiplier: float = 1.0) -> None:
        super().__init__()
        self.weight = parameter([vocab_size, hidden_size])
        self.multiplier = multiplier

    def forward(self, op, input_ids: ir.Value | None = None) -> ir.Value:
        """The rows of `input_ids`; without ids, the table itself (a tied head's weight, or
        learned positions added whole)."""
        if input_ids is None:
            return self.weight
        rows = op.Gather(self.weight, input_ids, axis=0)
        if self.multiplier == 1.0:
            return rows
        return op.Mul(rows, op.CastLike(op.Constant(value_float=self.multiplier), rows))
