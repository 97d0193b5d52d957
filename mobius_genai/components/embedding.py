"""Token embedding lookup."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import parameter


class Embedding(nn.Module):
    """Gather rows of a [vocab, hidden] table by token id."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = parameter([vocab_size, hidden_size])

    def forward(self, op, input_ids: ir.Value) -> ir.Value:
        return op.Gather(self.weight, input_ids, axis=0)
