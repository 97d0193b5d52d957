"""The bodies of com.microsoft::MoE and QMoE (components/tier1.py's rows say what they compute).

`moe`, `moe_biased` and `moe_geglu` are MoE's overloads "", "bias" and "geglu": the experts
some token picked, gathered while they are under a third of all, else all of them in place.

`qmoe_geglu`, `qmoe_geglu_unpacked` and `qmoe_geglu_unpacked_zp` are QMoE's overloads for
Gemma 4's GeGLU experts in 4 bits (quantize/qmoe.py writes them; no onnxruntime 1.32 kernel
takes GeGLU, so every EP expands them): each projection's packed codes [E, N, K/2] (uint8, two
values a byte, the first in the low nibble), scales [E, N, K/bs] and zero points
[E, N, ceil(K/bs/2)] (absent: 8) as QMoE and MatMulNBits store them; only the picked experts
are dequantized to float, k of them at a time (a Loop over groups of k picked experts: at most
[k, N, K] float however long the prompt), then the GeGLU math of `moe_geglu`'s gathered branch.
"geglu" dequantizes with com.microsoft::GatherBlockQuantized (gather_axis 0, quantize_axis 2:
the EPs whose table has that kernel); the "unpacked" ones with standard ops (Gather of the
bytes, BitwiseAnd and BitShift for the two nibbles, (q - zp) * scale per block), for an EP
without it or without custom ops. No `If` here: where the float body runs every expert in
place when most are picked, a 4-bit expert must be dequantized either way, and gathering all
of them is that dequantization (benchmarks/README.md's MoE-body section measures it).

`qmoe_geglu_per_expert` is no function body: where the EP's "MatMulNBits.experts" row says so
(cpu), quantize/qmoe.py writes each expert's arrays as initializers of their own and this
graph in the MoE node's place, two MatMulNBits per expert on its constant codes (which
onnxruntime prepacks at load), each on the rows that picked it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from mobius_genai.ep.kernels import MS_DOMAIN

__all__ = [
    "NBitsArrays",
    "moe",
    "moe_biased",
    "moe_geglu",
    "qmoe_geglu",
    "qmoe_geglu_per_expert",
    "qmoe_geglu_unpacked",
    "qmoe_geglu_unpacked_zp",
]


#: (tape, packed codes, picked experts, scales, zero points) → [picked, N, K] float
_Dequantize = Callable[[ir.tape.Tape, ir.Value, ir.Value, ir.Value, ir.Value | None], ir.Value]
_U8_15 = np.array(15, np.uint8)
_U8_4 = np.array(4, np.uint8)


def _ref_constant(tape: ir.tape.Tape, name: str, kind: ir.AttributeType) -> ir.Value:
    key = "value_int" if kind == ir.AttributeType.INT else "value_float"
    return tape.op("Constant", [], {key: ir.RefAttr(key, name, kind)})


def _ints(tape: ir.tape.Tape, *values: int) -> ir.Value:
    return tape.op("Constant", [], {"value_ints": list(values)})


def _routing_weights(
    tape: ir.tape.Tape,
    router: ir.Value,
    k: ir.Value | None = None,
    normalize: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value]:
    """[tokens, experts]: the top-k softmax probabilities (renormalized if `normalize`), else
    0; and the picked experts [tokens, k]. `k` ([1] int64) and `normalize` (a 0 or 1 scalar)
    default to the function's attributes of those names."""
    probs = tape.op("Softmax", [router], {"axis": -1})
    if k is None:
        k = tape.op("Reshape", [_ref_constant(tape, "k", ir.AttributeType.INT), _ints(tape, 1)])
    if normalize is None:
        normalize = _ref_constant(tape, "normalize_routing_weights", ir.AttributeType.INT)
    top, index = tape.op_multi_out("TopK", [probs, k], {"axis": -1}, num_outputs=2)
    normalize = tape.op("CastLike", [normalize, top])
    one = tape.op("CastLike", [tape.op("Constant", [], {"value_float": 1.0}), top])
    total = tape.op("ReduceSum", [top, _ints(tape, -1)], {"keepdims": 1})
    # normalize is 0 or 1, so the divisor is exactly 1 or exactly the sum
    divisor = tape.op("Add", [tape.op("Mul", [total, normalize]), tape.op("Sub", [one, normalize])])
    zeros = tape.op("Sub", [probs, probs])
    weights = tape.op(
        "ScatterElements", [zeros, index, tape.op("Div", [top, divisor])], {"axis": 1}
    )
    return weights, index


