"""Tier-1 functions: com.microsoft ops that carry a standard-ONNX function body.

A fusion that emits one of these ops also registers its body in ``model.functions`` (see
`register_functions`). onnxruntime then runs its fused kernel, and a runtime without the
kernel expands the body (onnxruntime itself does so for an op it has no kernel for), so the
"default" EP stays portable. For an EP that cannot run an op, Stage 2b inlines the body
(`needs_inlining`), which leaves only standard ONNX. Which EP runs which of these ops is
data: the KERNELS table of ep/kernels.py and each EP's entry.

Each body reproduces the op as onnxruntime 1.32 defines it (contrib-op schemas and CPU kernels),
in the ONNX opset of the model it is registered in (bodies use only ops the matched pattern
already contained, so the opset is always new enough):

- ``SkipSimplifiedLayerNormalization(input, skip, gamma)``: ``s = input + skip``;
  ``output = RMSNormalization(s, gamma)`` over the last axis; ``mean`` / ``inv_std_var`` are the
  float32 statistics of ``s`` over the last axis (kept dims); ``input_skip_bias_sum = s``.
- ``SkipLayerNormalization(input, skip, gamma[, beta])``: the same with LayerNormalization,
  whose Mean / InvStdDev outputs are ``mean`` / ``inv_std_var``.
- ``FusedMatMul(A, B)``: ``alpha * op(A) @ op(B)``. A body cannot branch on attributes, so each
  transposition gets an overload: ``"transB"`` is ``A @ Transpose(B)`` for a 2-D ``B`` and
  ``"transA"`` is ``Transpose(A) @ B`` for a 2-D ``A`` (alpha 1, no batch transposes), the only
  forms the FusedMatMul rule emits. onnxruntime picks its kernel whatever the overload is.
- ``BiasGelu(A, B)``: ``Gelu(A + B)`` (erf form; onnxruntime's BiasGelu is the exact GELU).
- ``FastGelu(X, bias)``: ``Gelu(X + bias, approximate="tanh")``.
- ``MoE(input, router_probs, fc1_experts_weights, [fc1_experts_bias], fc2_experts_weights,
  [fc2_experts_bias])`` with SwiGLU experts whose gate and up rows interleave
  (``activation_type="swiglu"``, ``swiglu_fusion=1``, the only SwiGLU form onnxruntime's CPU kernel
  takes): ``p = Softmax(router_probs)`` over the experts, the ``k`` largest ``p`` (divided by
  their sum when ``normalize_routing_weights``), and for each picked expert ``e``
  ``fc2[e] @ swiglu(fc1[e] @ x + b1[e]) + b2[e]`` weighted and summed, where
  ``swiglu(g, l) = G * sigmoid(alpha * G) * (L + beta)``, ``G = min(g, limit)``,
  ``L = clip(l, -limit, limit)`` (measured against onnxruntime 1.32's CPU kernel,
  tests/components/test_moe_function.py). The body runs the experts some token picked
  (``Unique`` of the top-k indices, gathered while they are under a third of all, else all of
  them in place) on every token and weights a token's unpicked ones by an exact zero: a decode
  step reads only its ``k`` experts, a prefill that picks most computes a dense MoE (`_moe`).
  Overload ``"bias"`` adds the two biases; ``""`` has none (the node leaves those inputs
  empty). Overload ``"geglu"`` (``activation_type="geglu"``, Gemma 4's experts) computes
  ``Gelu_tanh(G) * L`` instead of SwiGLU, without biases: no onnxruntime 1.32 CPU kernel takes it (ep/kernels.py's
  ``MoE.geglu``), so it is always expanded; with int4 after quantize/qmoe.py has made it:
- ``QMoE(input, router_probs, fc1 codes, fc1_scales, , fc2 codes, fc2_scales, , , , ,
  [fc1_zero_points], [fc2_zero_points])`` with GeGLU experts in 4 bits (overloads ``"geglu"``,
  ``"geglu_unpacked"``, ``"geglu_unpacked_zp"``; ``QMoE.*`` rows no EP has): the routing and
  GeGLU of ``"geglu"`` on the picked experts dequantized block-wise, ``(q - zp) * scale``,
  k at a time (components/moe_bodies.py; tests/quantize/test_geglu_experts.py).

- ``CausalConvWithState`` and ``LinearAttention`` (recurrent layers): their bodies and what
  they compute are in components/recurrent_bodies.py.
- ``PackedMultiHeadAttention(query, key, value, , token_offset, cumulative_sequence_length)``
  (a vision tower's windows, each one packed sequence): the body and what it computes are in
  components/attention_bodies.py. onnxruntime has only a CUDA kernel (float, float16) and does
  not fall back to the body, so the op is kept only where the EP's capabilities say so.

The bias inputs of the Skip*Normalization and CausalConvWithState ops are not covered (neither
rules nor components emit them: a conv bias is added after the op), so a node that uses one gets
no body.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import onnx_ir as ir
import onnx_ir.passes.common as common

from mobius_genai.components import attention_bodies, moe_bodies, recurrent_bodies
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.kernels import KERNELS, MS_DOMAIN, ep_runs, is_standard_domain

__all__ = [
    "INT4_MOE_OVERLOADS",
    "MS_DOMAIN",
    "TIER1_OPS",
    "DropUnusedOptionalOutputsPass",
    "Tier1Op",
    "ep_runs",
    "expand_after_int4",
    "expanded_after_int4",
    "is_standard_domain",
    "left_for_int4",
    "needs_inlining",
    "register_functions",
]

_DEFAULT_EPSILON = 1e-12  # onnxruntime's default for the Skip*Normalization ops

Body = Callable[[ir.tape.Tape, Sequence[ir.Value]], Sequence[ir.Value]]


@dataclasses.dataclass(frozen=True)
class Tier1Op:
    """One com.microsoft op with a standard-ONNX body."""

    op_type: str
    inputs: tuple[str, ...]
    """Formal inputs of the body; the first `min_inputs` are required."""
    min_inputs: int
    outputs: tuple[str, ...]
    optional_outputs: frozenset[int]
    """Output positions a node may leave empty (named "") when nothing reads them."""
    attributes: tuple[ir.Attr, ...]
    """Attributes the op declares, with onnxruntime's defaults."""
    bodies: Mapping[str, Body]
    """Overload → body builder (the default body has overload "")."""
    uncovered_inputs: frozenset[int] = frozenset()
    """Optional input positions the body ignores: a node that fills one gets no body."""
    dtypes: frozenset[ir.DataType] | None = None
    """Float types the op's schema admits for its tensors (None: any the model has)."""
    covers_call: Callable[[ir.Node], bool] | None = None
    """Whether the body computes this call, its attribute values and the optional inputs it
    fills (None: any)."""

    def function(self, overload: str, opset: int) -> ir.Function:
        """The body for `overload` as an ir.Function importing ONNX opset `opset`."""
        tape = ir.tape.Tape()
        params = [ir.Value(name=name) for name in self.inputs]
        results = list(self.bodies[overload](tape, params))
        for value, name in zip(results, self.outputs, strict=True):
            value.name = name
        imports = {"": opset} | {node.domain: 1 for node in tape.nodes if node.domain}
        graph = ir.Graph(
            params, results, nodes=tape.nodes, opset_imports=imports, name=self.op_type
        )
        return ir.Function(
            MS_DOMAIN, self.op_type, overload, graph=graph, attributes=list(self.attributes)
        )

    def covers(self, node: ir.Node) -> bool:
        """Whether a body exists for this call (its overload and number of inputs)."""
        filled = {i for i, value in enumerate(node.inputs) if value is not None}
        return (
            node.overload in self.bodies
            and self.min_inputs <= len(node.inputs) <= len(self.inputs)
            and not filled & self.uncovered_inputs
            and (self.covers_call is None or self.covers_call(node))
        )


