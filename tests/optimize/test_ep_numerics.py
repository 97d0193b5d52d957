"""EP graphs vs transformers: a 12-token prefill and 4 cached decode steps, batch 2.

The cpu graph (GroupQueryAttention, f32) and the onnx-standard graph (standard ONNX only, f32)
of each family must match transformers within 1e-4 (max abs logit difference over every
call). The f16 graphs of the GPU EPs cannot run on their EP here, but ORT CPU runs every op they
use, so they are checked loosely (F16_TOLERANCE) for the math the rewrites keep: window, biases,
q/k norm, packing, separate rotary, shape elimination.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import mobius_genai
from tests._hf import ReferenceRun, hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.optimize._graphs import custom_domains, op_counts

TOLERANCE = 1e-4  # f32, max abs diff of logits over prefill and every decode step
# f16 weights and activations: measured 0.012-0.034 for these graphs and for the portable f16
# graph alike; a misplaced window, rotation or bias is off by whole units.
F16_TOLERANCE = 0.1
LAYERS = 3  # tests/_hf.py's tiny checkpoints

FAMILIES = {
    "llama": ("llama", {}),
    "mistral_sliding_window_5": ("mistral", {"sliding_window": 5}),  # window < 12 tokens
    "qwen2_biases": ("qwen2", {}),
    "qwen3_qk_norm_head_dim_32": ("qwen3", {}),
}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Callable[[str], tuple[Path, ReferenceRun]]:
    """case → (checkpoint, transformers run), each made once per module."""
    made: dict[str, tuple[Path, ReferenceRun]] = {}

    def get(case: str) -> tuple[Path, ReferenceRun]:
        if case not in made:
            family, overrides = FAMILIES[case]
            ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp(case), family, seed=1, **overrides)
            ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
            made[case] = ckpt, hf_reference_logits(ckpt, ids, decode_steps=4)
        return made[case]

    return get


def _logits(ckpt: Path, ep: str, dtype: str, directory: Path, run: ReferenceRun):
    package = mobius_genai.build(ckpt, ep, dtype)
    model = package["model"]
    return model, run_like_reference(ort_session(package, directory), run)


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_cpu_gqa_graph_matches_transformers(references, case, tmp_path):
    ckpt, run = references(case)
    model, logits = _logits(ckpt, "cpu", "f32", tmp_path, run)
    counts = op_counts(model)
    assert counts["GroupQueryAttention"] == LAYERS and counts["Attention"] == 0
    assert "position_ids" not in [value.name for value in model.graph.inputs]
    assert max_abs_diff(logits, run.logits) <= TOLERANCE


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_onnx_standard_graph_matches_transformers(references, case, tmp_path):
    ckpt, run = references(case)
    model, logits = _logits(ckpt, "onnx-standard", "f32", tmp_path, run)
    assert custom_domains(model) == set()
    assert op_counts(model)["Attention"] == LAYERS
    assert max_abs_diff(logits, run.logits) <= TOLERANCE


F16_EPS = ("cuda", "dml", "webgpu", "mlx", "trt-rtx")
# The default run covers every f16 EP graph on the sliding-window family; -m slow adds the rest.
F16_CASES = [
    pytest.param(
        case,
        ep,
        marks=() if case.startswith("mistral") else pytest.mark.slow,
        id=f"{case}-{ep}",
    )
    for case in sorted(FAMILIES)
    for ep in F16_EPS
]


@pytest.mark.parametrize(("case", "ep"), F16_CASES)
def test_f16_gqa_graphs_match_transformers_loosely(references, case, ep, tmp_path):
    ckpt, run = references(case)
    model, logits = _logits(ckpt, ep, "f16", tmp_path, run)
    assert op_counts(model)["GroupQueryAttention"] == LAYERS
    assert max_abs_diff(logits, run.logits) <= F16_TOLERANCE