def _gate_and_up(tape: ir.tape.Tape, fused: ir.Value) -> tuple[ir.Value, ir.Value]:
    """[..., 2I] with gate and up interleaved → gate [..., I], up [..., I]."""
    pairs = tape.op(
        "Reshape",
        [
            fused,
            tape.op(
                "Concat", [tape.op("Shape", [fused], {"end": -1}), _ints(tape, -1, 2)], {"axis": 0}
            ),
        ],
    )
    gate, up = tape.op_multi_out("Split", [pairs], {"axis": -1, "num_outputs": 2}, num_outputs=2)
    last = _ints(tape, -1)
    gate, up = tape.op("Squeeze", [gate, last]), tape.op("Squeeze", [up, last])
    return gate, up


def _swiglu(tape: ir.tape.Tape, fused: ir.Value) -> ir.Value:
    """[..., 2I] with gate and up interleaved → G * sigmoid(alpha * G) * (L + beta)."""
    gate, up = _gate_and_up(tape, fused)
    limit = tape.op("CastLike", [_ref_constant(tape, "swiglu_limit", ir.AttributeType.FLOAT), gate])
    gate = tape.op("Min", [gate, limit])
    up = tape.op("Clip", [up, tape.op("Neg", [limit]), limit])
    alpha = tape.op(
        "CastLike", [_ref_constant(tape, "activation_alpha", ir.AttributeType.FLOAT), gate]
    )
    beta = tape.op("CastLike", [_ref_constant(tape, "activation_beta", ir.AttributeType.FLOAT), up])
    swish = tape.op("Mul", [gate, tape.op("Sigmoid", [tape.op("Mul", [alpha, gate])])])
    return tape.op("Mul", [swish, tape.op("Add", [up, beta])])


def _geglu(tape: ir.tape.Tape, fused: ir.Value) -> ir.Value:
    """[..., 2I] with gate and up interleaved → Gelu_tanh(gate) * up."""
    gate, up = _gate_and_up(tape, fused)
    return tape.op("Mul", [tape.op("Gelu", [gate], {"approximate": "tanh"}), up])


def _rows(tape: ir.tape.Tape, x: ir.Value) -> ir.Value:
    """x [..., H] → [T, H]."""
    last = tape.op("Shape", [x], {"start": -1})
    return tape.op("Reshape", [x, tape.op("Concat", [_ints(tape, -1), last], {"axis": 0})])


def _experts_sum(
    tape: ir.tape.Tape, rows: ir.Value, weights: ir.Value, experts: Sequence[ir.Value], gated
) -> ir.Value:
    """[T, H]: every expert of `experts` (fc1 [E, 2I, H], fc2 [E, H, I] and, if given, their
    biases) on every row, summed with the routing `weights` [T, E].

    The weights are transposed right before their MatMul, which onnxruntime fuses into one
    FusedMatMul (a Transpose of all the experts would not be folded when over 1 GB)."""
    fc1, fc2, *biases = experts
    to_in_out = {"perm": [0, 2, 1]}
    middle = _ints(tape, 1)
    hidden = tape.op("MatMul", [rows, tape.op("Transpose", [fc1], to_in_out)])  # [E, T, 2I]
    if biases:
        hidden = tape.op("Add", [hidden, tape.op("Unsqueeze", [biases[0], middle])])
    out = tape.op("MatMul", [gated(tape, hidden), tape.op("Transpose", [fc2], to_in_out)])
    if biases:
        out = tape.op("Add", [out, tape.op("Unsqueeze", [biases[1], middle])])
    per_expert = tape.op(
        "Unsqueeze", [tape.op("Transpose", [weights], {"perm": [1, 0]}), _ints(tape, 2)]
    )
    return tape.op(
        "ReduceSum", [tape.op("Mul", [out, per_expert]), _ints(tape, 0)], {"keepdims": 0}
    )


