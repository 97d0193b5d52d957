"""LoRA branches: y = x @ W + (x @ A) @ B, with A and B graph inputs og's adapters feed.

onnxruntime-genai 0.18's `og.Adapters` binds an adapter's parameters by name as extra graph
inputs of the decoder session (`generator.set_active_adapter`). Each LoRA input therefore has
a default initializer of size 0 on the rank axis: with no adapter active ``x @ A`` is
[..., 0] and ``(x @ A) @ B`` is zeros, so the graph is the base model; one graph serves every
rank because the rank axis is symbolic, one axis per projection (`PROJECTION.lora_rank`:
onnxruntime plans buffers by axis name, so one name shared by projections of different ranks,
as PEFT's rank_pattern gives, fails at run time). A holds PEFT's ``lora_A.weight`` transposed ([in, r]),
B its ``lora_B.weight`` transposed ([r, out]) times the adapter's scale (alpha / r), which the
adapter file carries: the graph applies no scale of its own (as og's builder, which multiplies
lora_B by PEFT's scaling).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai._graph_keys import LORA_A, LORA_B, LORA_RANK
from mobius_genai.components.linear import Linear
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.errors import ConfigError


def lora_input_names(module_name: str) -> tuple[str, str]:
    """The graph inputs of the LoRA branch of the projection `module_name` (its graph name)."""
    return f"{module_name}.{LORA_A}", f"{module_name}.{LORA_B}"


class LoraBranch(nn.Module):
    """(x @ A) @ B for one projection; A [in, r] and B [r, out] are graph inputs whose
    defaults are empty (r = 0), so the branch adds zeros until an adapter is active. A
    projection called more than once (a block shared by several layers: Zamba2's) reads the
    same two inputs each time, as PEFT wraps the one module they share."""

    def __init__(self, module_name: str, in_features: int, out_features: int) -> None:
        super().__init__()
        self.names = lora_input_names(module_name)
        self.rank_axis = f"{module_name}.{LORA_RANK}"
        self.in_features = in_features
        self.out_features = out_features
        self.inputs: tuple[ir.Value, ir.Value] | None = None

    def _input(self, op, name: str, shape: list[int | str]) -> ir.Value:
        dtype = get_build_dtype()
        empty = [0 if dim == self.rank_axis else dim for dim in shape]
        default = ir.tensor(np.zeros(empty, dtype=dtype.numpy()), name=name)
        value = op.builder.input(name, const_value=default)
        value.shape = ir.Shape(shape)  # the rank axis symbolic, the default empty
        return value

    def forward(self, op, x: ir.Value) -> ir.Value:
        if self.inputs is None:
            name_a, name_b = self.names
            a = self._input(op, name_a, [self.in_features, self.rank_axis])
            b = self._input(op, name_b, [self.rank_axis, self.out_features])
            self.inputs = (a, b)
        a, b = self.inputs
        return op.MatMul(op.MatMul(x, a), b)


def add_lora(module: nn.Module, targets: Collection[str]) -> list[str]:
    """Give each projection of the decoder layers named in `targets` (PEFT's
    ``target_modules``: q_proj, gate_proj, ...) a LoRA branch; returns the graph names of the
    projections that got one. A target no projection of the layers has is a ConfigError."""
    chosen = []
    found = set()
    for name, sub in module.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(sub, Linear) and leaf in targets and ".layers." in f".{name}":
            sub.lora = LoraBranch(name, sub.in_features, sub.out_features)
            chosen.append(name)
            found.add(leaf)
    missing = sorted(set(targets) - found)
    if missing:
        present = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, sub in module.named_modules()
                if isinstance(sub, Linear) and ".layers." in f".{name}"
            }
        )
        raise ConfigError(
            f"LoRA target modules {missing} are not projections of this model's layers; "
            f"accepted: {present}"
        )
    return chosen
