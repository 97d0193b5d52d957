"""AltUp (Gemma 3n): a layer's hidden state is `streams` copies [batch, seq, streams, hidden];
the layer runs on one (the active stream) and the others follow by learned coefficients.

    modalities(x) = tanh(router(rms(x) / hidden))                       [.., streams]
    predict:  P = S + R @ S,  R = prediction_coefs(modalities(S_active)) as [streams, streams]
    correct:  C_i = P_i + (y - P_active) * (1 + correction_coefs(modalities(y)))_i

`expand` makes the streams from the token embedding (projections rescaled to its RMS) and
`collapse` averages them back (unembedding projections, same rescaling) before the final norm.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.norms import RMSNorm


def _const(op, value: float, like: ir.Value) -> ir.Value:
    return op.CastLike(op.Constant(value_float=value), like)


def stream(op, streams: ir.Value, index: int) -> ir.Value:
    """Stream `index` of [batch, seq, streams, hidden] as [batch, seq, hidden]."""
    return op.Gather(streams, op.Constant(value_int=index), axis=2)


def _rms(op, x: ir.Value) -> ir.Value:
    return op.ReduceMean(op.Mul(x, x), op.Constant(value_ints=[-1]), keepdims=1)


def _rescaled(op, x: ir.Value, target: ir.Value) -> ir.Value:
    """x * target / sqrt(max(mean(x²), 1e-5)): x at the RMS `target`."""
    magnitude = op.Sqrt(op.Max(_rms(op, x), _const(op, 1e-5, x)))
    return op.Div(op.Mul(x, target), magnitude)


class _Projections(nn.Module):
    """One projection per stream 1.., named 0, 1, ... as transformers' ModuleList (a called
    ModuleList would scope its children twice)."""

    def __init__(self, hidden: int, streams: int) -> None:
        super().__init__()
        self.count = streams - 1
        for index in range(self.count):
            setattr(self, str(index), Linear(hidden, hidden))

    def __iter__(self):
        return (getattr(self, str(index)) for index in range(self.count))


class StreamExpansion(_Projections):
    """The streams made from the token embedding (`altup_projections`)."""

    def forward(self, op, x: ir.Value) -> ir.Value:
        """[batch, seq, hidden] → [batch, seq, streams, hidden]."""
        target = op.Sqrt(_rms(op, x))
        copies = [x] + [_rescaled(op, p(op, x), target) for p in self]
        return op.Concat(*(op.Unsqueeze(c, op.Constant(value_ints=[2])) for c in copies), axis=2)


class StreamCollapse(_Projections):
    """The streams averaged back (`altup_unembed_projections`)."""

    def forward(self, op, streams: ir.Value) -> ir.Value:
        """[batch, seq, streams, hidden] → their mean [batch, seq, hidden]."""
        first = stream(op, streams, 0)
        target = op.Sqrt(_rms(op, first))
        copies = [first] + [
            _rescaled(op, p(op, stream(op, streams, i + 1)), target) for i, p in enumerate(self)
        ]
        total = copies[0]
        for copy in copies[1:]:
            total = op.Add(total, copy)
        return op.Div(total, _const(op, float(len(copies)), total))


class AltUp(nn.Module):
    """Predict and correct the streams of one layer (module names as transformers')."""

    def __init__(
        self, hidden: int, streams: int, active: int, eps: float, correct_scale: bool
    ) -> None:
        super().__init__()
        self.hidden, self.streams, self.active = hidden, streams, active
        self.correct_output_scale = parameter([hidden])
        self.scales = correct_scale
        self.correction_coefs = Linear(streams, streams)
        self.prediction_coefs = Linear(streams, streams * streams)
        self.modality_router = Linear(hidden, streams)
        self.router_norm = RMSNorm(hidden, eps)

    def _modalities(self, op, x: ir.Value) -> ir.Value:
        routed = op.Mul(self.router_norm(op, x), _const(op, self.hidden**-1.0, x))
        return op.Tanh(self.modality_router(op, routed))

    def forward(self, op, streams: ir.Value, output: ir.Value | None = None):
        """The predictions of `streams`; given the layer's `output` too, `streams` are the
        predictions and the result is (the corrected streams, their active stream, times
        `correct_output_scale` when the config scales it)."""
        if output is None:
            return self._predict(op, streams)
        corrected = self._correct(op, streams, output)
        active = stream(op, corrected, self.active)
        return corrected, op.Mul(active, self.correct_output_scale) if self.scales else active

    def _predict(self, op, streams: ir.Value) -> ir.Value:
        """P = S + R @ S, R [batch, seq, streams, streams] from the active stream."""
        coefs = self.prediction_coefs(op, self._modalities(op, stream(op, streams, self.active)))
        shape = op.Constant(value_ints=[0, 0, self.streams, self.streams])
        return op.Add(op.MatMul(op.Reshape(coefs, shape), streams), streams)

    def _correct(self, op, predictions: ir.Value, output: ir.Value) -> ir.Value:
        """C_i = P_i + (y - P_active) * (1 + c_i): every stream moved by the innovation."""
        innovation = op.Sub(output, stream(op, predictions, self.active))
        coefs = self.correction_coefs(op, self._modalities(op, output))
        coefs = op.Add(coefs, _const(op, 1.0, output))
        moved = op.Mul(
            op.Unsqueeze(coefs, op.Constant(value_ints=[-1])),
            op.Unsqueeze(innovation, op.Constant(value_ints=[2])),
        )
        return op.Add(moved, predictions)