def _moe(
    tape: ir.tape.Tape, params: Sequence[ir.Value], biased: bool, gated=_swiglu
) -> list[ir.Value]:
    """The experts some token picked, gathered, while they are under a third of all; else all
    of them in place.

    A gathered expert costs about three reads of its weights (the Gather reads and writes it,
    the MatMul reads it): a decode step (k of E experts) reads k, a prefill that picks most
    runs every expert. Either way a token's unpicked experts weigh an exact zero, so both
    branches compute the same sum; each branch ends in the [T, H] sum, so no weight leaves it.
    """
    x, router, fc1, fc1_bias, fc2, fc2_bias = params
    rows = _rows(tape, x)
    weights, index = _routing_weights(tape, router)
    experts = [fc1, fc2, *((fc1_bias, fc2_bias) if biased else ())]
    picked = tape.op("Unique", [tape.op("Reshape", [index, _ints(tape, -1)])])
    count = tape.op("Shape", [weights], {"start": -1})
    few = tape.op("Less", [tape.op("Mul", [tape.op("Shape", [picked]), _ints(tape, 3)]), count])
    gather, every = ir.tape.Tape(), ir.tape.Tape()
    gathered = [gather.op("Gather", [value, picked]) for value in experts]
    picked_weights = gather.op("Gather", [weights, picked], {"axis": 1})
    branches = {
        "then_branch": ir.Graph(
            [],
            [_experts_sum(gather, rows, picked_weights, gathered, gated)],
            nodes=gather.nodes,
            name="picked_experts",
        ),
        "else_branch": ir.Graph(
            [],
            [_experts_sum(every, rows, weights, experts, gated)],
            nodes=every.nodes,
            name="every_expert",
        ),
    }
    total = tape.op("If", [tape.op("Squeeze", [few, _ints(tape, 0)])], branches)
    return [tape.op("Reshape", [total, tape.op("Shape", [x])])]


