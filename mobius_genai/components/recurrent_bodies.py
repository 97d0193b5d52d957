"""Standard-ONNX bodies of the Tier-1 ops of recurrent layers (components/tier1.py registers
them): the state-carrying convolution of LFM2 / Qwen3.5 / Mamba2, the gated delta rule of
Qwen3.5 and the gated linear recurrence of Mamba2.

- ``CausalConvWithState(input, weight, bias, past_state)``: the depthwise causal convolution of
  ``window = Concat(past_state, input)`` along the last axis, ``output[b, c, t] =
  sum_j window[b, c, t + j] * weight[c, 0, j]``, then the activation (overload ``""``: none,
  ``"silu"``: SiLU); ``present_state`` is the last ``k - 1`` columns of ``window``. The taps are
  gathered as a [L, k] index grid rather than a grouped Conv, whose ``group`` attribute a body
  could not take from the shapes.
- ``LinearAttention(query, key, value, past_state, decay, beta)`` with
  ``update_rule="gated_delta"``: packed [B, T, heads * dim] inputs; query and key heads
  repeat-interleaved onto the ``kv_num_heads`` value heads; query scaled by ``scale`` (0: the key
  dim ** -0.5); then token by token (a Scan over T carrying the [B, H, d_k, d_v] state ``S``)
  ``S = exp(g_t) * S``, ``S = S + k_t ⊗ (beta_t * (v_t - S^T k_t))``, ``o_t = q_t^T S``. The
  decay may be per head [B, T, H] or per key dim [B, T, H * d_k]; beta per head or [B, T, 1].
  Inputs are cast to the state's type and the output back to the value's.
- ``LinearAttention`` with ``update_rule="gated"`` (overload ``"gated"``: Mamba2's selective
  scan, and Mamba1's with a head per channel): the same heads, then ``S = exp(g_t) * S +
  k_t ⊗ v_t``, ``o_t = q_t^T S`` with the decay per head [B, T, H] (Mamba2) or per key dim
  [B, T, H * d_k] (Mamba1); beta is not read (onnxruntime's CPU kernel ignores it too).

onnxruntime 1.32 runs both com.microsoft ops on the CPU EP (measured against these bodies in
tests/components/test_recurrent_functions.py); the standard opset-27 ops of the same names have no
kernel there, so components emit the com.microsoft ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["causal_conv", "causal_conv_silu", "gated", "gated_delta"]


def _ints(tape: ir.tape.Tape, *values: int) -> ir.Value:
    return tape.op("Constant", [], {"value_ints": list(values)})


def _dim(tape: ir.tape.Tape, value: ir.Value, axis: int) -> ir.Value:
    """The size of `axis` of `value` as an int64 scalar."""
    return tape.op("Squeeze", [tape.op("Shape", [value], {"start": axis, "end": axis + 1})])


def causal_conv(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    x, weight, _bias, past = params
    window = tape.op("Concat", [past, x], {"axis": -1})  # [B, C, k - 1 + L]
    length = _dim(tape, x, 2)
    zero = tape.op("Constant", [], {"value_int": 0})
    one = tape.op("Constant", [], {"value_int": 1})
    positions = tape.op("Range", [zero, length, one])
    taps = tape.op("Range", [zero, _dim(tape, weight, 2), one])
    grid = tape.op(
        "Add",
        [
            tape.op("Unsqueeze", [positions, _ints(tape, 1)]),
            tape.op("Unsqueeze", [taps, _ints(tape, 0)]),
        ],
    )  # [L, k]: window column of tap j at step t
    patches = tape.op("Gather", [window, grid], {"axis": 2})  # [B, C, L, k]
    output = tape.op(
        "ReduceSum", [tape.op("Mul", [patches, weight]), _ints(tape, -1)], {"keepdims": 0}
    )
    # [B, C, L] again, as x: a no-op that lets shape inference (which reads the body) keep
    # x's symbolic dims, which the Range-built grid loses
    output = tape.op("Reshape", [output, tape.op("Shape", [x])])
    starts = tape.op("Unsqueeze", [length, _ints(tape, 0)])
    present = tape.op("Slice", [window, starts, _ints(tape, 2**63 - 1), _ints(tape, 2)])
    return [output, present]


def causal_conv_silu(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    output, present = causal_conv(tape, params)
    return [tape.op("Mul", [output, tape.op("Sigmoid", [output])]), present]


def _ref_int(tape: ir.tape.Tape, name: str) -> ir.Value:
    """Attribute `name` of the call as a [1] int64 tensor."""
    value = tape.op(
        "Constant", [], {"value_int": ir.RefAttr("value_int", name, ir.AttributeType.INT)}
    )
    return tape.op("Reshape", [value, _ints(tape, 1)])


def _heads(tape: ir.tape.Tape, packed: ir.Value, heads: ir.Value, dim: ir.Value) -> ir.Value:
    """[B, T, H * D] → [B, T, H, D] (`heads` or `dim` may be [-1])."""
    return tape.op(
        "Reshape", [packed, tape.op("Concat", [_ints(tape, 0, 0), heads, dim], {"axis": 0})]
    )


def _repeat_heads(tape: ir.tape.Tape, x: ir.Value, heads: ir.Value) -> ir.Value:
    """[B, T, h, D] → [B, T, `heads`, D], each head repeated heads / h times in place."""
    own = tape.op("Shape", [x], {"start": 2, "end": 3})
    repeats = tape.op("Div", [heads, own])
    grown = tape.op(
        "Concat",
        [tape.op("Shape", [x], {"end": 3}), repeats, tape.op("Shape", [x], {"start": 3})],
        {"axis": 0},
    )
    expanded = tape.op("Expand", [tape.op("Unsqueeze", [x, _ints(tape, 3)]), grown])
    return _heads(tape, expanded, _ints(tape, -1), tape.op("Shape", [x], {"start": 3}))


def _scale(tape: ir.tape.Tape, key_dim: ir.Value, like: ir.Value) -> ir.Value:
    """The `scale` attribute, or key_dim ** -0.5 where it is 0."""
    scale = tape.op(
        "Constant", [], {"value_float": ir.RefAttr("value_float", "scale", ir.AttributeType.FLOAT)}
    )
    default = tape.op(
        "Pow",
        [
            tape.op("Cast", [key_dim], {"to": ir.DataType.FLOAT}),
            tape.op("Constant", [], {"value_float": -0.5}),
        ],
    )
    is_default = tape.op("Equal", [scale, tape.op("Constant", [], {"value_float": 0.0})])
    return tape.op("CastLike", [tape.op("Where", [is_default, default, scale]), like])


def _delta_step() -> ir.Graph:
    """Scan body: state [B, H, dk, dv] and one token's q, k [B, H, dk], v [B, H, dv], g [B, H, X],
    beta [B, Hb] → the new state and o [B, H, dv]."""
    tape = ir.tape.Tape()
    names = ("state_in", "q_t", "k_t", "v_t", "g_t", "beta_t")
    state, q, k, v, g, beta = inputs = [ir.Value(name=name) for name in names]
    second = _ints(tape, 2)
    decayed = tape.op("Mul", [state, tape.op("Exp", [tape.op("Unsqueeze", [g, _ints(tape, -1)])])])
    k_row = tape.op("Unsqueeze", [k, second])  # [B, H, 1, dk]
    memory = tape.op("MatMul", [k_row, decayed])  # S^T k: [B, H, 1, dv]
    error = tape.op("Sub", [tape.op("Unsqueeze", [v, second]), memory])
    delta = tape.op("Mul", [error, tape.op("Unsqueeze", [beta, _ints(tape, 2, 3)])])
    k_column = tape.op("Transpose", [k_row], {"perm": [0, 1, 3, 2]})
    updated = tape.op("Add", [decayed, tape.op("MatMul", [k_column, delta])])
    output = tape.op(
        "Squeeze", [tape.op("MatMul", [tape.op("Unsqueeze", [q, second]), updated]), second]
    )
    updated.name, output.name = "state_out", "o_t"
    return ir.Graph(inputs, [updated, output], nodes=tape.nodes, name="gated_delta_step")


def _gated_step() -> ir.Graph:
    """Scan body: state [B, H, dk, dv] and one token's q, k [B, H, dk], v [B, H, dv], g
    [B, H, X] (X: 1 or dk) → the new state and o [B, H, dv]."""
    tape = ir.tape.Tape()
    state, q, k, v, g = inputs = [
        ir.Value(name=n) for n in ("state_in", "q_t", "k_t", "v_t", "g_t")
    ]
    second = _ints(tape, 2)
    decayed = tape.op("Mul", [state, tape.op("Exp", [tape.op("Unsqueeze", [g, _ints(tape, -1)])])])
    k_column = tape.op("Unsqueeze", [k, _ints(tape, 3)])  # [B, H, dk, 1]
    outer = tape.op("MatMul", [k_column, tape.op("Unsqueeze", [v, second])])  # k ⊗ v
    updated = tape.op("Add", [decayed, outer])
    output = tape.op(
        "Squeeze", [tape.op("MatMul", [tape.op("Unsqueeze", [q, second]), updated]), second]
    )
    updated.name, output.name = "state_out", "o_t"
    return ir.Graph(inputs, [updated, output], nodes=tape.nodes, name="gated_step")


def _linear_attention(
    tape: ir.tape.Tape, params: Sequence[ir.Value], step: ir.Graph, with_beta: bool
) -> list[ir.Value]:
    """The heads of LinearAttention's packed inputs scanned token by token through `step`."""
    query, key, value, past, decay, beta = params
    kv_heads = _ref_int(tape, "kv_num_heads")
    key_dim = tape.op(
        "Div", [tape.op("Shape", [query], {"start": 2}), _ref_int(tape, "q_num_heads")]
    )
    q = _repeat_heads(
        tape, _heads(tape, query, _ref_int(tape, "q_num_heads"), _ints(tape, -1)), kv_heads
    )
    q = tape.op("Mul", [q, _scale(tape, key_dim, q)])
    k = _repeat_heads(tape, _heads(tape, key, _ints(tape, -1), key_dim), kv_heads)
    v = _heads(tape, value, kv_heads, _ints(tape, -1))
    g = _heads(tape, decay, kv_heads, _ints(tape, -1))  # per head or per key dim
    gates = [(g, 4)]
    if with_beta:
        gates.append((tape.op("Reshape", [beta, _ints(tape, 0, 0, -1)]), 3))
    # time-major (the scan axis 0: onnx's reference evaluator scans no other axis)
    scanned = [
        tape.op("Transpose", [tape.op("CastLike", [x, past])], {"perm": [1, 0, 2, 3][:rank]})
        for x, rank in ((q, 4), (k, 4), (v, 4), *gates)
    ]
    present, output = tape.op_multi_out(
        "Scan",
        [past, *scanned],
        {"body": ir.Attr("body", ir.AttributeType.GRAPH, step), "num_scan_inputs": len(scanned)},
        num_outputs=2,
    )
    output = tape.op("Transpose", [output], {"perm": [1, 0, 2, 3]})
    packed = tape.op("Reshape", [output, _ints(tape, 0, 0, -1)])
    return [tape.op("CastLike", [packed, value]), present]


def gated_delta(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _linear_attention(tape, params, _delta_step(), with_beta=True)


def gated(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _linear_attention(tape, params, _gated_step(), with_beta=False)
