"""INT4 MoE experts: com.microsoft::MoE → com.microsoft::QMoE, each expert quantized block-wise.

onnxruntime 1.32's QMoE (`quant_type="int"`, `expert_weight_bits=4`, `block_size` along the
input features, raw layout `weights_prepacked` unset) reads per expert exactly MatMulNBits'
arrays of the [N, K] matrix (layout.py): `fc1_experts_weights` [E, 2I, H/2] uint8 (gate and up
rows interleaved as in the MoE node, two 4-bit values per byte, the first in the low nibble),
`fc1_scales` [E, 2I, H/bs] in the model dtype, `fc1_zero_points` [E, 2I, ceil(H/bs/2)] uint8
(absent when symmetric: zero point 8); `fc2_*` alike for the [E, H, I] down projections.
Measured: the CPU kernel's output equals the MoE of the dequantized experts to fp32 noise
(tests/quantize/test_qmoe.py). Routing attributes are copied from the MoE node, so a sparsemixer
layer's two k=1 nodes become two QMoE nodes sharing one quantized copy of the experts.

Gemma 4's GeGLU experts (the MoE node's "geglu" overload, which no kernel takes) become a
QMoE node of a GeGLU overload (components/moe_bodies.py) that every EP then expands: "geglu"
dequantizes the picked experts with GatherBlockQuantized where the plan has that kernel
(`gather`), "geglu_unpacked" / "geglu_unpacked_zp" with standard ops elsewhere. The same arrays
as QMoE's. Where the EP's "MatMulNBits.experts" row says so (`per_expert`: cpu), each expert's
arrays are initializers of their own instead, in MatMulNBits' layout (the same integers), read
by a MatMulNBits per expert and projection (moe_bodies' `qmoe_geglu_per_expert`, written in the
MoE node's place): onnxruntime prepacks constant codes, and GatherBlockQuantized was 80% of a
decode step (benchmarks/README.md's MoE-body section). Their per-expert scale (the down
projections fed as `Mul(experts, factor [E, 1, 1])`, components/stack_experts.py) is folded
into the down projection's block scales, expert by expert: (q - zp) * scale * factor[e] is the
scaled weight exactly, the codes being those of the unscaled one.

Streaming: each quantized tensor is a `QuantizedExperts` whose bytes are produced one expert at
a time when the model is saved (`chunks()`), quantizing that expert's float matrix read from the
checkpoint (`ExpertsTensor.expert`), so a layer's experts are never all in memory. Each expert
is quantized once for all its arrays.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np
import onnx_ir as ir

from mobius_genai.components import moe_bodies
from mobius_genai.components.tier1 import INT4_MOE_OVERLOADS, MS_DOMAIN
from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.layout import NBitsWeight, quantize_matmul_nbits

__all__ = ["QMoEPass", "QuantizedExperts"]

_BITS = 4
_PARTS = ("packed", "scales", "zero_points")
# MoE input position → QMoE input position (QMoE puts each projection's scales after it)
_WEIGHT, _BIAS = {2: 2, 4: 5}, {3: 4, 5: 7}
_ZERO_POINTS = {2: 11, 4: 12}
_QMOE_INPUTS = 13


@dataclasses.dataclass
class _ExpertQuantizer:
    """Quantizes expert `e` of a stacked [E, N, K] float tensor to MatMulNBits' arrays.

    Each expert is read and quantized once: the QMoE arrays are separate tensors saved one
    after another, so the parts of an expert not asked for yet are kept until they are (the
    scales and zero points of every expert of the tensor while its packed codes are written:
    a quarter of the codes' bytes with float32 scales of blocks of 32).
    """

    source: ir.TensorProtocol
    block_size: int
    symmetric: bool
    search: bool
    factors: np.ndarray | None = None
    """A factor per expert its scales are multiplied by (None: none)."""
    _pending: dict[tuple[int, str], np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def parts(self) -> tuple[str, ...]:
        """The arrays written: zero points only for asymmetric codes."""
        return tuple(part for part in _PARTS if not (part == "zero_points" and self.symmetric))

    def dtype(self, part: str) -> ir.DataType:
        """Array `part`'s dtype: the source's for the scales, else uint8."""
        return self.source.dtype if part == "scales" else ir.DataType.UINT8

    def arrays(self, initializer: Callable[[str], ir.Value]) -> list[ir.Value | None]:
        """`initializer(part)` of each of _PARTS written, None for those not (symmetric
        codes' zero points)."""
        return [initializer(part) if part in self.parts else None for part in _PARTS]

    def part(self, expert: int, part: str) -> np.ndarray:
        """Array `part` (packed, scales or zero_points) of expert `expert`."""
        kept = self._pending.pop((expert, part), None)
        if kept is not None:
            return kept
        weight = self(expert)
        for other in self.parts:
            if other != part:
                self._pending[(expert, other)] = getattr(weight, other)
        return getattr(weight, part)

    def __call__(self, expert: int) -> NBitsWeight:
        read: Callable[[int], np.ndarray] | None = getattr(self.source, "expert", None)
        matrix = read(expert) if read is not None else self.source.numpy()[expert]  # [N, K]
        weight = quantize_matmul_nbits(
            matrix.T, self.block_size, self.symmetric, search=self.search
        )
        if self.factors is None:
            return weight
        scales = weight.scales.astype(np.float32) * np.float32(self.factors[expert])
        return dataclasses.replace(weight, scales=scales.astype(weight.scales.dtype))


class QuantizedExperts(ir.LazyTensor):
    """One of the QMoE arrays (`part`: packed, scales or zero_points) of a stacked expert
    tensor, computed one expert at a time."""

    def __init__(self, quantize: _ExpertQuantizer, part: str, name: str) -> None:
        experts, n, k = (int(d) for d in quantize.source.shape)
        blocks = k // quantize.block_size
        shape = {
            "packed": (experts, n, k * _BITS // 8),
            "scales": (experts, n, blocks),
            "zero_points": (experts, n, -(-blocks * _BITS // 8)),
        }[part]
        dtype = quantize.dtype(part)
        super().__init__(self._load, dtype=dtype, shape=ir.Shape(shape), name=name)
        self._quantize, self._part = quantize, part

    def chunks(self) -> Iterator[np.ndarray]:
        """Each expert's array, in order (the tensor's bytes, an expert at a time)."""
        rows = tuple(int(d) for d in self.shape[1:])
        for expert in range(int(self.shape[0])):
            array = self._quantize.part(expert, self._part)
            yield np.ascontiguousarray(array.reshape(rows), dtype=self.dtype.numpy())

    def _load(self) -> ir.TensorProtocol:
        return ir.Tensor(np.stack(list(self.chunks())), dtype=self.dtype, name=self.name)

    def tofile(self, file: BinaryIO) -> None:
        for array in self.chunks():
            file.write(array.tobytes())


class QMoEPass(ir.passes.InPlacePass):
    """Replace each com.microsoft::MoE node whose experts are initializers by a QMoE node: all
    of them where the EP has QMoE (`kernel`), else only GeGLU ones (tier1's
    `INT4_MOE_OVERLOADS`, the node's overload "geglu": a body every EP expands; `gather`: with
    GatherBlockQuantized; `per_expert`: as a MatMulNBits per expert, in place).

    `declined` lists (node, reason) for MoE nodes left float; `quantized` the stacked expert
    values replaced, each once (name, experts, n, k, the op type that now reads them).
    """

    def __init__(
        self,
        block_size: int,
        symmetric: bool,
        search: bool,
        accuracy_level: int,
        *,
        kernel: bool = True,
        gather: bool = True,
        per_expert: bool = False,
    ):
        super().__init__()
        self.block_size, self.symmetric, self.search = block_size, symmetric, search
        self.accuracy_level = accuracy_level
        self.kernel, self.gather, self.per_expert = kernel, gather, per_expert
        self.declined: list[tuple[str, str]] = []
        self.quantized: list[tuple[str, int, int, int, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        writer = GraphWriter(graph)
        done: dict[ir.Value, list[ir.Value | None]] = {}
        modified = False
        for node in list(graph):
            if node.domain != MS_DOMAIN or node.op_type != "MoE":
                continue
            overload = self._overload(node)
            if overload is None:
                continue
            reason = self._refusal(node)
            if reason is not None:
                self.declined.append((node.name or "", reason))
                continue
            if overload and self.per_expert:
                writer.replace(node, self._per_expert_nodes(graph, node, done))
                modified = True
                continue
            reader = "QMoE" if not overload else _READERS[self.gather]
            inputs: list[ir.Value | None] = [None] * _QMOE_INPUTS
            inputs[0], inputs[1] = node.inputs[0], node.inputs[1]
            for position, target in _WEIGHT.items():
                weight = node.inputs[position]
                if weight not in done:
                    done[weight] = self._initializers(graph, weight, reader)
                packed, scales, zero_points = done[weight]
                inputs[target], inputs[target + 1] = packed, scales
                inputs[_ZERO_POINTS[position]] = zero_points
            for position, target in _BIAS.items():
                if position < len(node.inputs):
                    inputs[target] = node.inputs[position]
            while inputs[-1] is None:
                inputs.pop()
            attributes = [*node.attributes.values(), *self._attributes()]
            qmoe = ir.Node(MS_DOMAIN, "QMoE", inputs, attributes, overload=overload, name=node.name)
            writer.replace(node, [qmoe])
            modified = True
        writer.remove_unused()
        return ir.passes.PassResult(model, modified)

    def _overload(self, node: ir.Node) -> str | None:
        """The QMoE overload `node` becomes ("" for the kernel), None to leave it as it is."""
        if node.overload in INT4_MOE_OVERLOADS:
            if self.gather:
                return "geglu"
            return "geglu_unpacked" if self.symmetric else "geglu_unpacked_zp"
        return "" if self.kernel else None

    def _attributes(self) -> list[ir.Attr]:
        values = {
            "expert_weight_bits": _BITS,
            "block_size": self.block_size,
            "accuracy_level": self.accuracy_level,
        }
        return [ir.Attr(key, ir.AttributeType.INT, value) for key, value in values.items()]

    def _refusal(self, node: ir.Node) -> str | None:
        for position in _WEIGHT:
            weight = node.inputs[position] if position < len(node.inputs) else None
            stacked = None if weight is None else _scaled_experts(weight)[0]
            if stacked is None or stacked.const_value is None or stacked.shape is None:
                return f"input {position} is not a stacked expert initializer"
            k = stacked.shape[2]
            if not isinstance(k, int) or k % self.block_size:
                return (
                    f"{stacked.name}: input features {k} are not a multiple of the int4 block "
                    f"size {self.block_size} (QMoE needs whole blocks)"
                )
        return None

    def _per_expert_nodes(
        self, graph: ir.Graph, node: ir.Node, done: dict[ir.Value, list]
    ) -> list[ir.Node]:
        """The GeGLU MoE `node` as a MatMulNBits per expert and projection (moe_bodies'
        `qmoe_geglu_per_expert`), each expert's arrays initializers of their own."""
        projections = []
        for position in _WEIGHT:
            weight = node.inputs[position]
            if weight not in done:
                done[weight] = self._expert_initializers(graph, weight, position == 2)
            projections.append(done[weight])
        tape = ir.tape.Tape()
        routing = (
            node.attributes.get_int("k", 1),
            node.attributes.get_int("normalize_routing_weights", 0),
        )
        attributes = {"block_size": self.block_size}
        if self.accuracy_level:  # 0 is the default: left out, as for the dense MatMulNBits
            attributes["accuracy_level"] = self.accuracy_level
        experts = list(zip(*projections, strict=True))
        x, router = node.inputs[0], node.inputs[1]
        assert x is not None and router is not None  # MoE's required inputs
        moe_bodies.qmoe_geglu_per_expert(tape, x, router, experts, routing, attributes)
        return list(tape.nodes)

    def _expert_initializers(
        self, graph: ir.Graph, weight: ir.Value, gate_and_up: bool
    ) -> list[tuple]:
        """Per expert of `weight`, its MatMulNBits (codes, scales, zero points or None); with
        `gate_and_up`, the interleaved gate and up rows put gate rows first, then up rows (each
        row is quantized on its own: the same integers, reordered)."""
        stacked, source, quantize = self._quantizer(weight, "MatMulNBits")
        experts, n, k = (int(d) for d in source.shape)
        order = np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)]) if gate_and_up else None
        blocks = k // self.block_size
        shapes = {
            "packed": (n, blocks, self.block_size * _BITS // 8),
            "scales": (n, blocks),
            "zero_points": (n, -(-blocks * _BITS // 8)),
        }

        def initializer(expert: int, part: str) -> ir.Value:
            name = _name(f"{stacked}_e{expert}", part)
            tensor = _ExpertPart(quantize, (expert, order), part, shapes[part], name)
            return _initializer(graph, tensor)

        return [
            tuple(quantize.arrays(functools.partial(initializer, expert)))
            for expert in range(experts)
        ]

    def _quantizer(
        self, weight: ir.Value, reader: str
    ) -> tuple[str, ir.TensorProtocol, _ExpertQuantizer]:
        """The name and tensor of the stacked experts `weight` reads, and their quantizer;
        notes them in `quantized`."""
        stacked, factors = _scaled_experts(weight)
        assert stacked is not None and stacked.const_value is not None  # _refusal checked
        source = stacked.const_value
        quantize = _ExpertQuantizer(
            source, self.block_size, self.symmetric, self.search, factors=factors
        )
        experts, n, k = (int(d) for d in source.shape)
        self.quantized.append((stacked.name or "", experts, n, k, reader))
        return stacked.name or "", source, quantize

    def _initializers(
        self, graph: ir.Graph, weight: ir.Value, reader: str
    ) -> list[ir.Value | None]:
        stacked, _, quantize = self._quantizer(weight, reader)
        return quantize.arrays(
            lambda part: _initializer(graph, QuantizedExperts(quantize, part, _name(stacked, part)))
        )


class _ExpertPart(ir.LazyTensor):
    """Array `part` of one expert in MatMulNBits' layout (`shape`), its rows in `order` (None:
    as they are), quantized when saved."""

    def __init__(
        self,
        quantize: _ExpertQuantizer,
        rows: tuple[int, np.ndarray | None],
        part: str,
        shape: tuple,
        name: str,
    ) -> None:
        dtype = quantize.dtype(part)
        expert, order = rows

        def load() -> ir.TensorProtocol:
            array = quantize.part(expert, part)
            array = (array if order is None else array[order]).reshape(shape)
            return ir.Tensor(np.ascontiguousarray(array, dtype=dtype.numpy()), name=name)

        super().__init__(load, dtype=dtype, shape=ir.Shape(shape), name=name)


def _name(base: str, part: str) -> str:
    """The initializer name of array `part` of the experts named `base`."""
    return f"{base}_Q4" if part == "packed" else f"{base}_{part}"


def _initializer(graph: ir.Graph, tensor: ir.TensorProtocol) -> ir.Value:
    """`tensor` as an initializer of `graph` (named as the tensor)."""
    value = ir.Value(name=tensor.name, shape=tensor.shape, type=ir.TensorType(tensor.dtype))
    value.const_value = tensor
    graph.register_initializer(value)
    return value


#: Whether the EP has GatherBlockQuantized → the op reading the GeGLU experts' codes.
_READERS = {True: "GatherBlockQuantized", False: "Gather"}


def _scaled_experts(value: ir.Value) -> tuple[ir.Value | None, np.ndarray | None]:
    """The stacked experts `value` is, and the factor per expert it multiplies them by: an
    initializer itself (no factor), or `Mul(initializer [E, N, K], f)` with `f` [E, 1, 1] a
    constant or the Reshape of one (Gemma 4's per_expert_scale). (None, None) otherwise."""
    if value.const_value is not None:
        return value, None
    node = value.producer()
    if node is None or node.op_type != "Mul" or node.domain not in ("", "ai.onnx"):
        return None, None
    stacked, factor = node.inputs
    experts = stacked.shape[0] if stacked is not None and stacked.shape is not None else None
    if stacked is None or stacked.const_value is None or factor is None:
        return None, None
    if factor.shape is None or tuple(factor.shape) != (experts, 1, 1):
        return None, None
    source = factor.producer()
    if factor.const_value is None and source is not None and source.op_type == "Reshape":
        factor = source.inputs[0]
    if factor is None or factor.const_value is None or factor.const_value.size != experts:
        return None, None
    return stacked, factor.const_value.numpy().reshape(-1).astype(np.float32)