def moe(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _moe(tape, params, biased=False)


def moe_biased(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _moe(tape, params, biased=True)


def moe_geglu(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _moe(tape, params, biased=False, gated=_geglu)


def _gathered_block_quantized(
    tape: ir.tape.Tape,
    packed: ir.Value,
    picked: ir.Value,
    scales: ir.Value,
    zero_points: ir.Value | None,
) -> ir.Value:
    """[picked, N, K] in the scales' dtype: GatherBlockQuantized of the picked experts."""
    attributes = {
        "gather_axis": 0,
        "quantize_axis": 2,
        "bits": ir.RefAttr("bits", "expert_weight_bits", ir.AttributeType.INT),
        "block_size": ir.RefAttr("block_size", "block_size", ir.AttributeType.INT),
    }
    return tape.op(
        "GatherBlockQuantized", [packed, picked, scales, zero_points], attributes, domain=MS_DOMAIN
    )


def _nibbles(tape: ir.tape.Tape, packed: ir.Value, picked: ir.Value) -> ir.Value:
    """[picked, N, 2B] uint8: the two 4-bit values of each byte of the picked rows, low first."""
    data = tape.op("Gather", [packed, picked])
    low = tape.op("BitwiseAnd", [data, tape.op("Constant", [], {"value": ir.tensor(_U8_15)})])
    high = tape.op(
        "BitShift",
        [data, tape.op("Constant", [], {"value": ir.tensor(_U8_4)})],
        {"direction": "RIGHT"},
    )
    last = _ints(tape, -1)
    pairs = tape.op(
        "Concat",
        [tape.op("Unsqueeze", [low, last]), tape.op("Unsqueeze", [high, last])],
        {"axis": -1},
    )
    return tape.op("Reshape", [pairs, _ints(tape, 0, 0, -1)])


def _gathered_unpacked(
    tape: ir.tape.Tape,
    packed: ir.Value,
    picked: ir.Value,
    scales: ir.Value,
    zero_points: ir.Value | None,
) -> ir.Value:
    """[picked, N, K] in the scales' dtype, in standard ops: (q - zp) * scale per block."""
    scale = tape.op("Gather", [scales, picked])  # [p, N, K/bs]
    blocked = tape.op("Concat", [tape.op("Shape", [scale]), _ints(tape, -1)], {"axis": 0})
    codes = tape.op(
        "CastLike", [tape.op("Reshape", [_nibbles(tape, packed, picked), blocked]), scale]
    )
    if zero_points is None:
        zero = tape.op("CastLike", [tape.op("Constant", [], {"value_float": 8.0}), scale])
    else:  # one nibble a block, the last byte padded when the blocks are odd
        blocks = tape.op("Shape", [scale], {"start": 2})
        nibbles = _nibbles(tape, zero_points, picked)
        zero = tape.op("Slice", [nibbles, _ints(tape, 0), blocks, _ints(tape, 2)])
        zero = tape.op("Unsqueeze", [tape.op("CastLike", [zero, scale]), _ints(tape, -1)])
    values = tape.op(
        "Mul", [tape.op("Sub", [codes, zero]), tape.op("Unsqueeze", [scale, _ints(tape, -1)])]
    )
    return tape.op("Reshape", [values, _ints(tape, 0, 0, -1)])


def _in_groups(
    tape: ir.tape.Tape,
    picked: ir.Value,
    size: ir.Value,
    rows: ir.Value,
    group_sum: Callable[[ir.tape.Tape, ir.Value], ir.Value],
) -> ir.Value:
    """[T, H]: `group_sum(body, group)` ([T, H], of `group` [<= size] picked experts) added
    up over the picked experts `size` at a time, by a Loop (one group's values at a time)."""
    one = _ints(tape, 1)
    rounded_up = tape.op("Sub", [tape.op("Add", [tape.op("Shape", [picked]), size]), one])
    count = tape.op("Squeeze", [tape.op("Div", [rounded_up, size]), _ints(tape, 0)])
    body = ir.tape.Tape()
    number = ir.Value(name="group", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    going = ir.Value(name="going", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    total = ir.Value(name="total")  # the rows' dtype, which the function leaves open
    first = body.op("Mul", [body.op("Unsqueeze", [number, _ints(body, 0)]), size])
    group = body.op("Slice", [picked, first, body.op("Add", [first, size])])
    added = body.op("Add", [total, group_sum(body, group)])
    loop = ir.Graph(
        [number, going, total],
        [body.op("Identity", [going]), added],
        nodes=body.nodes,
        name="expert_group",
    )
    zero = tape.op("CastLike", [tape.op("Constant", [], {"value_float": 0.0}), rows])
    zeros = tape.op("Expand", [zero, tape.op("Shape", [rows])])
    # a condition, though the count alone ends the Loop: onnx.reference runs none without one
    always = tape.op("Constant", [], {"value": ir.tensor(np.array(True))})
    return tape.op("Loop", [count, always, zeros], {"body": loop})


def _qmoe_geglu(
    tape: ir.tape.Tape, params: Sequence[ir.Value], dequantize: _Dequantize, zero_points: bool
) -> list[ir.Value]:
    """The routing and GeGLU of the float body's gathered branch, on the picked experts
    `dequantize`d (with each projection's zero points when `zero_points`, else none) k at a
    time (`_in_groups`).

    At most k experts are float at once, however many the tokens pick (a prefill's tokens
    pick nearly all): k * 3 * I * H values (Gemma 4 26B-A4B: 8 experts, 190 MB in float32,
    where all 128 were 3 GB), and the group's products [k, T, 2I] (a dense MLP k * I wide's).
    A decode step's k experts are one group."""
    x, router, fc1, fc1_scales, _, fc2, fc2_scales, *rest = params
    fc1_zp, fc2_zp = (rest[4], rest[5]) if zero_points else (None, None)
    weights, index = _routing_weights(tape, router)
    picked = tape.op("Unique", [tape.op("Reshape", [index, _ints(tape, -1)])])
    rows = _rows(tape, x)

    def group_sum(body: ir.tape.Tape, group: ir.Value) -> ir.Value:
        experts = [
            dequantize(body, fc1, group, fc1_scales, fc1_zp),
            dequantize(body, fc2, group, fc2_scales, fc2_zp),
        ]
        group_weights = body.op("Gather", [weights, group], {"axis": 1})
        return _experts_sum(body, rows, group_weights, experts, _geglu)

    size = tape.op("Reshape", [_ref_constant(tape, "k", ir.AttributeType.INT), _ints(tape, 1)])
    total = _in_groups(tape, picked, size, rows, group_sum)
    return [tape.op("Reshape", [total, tape.op("Shape", [x])])]


def qmoe_geglu(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _qmoe_geglu(tape, params, _gathered_block_quantized, zero_points=True)


def qmoe_geglu_unpacked(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _qmoe_geglu(tape, params, _gathered_unpacked, zero_points=False)


def qmoe_geglu_unpacked_zp(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    return _qmoe_geglu(tape, params, _gathered_unpacked, zero_points=True)


#: One projection's MatMulNBits arrays: codes [N, K/bs, bs/2], scales [N, K/bs], zero points
#: [N, ceil(K/bs/2)] or None (8).
NBitsArrays = tuple[ir.Value, ir.Value, ir.Value | None]


def _nbits(
    tape: ir.tape.Tape, rows: ir.Value, arrays: NBitsArrays, attributes: dict[str, int]
) -> ir.Value:
    """com.microsoft::MatMulNBits of `rows` [n, K] and one projection's arrays → [n, N]."""
    codes, scales, zero_points = arrays
    n, blocks = (int(d) for d in codes.shape[:2])
    block_size = attributes["block_size"]
    sizes = {"K": blocks * block_size, "N": n, "bits": 4}
    inputs = [rows, codes, scales] + ([zero_points] if zero_points is not None else [])
    return tape.op("MatMulNBits", inputs, {**attributes, **sizes}, domain=MS_DOMAIN)


def _expert_part(
    tape: ir.tape.Tape,
    rows: ir.Value,
    weight: ir.Value,
    fc1: NBitsArrays,
    fc2: NBitsArrays,
    attributes: dict[str, int],
) -> ir.Value:
    """One expert's GeGLU output on the rows that picked it [n, H], times their weights [n, 1]."""
    fused = _nbits(tape, rows, fc1, attributes)
    gate, up = tape.op_multi_out("Split", [fused], {"axis": -1, "num_outputs": 2}, num_outputs=2)
    gated = tape.op("Mul", [tape.op("Gelu", [gate], {"approximate": "tanh"}), up])
    return tape.op("Mul", [_nbits(tape, gated, fc2, attributes), weight])


def qmoe_geglu_per_expert(
    tape: ir.tape.Tape,
    x: ir.Value,
    router: ir.Value,
    experts: Sequence[tuple[NBitsArrays, NBitsArrays]],
    routing: tuple[int, int],
    attributes: dict[str, int],
) -> ir.Value:
    """GeGLU experts in 4 bits as two MatMulNBits per expert on its own constant arrays
    (`experts`: each one's fc1 [2I, H], gate rows then up rows, and fc2 [H, I]), which
    onnxruntime prepacks at load as for a dense layer; `routing` is (k,
    normalize_routing_weights), `attributes` the MatMulNBits' block_size and accuracy_level.
    The output, shaped as `x`.

    The routing of the QMoE bodies; then the (token, slot) pairs sorted by the expert picked
    (TopK of the expert ids, smallest first), their rows and weights split by the count of
    each expert (one Split each, an expert no token picked getting none), each expert on its
    own rows, and the pieces (in the same order) added into the total by one ScatterND (add).
    No expert is ever float, no `If`, and a prefill computes each expert on its own tokens.
    """
    top_k, normalize = routing
    rows = _rows(tape, x)
    k = tape.op("Constant", [], {"value_ints": [top_k]})
    weights, index = _routing_weights(
        tape, router, k, tape.op("Constant", [], {"value_int": normalize})
    )
    flat = last = _ints(tape, -1)
    slots = tape.op("Reshape", [index, flat])  # [T * k]: the expert of each (token, slot)
    slot_weights = tape.op(
        "Reshape", [tape.op("GatherElements", [weights, index], {"axis": 1}), flat]
    )
    _, order = tape.op_multi_out(
        "TopK", [slots, tape.op("Shape", [slots])], {"largest": 0}, num_outputs=2
    )
    tokens = tape.op("Div", [order, k])
    count = len(experts)
    every = tape.op("Constant", [], {"value": ir.tensor(np.arange(count, dtype=np.int64))})
    picked = tape.op("Equal", [tape.op("Unsqueeze", [slots, last]), every])  # [T * k, E]
    counts = tape.op(
        "ReduceSum",
        [tape.op("Cast", [picked], {"to": ir.DataType.INT64}), _ints(tape, 0)],
        {"keepdims": 0},
    )
    split = {"axis": 0}
    expert_rows = tape.op_multi_out(
        "Split", [tape.op("Gather", [rows, tokens]), counts], split, num_outputs=count
    )
    sorted_weights = tape.op("Unsqueeze", [tape.op("Gather", [slot_weights, order]), last])
    expert_weights = tape.op_multi_out("Split", [sorted_weights, counts], split, num_outputs=count)
    pieces = [
        _expert_part(tape, expert_rows[e], expert_weights[e], fc1, fc2, attributes)
        for e, (fc1, fc2) in enumerate(experts)
    ]
    # added in float32: onnxruntime's CPU ScatterND adds no float16
    f32 = {"to": ir.DataType.FLOAT}
    zeros = tape.op(
        "Expand", [tape.op("Constant", [], {"value_float": 0.0}), tape.op("Shape", [rows])]
    )
    summed = tape.op(
        "ScatterND",
        [
            zeros,
            tape.op("Unsqueeze", [tokens, last]),
            tape.op("Cast", [tape.op("Concat", pieces, {"axis": 0})], f32),
        ],
        {"reduction": "add"},
    )
    return tape.op("Reshape", [tape.op("CastLike", [summed, rows]), tape.op("Shape", [x])])