def _float_attr(name: str, default: float) -> ir.Attr:
    return ir.Attr(name, ir.AttributeType.FLOAT, default)


def _int_attr(name: str, default: int) -> ir.Attr:
    return ir.Attr(name, ir.AttributeType.INT, default)


def _string_attr(name: str, default: str) -> ir.Attr:
    return ir.Attr(name, ir.AttributeType.STRING, default)


def _epsilon(tape: ir.tape.Tape) -> ir.Value:
    return tape.op(
        "Constant",
        [],
        {"value_float": ir.RefAttr("value_float", "epsilon", ir.AttributeType.FLOAT)},
    )


def _last_axis(tape: ir.tape.Tape) -> ir.Value:
    return tape.op("Constant", [], {"value_ints": [-1]})


def _skip_simplified_body(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    x, skip, gamma = params
    total = tape.op("Add", [x, skip])
    output = tape.op(
        "RMSNormalization",
        [total, gamma],
        {"axis": -1, "epsilon": ir.RefAttr("epsilon", "epsilon", ir.AttributeType.FLOAT)},
    )
    total32 = tape.op("Cast", [total], {"to": ir.DataType.FLOAT})
    axes = _last_axis(tape)
    mean = tape.op("ReduceMean", [total32, axes], {"keepdims": 1})
    mean_square = tape.op("ReduceMean", [tape.op("Mul", [total32, total32]), axes], {"keepdims": 1})
    inv_std_var = tape.op(
        "Reciprocal", [tape.op("Sqrt", [tape.op("Add", [mean_square, _epsilon(tape)])])]
    )
    return [output, mean, inv_std_var, total]


def _skip_layer_norm_body(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    x, skip, gamma, beta = params
    total = tape.op("Add", [x, skip])
    output, mean, inv_std_var = tape.op_multi_out(
        "LayerNormalization",
        [total, gamma, beta],
        {"axis": -1, "epsilon": ir.RefAttr("epsilon", "epsilon", ir.AttributeType.FLOAT)},
        num_outputs=3,
    )
    return [output, mean, inv_std_var, total]


def _transposed(tape: ir.tape.Tape, value: ir.Value) -> ir.Value:
    return tape.op("Transpose", [value], {"perm": [1, 0]})


def _fused_matmul_trans_a(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    a, b = params
    return [tape.op("MatMul", [_transposed(tape, a), b])]


def _fused_matmul_trans_b(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    a, b = params
    return [tape.op("MatMul", [a, _transposed(tape, b)])]


def _bias_gelu_body(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    a, b = params
    return [tape.op("Gelu", [tape.op("Add", [a, b])])]


def _fast_gelu_body(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    x, bias = params
    return [tape.op("Gelu", [tape.op("Add", [x, bias])], {"approximate": "tanh"})]


#: LinearAttention's overload → the update rule its body computes.
_LINEAR_ATTENTION_RULES = {"": "gated_delta", "gated": "gated"}


def _linear_attention_call(node: ir.Node) -> bool:
    """The bodies' form of LinearAttention: the overload's update rule (the gated delta rule
    with beta, or the gated one without it), no state window, no more query heads than value
    heads."""
    attrs = node.attributes
    rule = _LINEAR_ATTENTION_RULES[node.overload]
    beta_given = len(node.inputs) > 5 and node.inputs[5] is not None
    return (
        attrs.get_string("update_rule", "gated_delta") == rule
        and beta_given == (rule == "gated_delta")
        and attrs.get_int("state_window", 0) == 0
        and attrs.get_int("q_num_heads", 0) <= attrs.get_int("kv_num_heads", 0)
    )


def _attr_without_default(name: str) -> ir.Attr:
    """An attribute the op declares without a default (an omitted one stays omitted)."""
    return ir.Attr(name, ir.AttributeType.UNDEFINED, None)


def _separate_qkv_call(node: ir.Node) -> bool:
    """PackedMultiHeadAttention's body form: query, key and value given apart (not packed into
    a 4-D query) and no explicit scale of 0 (the op's "default" that Attention would take as
    zero)."""
    filled = [len(node.inputs) > i and node.inputs[i] is not None for i in (1, 2)]
    return all(filled) and node.attributes.get_float("scale", 1.0) != 0.0


_SKIP_NORM_OUTPUTS = ("output", "mean", "inv_std_var", "input_skip_bias_sum")
_MOE_ATTRIBUTES = (
    _int_attr("k", 1),
    ir.Attr("activation_type", ir.AttributeType.STRING, "relu"),
    _int_attr("normalize_routing_weights", 0),
    _int_attr("use_sparse_mixer", 0),
    _int_attr("swiglu_fusion", 0),
    _float_attr("swiglu_limit", math.inf),
    _float_attr("activation_alpha", 1.0),
    _float_attr("activation_beta", 0.0),
)
_QMOE_INPUTS = (
    "input",
    "router_probs",
    "fc1_experts_weights",
    "fc1_scales",
    "fc1_experts_bias",
    "fc2_experts_weights",
    "fc2_scales",
    "fc2_experts_bias",
    "fc3_experts_weights",
    "fc3_scales",
    "fc3_experts_bias",
    "fc1_zero_points",
    "fc2_zero_points",
)


def _qmoe_geglu_call(node: ir.Node) -> bool:
    """QMoE's GeGLU bodies' form: 4-bit experts, zero points for both projections or neither,
    and given exactly where the overload reads them ("geglu_unpacked" assumes 8)."""
    zero_points = [len(node.inputs) > i and node.inputs[i] is not None for i in (11, 12)]
    given = node.overload != "geglu_unpacked" and all(zero_points)
    return (
        node.attributes.get_int("expert_weight_bits", 4) == 4
        and node.attributes.get_string("activation_type", "") == "geglu"
        and (given or not any(zero_points))
        and (given or node.overload != "geglu_unpacked_zp")
    )


TIER1_OPS: Mapping[str, Tier1Op] = MappingProxyType(
    {
        op.op_type: op
        for op in (
            Tier1Op(
                "SkipSimplifiedLayerNormalization",
                inputs=("input", "skip", "gamma"),
                min_inputs=3,
                outputs=_SKIP_NORM_OUTPUTS,
                optional_outputs=frozenset({1, 2, 3}),
                attributes=(_float_attr("epsilon", _DEFAULT_EPSILON),),
                bodies={"": _skip_simplified_body},
            ),
            Tier1Op(
                "SkipLayerNormalization",
                inputs=("input", "skip", "gamma", "beta"),
                min_inputs=3,
                outputs=_SKIP_NORM_OUTPUTS,
                optional_outputs=frozenset({1, 2, 3}),
                attributes=(_float_attr("epsilon", _DEFAULT_EPSILON),),
                bodies={"": _skip_layer_norm_body},
            ),
            Tier1Op(
                "FusedMatMul",
                inputs=("A", "B"),
                min_inputs=2,
                outputs=("Y",),
                optional_outputs=frozenset(),
                attributes=(
                    _float_attr("alpha", 1.0),
                    _int_attr("transA", 0),
                    _int_attr("transB", 0),
                    _int_attr("transBatchA", 0),
                    _int_attr("transBatchB", 0),
                ),
                bodies={"transA": _fused_matmul_trans_a, "transB": _fused_matmul_trans_b},
            ),
            Tier1Op(
                "BiasGelu",
                inputs=("A", "B"),
                min_inputs=2,
                outputs=("C",),
                optional_outputs=frozenset(),
                attributes=(),
                bodies={"": _bias_gelu_body},
            ),
            Tier1Op(
                "FastGelu",
                inputs=("X", "bias"),
                min_inputs=2,
                outputs=("Y",),
                optional_outputs=frozenset(),
                attributes=(),
                bodies={"": _fast_gelu_body},
            ),
            Tier1Op(
                "MoE",
                inputs=(
                    "input",
                    "router_probs",
                    "fc1_experts_weights",
                    "fc1_experts_bias",
                    "fc2_experts_weights",
                    "fc2_experts_bias",
                ),
                min_inputs=5,
                outputs=("output",),
                optional_outputs=frozenset(),
                attributes=_MOE_ATTRIBUTES,
                bodies={
                    "": moe_bodies.moe,
                    "bias": moe_bodies.moe_biased,
                    "geglu": moe_bodies.moe_geglu,
                },
            ),
            Tier1Op(
                "QMoE",
                inputs=_QMOE_INPUTS,
                min_inputs=7,
                outputs=("output",),
                optional_outputs=frozenset(),
                attributes=(
                    *_MOE_ATTRIBUTES,
                    _int_attr("expert_weight_bits", 4),
                    _attr_without_default("block_size"),
                    _int_attr("accuracy_level", 0),
                ),
                bodies={
                    "geglu": moe_bodies.qmoe_geglu,
                    "geglu_unpacked": moe_bodies.qmoe_geglu_unpacked,
                    "geglu_unpacked_zp": moe_bodies.qmoe_geglu_unpacked_zp,
                },
                uncovered_inputs=frozenset({4, 7, 8, 9, 10}),
                covers_call=_qmoe_geglu_call,
            ),
            Tier1Op(
                "CausalConvWithState",
                inputs=("input", "weight", "bias", "past_state"),
                min_inputs=4,
                outputs=("output", "present_state"),
                optional_outputs=frozenset(),
                attributes=(_int_attr("ndim", 1), _string_attr("activation", "none")),
                bodies={
                    "": recurrent_bodies.causal_conv,
                    "silu": recurrent_bodies.causal_conv_silu,
                },
                uncovered_inputs=frozenset({2}),
            ),
            Tier1Op(
                "LinearAttention",
                inputs=("query", "key", "value", "past_state", "decay", "beta"),
                min_inputs=5,
                outputs=("output", "present_state"),
                optional_outputs=frozenset(),
                attributes=(
                    _attr_without_default("q_num_heads"),
                    _attr_without_default("kv_num_heads"),
                    _string_attr("update_rule", "gated_delta"),
                    _float_attr("scale", 0.0),
                    _int_attr("chunk_size", 64),
                    _int_attr("state_window", 0),
                ),
                bodies={"": recurrent_bodies.gated_delta, "gated": recurrent_bodies.gated},
                covers_call=_linear_attention_call,
            ),
            Tier1Op(
                "PackedMultiHeadAttention",
                inputs=(
                    "query",
                    "key",
                    "value",
                    "bias",
                    "token_offset",
                    "cumulative_sequence_length",
                    "attention_bias",
                ),
                min_inputs=6,
                outputs=("output",),
                optional_outputs=frozenset(),
                attributes=(
                    _attr_without_default("num_heads"),
                    _attr_without_default("scale"),
                    _float_attr("mask_filter_value", -10000.0),
                ),
                bodies={"": attention_bodies.packed_multi_head_attention},
                dtypes=frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16}),
                uncovered_inputs=frozenset({3, 6}),
                covers_call=_separate_qkv_call,
            ),
        )
    }
)


#: MoE overloads whose experts int4 stores in 4 bits on every EP, in a QMoE body (no kernel
#: takes them): the pipeline leaves them to quantize/qmoe.py when int4 is asked.
INT4_MOE_OVERLOADS = frozenset({"geglu"})


def left_for_int4(op_type: str, domain: str, overload: str) -> bool:
    """An op whose experts int4 quantizes before it is expanded: an `INT4_MOE_OVERLOADS` MoE,
    which the pipeline leaves to quantize/qmoe.py when int4 is asked."""
    return domain == MS_DOMAIN and op_type == "MoE" and overload in INT4_MOE_OVERLOADS


def expanded_after_int4(function: ir.Function) -> bool:
    """Whether int4 expands `function` once it has quantized the experts: a MoE the pipeline
    left (`left_for_int4`; block sizes QMoE cannot take leave it float), or a QMoE body (all
    of them GeGLU ones, which no kernel takes)."""
    qmoe = function.domain == MS_DOMAIN and function.name == "QMoE"
    return qmoe or left_for_int4(function.name, function.domain, function.overload)


def expand_after_int4(model: ir.Model) -> None:
    """Expand every function of `model` that `expanded_after_int4` names: after int4 quantized
    the experts (their QMoE bodies registered), or when a graph built for int4 is saved
    without it (its GeGLU experts then stay float)."""
    if any(expanded_after_int4(function) for function in model.functions.values()):
        common.InlinePass(criteria=expanded_after_int4)(model)
        common.RemoveUnusedFunctionsPass()(model)


def needs_inlining(function: ir.Function, caps: EpCapabilities) -> bool:
    """Stage 2b criterion: expand a custom-domain function whose op the EP cannot run, or whose
    overload is a kernel of its own (ep/kernels.py's "Op.overload" rows) that the EP lacks."""
    overload = f"{function.name}.{function.overload}"
    lacks_overload = bool(function.overload) and overload in KERNELS
    lacks_overload = lacks_overload and not caps.kernel_dtypes(overload)
    return lacks_overload or not ep_runs(caps, function.name, function.domain)


def _default_opset(model: ir.Model) -> int:
    version = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if version is None:
        raise ValueError("the model imports no ONNX standard opset")
    return version


def register_functions(model: ir.Model) -> list[ir.OperatorIdentifier]:
    """Register the body of every Tier-1 op the main graph calls and the model lacks.

    Returns the identifiers added. Calls no body covers (another overload, extra inputs) are
    left as they are.
    """
    added: list[ir.OperatorIdentifier] = []
    opset: int | None = None
    for node in model.graph.all_nodes():
        if node.domain != MS_DOMAIN or node.op_type not in TIER1_OPS:
            continue
        identifier = node.op_identifier()
        spec = TIER1_OPS[node.op_type]
        if identifier in model.functions or not spec.covers(node):
            continue
        if opset is None:
            opset = _default_opset(model)
            model.opset_imports.setdefault(MS_DOMAIN, 1)
        model.functions[identifier] = spec.function(node.overload, opset)
        added.append(identifier)
    return added


class DropUnusedOptionalOutputsPass(ir.passes.InPlacePass):
    """Name the unread optional outputs of Tier-1 ops "" (absent), except the last one.

    The com.microsoft counterpart of what RemoveUnusedNodesPass does for standard ops (it only
    knows ONNX schemas): onnxruntime then skips those outputs, and an inlined body loses the
    nodes that computed them. The last output keeps its name so the serialized node keeps as
    many outputs as its function declares (trailing empty outputs are not written, and ONNX
    function inference, e.g. onnx.checker's full check, fails on a call with fewer outputs).
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        graph_outputs = frozenset(model.graph.outputs)
        for node in model.graph.all_nodes():
            spec = TIER1_OPS.get(node.op_type) if node.domain == MS_DOMAIN else None
            if spec is None:
                continue
            for index, output in enumerate(node.outputs[:-1]):
                if (
                    index in spec.optional_outputs
                    and output.name
                    and not output.uses()
                    and output not in graph_outputs
                ):
                    output.name = ""
                    modified = True
        return ir.passes.PassResult(model, modified)
