"""Rows checked on the targets their parity tests do not run: the GPU EPs' graphs (cuda, dml,
webgpu: built here without a GPU, GroupQueryAttention in every layer, no ONNX Attention left)
and a cpu int4 bundle (MatMulNBits, QMoE for experts) that onnxruntime-genai generates with.
Slow: `pytest -m slow tests/models/families/test_rows_on_targets.py`.
"""

from __future__ import annotations

from collections import Counter

import pytest

import mobius_genai
from mobius_genai.models import FAMILIES
from tests._bundles import int4_bundle_ops
from tests._hf import write_tiny_checkpoint

ROWS = (
    "iquestcoder",
    "param2moe",
    "sarvam_moe",
    "sarvam_mla",
    "apertus1p5_text",
    "aria_text",
    "youtu",
    "cohere_compass_text",
)
#: Rows whose int4 bundle's greedy continuation of the bundle tests' prompt stops at eos
#: early (tiny random weights): their ops are checked, not the length
_EARLY_EOS = {"cohere_compass_text"}


@pytest.mark.slow
@pytest.mark.parametrize("family", ROWS)
def test_gpu_graphs_run_group_query_attention(family, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    for ep in ("cuda", "dml", "webgpu"):
        graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False)["model"].graph
        ops = Counter(node.op_type for node in graph)
        assert ops["GroupQueryAttention"] == 3 and not ops["Attention"], (ep, ops)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in ROWS if f not in _EARLY_EOS])
def test_cpu_int4_bundle_generates(family, tmp_path):
    ops = int4_bundle_ops(family, tmp_path)
    assert ops["MatMulNBits"] > 0
    assert (ops["QMoE"] > 0) == (FAMILIES[family].experts is not None)
