"""LoRA branches (components/lora.py) do not block the EP fusions: the same GQA, PackQKV and
SkipNorm rewrites as the base graph, on cpu (fp32) and cuda (fp16) graphs.

The trace with LoRA on every projection of the tiny Qwen2 (two layers) shows
``PackQKV : +2 Concat, -8 Add, -4 MatMul``: per layer, q/k/v's MatMuls and bias Adds become
one each, and the three LoRA deltas are concatenated and added after the packed projection
(which int4 then quantizes as one MatMulNBits: tests/adapters/test_lora_bundle.py).
"""

from __future__ import annotations

import pytest

from mobius_genai.build import build
from tests.adapters.conftest import PROJECTIONS
from tests.conftest import TINY_QWEN2


def _report(ep: str, targets):
    package = build(
        TINY_QWEN2,
        ep,
        load_weights=False,
        lora_targets=targets,
        progress=False,
        trace_optimization=True,
    )
    return package["model"], package.reports["model"]


@pytest.mark.parametrize("ep", ["cpu", "cuda"])
def test_lora_keeps_the_base_fusions(ep):
    _, base = _report(ep, ())
    model, lora = _report(ep, PROJECTIONS)
    assert lora.matches == base.matches
    assert {rule for rule, count in lora.matches.items() if count} >= {
        "GQAFusion",
        "PackQKV",
        "SkipNorm",
    }
    packed = [
        line for line in lora.trace_lines if line.strip().startswith("PackQKV ") and ":" in line
    ]
    assert packed == ["  PackQKV                   : +2 Concat, -8 Add, -4 MatMul"]
    # the packed query: (x @ Wqkv + b) + Concat(q, k, v deltas), each delta a LoRA branch
    for node in model.graph:
        if node.op_type == "GroupQueryAttention":
            query = node.inputs[0].producer()
            assert query.op_type == "Add"
            deltas = query.inputs[1].producer()
            assert deltas.op_type == "Concat" and len(deltas.inputs) == 3
            for delta in deltas.inputs:
                b = delta.producer().inputs[1]
                assert b.is_graph_input() and b.name.endswith(".lora_B")
            assert node.inputs[1] is None and node.inputs[2] is None


def test_lora_inputs_only_for_the_targets():
    model, _ = _report("cpu", ["q_proj", "down_proj"])
    names = sorted(v.name for v in model.graph.inputs if "lora" in v.name)
    assert names == [
        f"model.layers.{i}.{module}.{part}"
        for i in range(2)
        for module in ("mlp.down_proj", "self_attn.q_proj")
        for part in ("lora_A", "lora_B")
    ]
