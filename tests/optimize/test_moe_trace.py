"""The MoE rule in the optimization trace and its summary, like every other rule group.

EPs whose capabilities say `supports_fused_moe` keep the com.microsoft::MoE nodes the MoE block
emits (the trace line and summary row count them); the others name the missing capability under
"not for this target" and InlinePass expands the nodes into their standard bodies.
"""

from __future__ import annotations

import pytest

import mobius_genai
from tests._hf import write_tiny_checkpoint

NAME_WIDTH = 26


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe_trace")
    return {
        family: write_tiny_checkpoint(tmp / family, family) for family in ("qwen3_moe", "phimoe")
    }


def _report(checkpoints, family: str, ep: str):
    package = mobius_genai.build(checkpoints[family], ep, "f32", load_weights=False, progress=False)
    return package.reports["model"]


@pytest.mark.parametrize(("family", "nodes"), [("qwen3_moe", 2), ("phimoe", 6)])
@pytest.mark.parametrize("ep", ["default", "cpu"])
def test_fused_moe_has_its_trace_line_and_summary_row(checkpoints, family, nodes, ep):
    report = _report(checkpoints, family, ep)
    assert report.matches["MoE"] == nodes
    assert f"  {'MoE':<{NAME_WIDTH}}: kept {nodes} MoE (the EP's fused kernel)" in (
        report.trace_lines
    )
    summary = report.trace_lines[report.trace_lines.index("Summary:") + 1 :]
    assert f"  {'MoE':<{NAME_WIDTH}}| {nodes:>7} |      0 |      0" in summary
    assert report.matches["InlinePass"] == 0


@pytest.mark.parametrize(
    ("ep", "reason"),
    [("cuda", "supports_fused_moe=False"), ("onnx-standard", "supports_custom_ops=False")],
)
def test_declined_moe_names_the_capability_and_is_inlined(checkpoints, ep, reason):
    report = _report(checkpoints, "qwen3_moe", ep)
    assert "MoE" not in report.rules
    assert report.skipped["MoE"] == reason
    (line,) = [
        line for line in report.trace_lines if "not for this target" in line and "MoE" in line
    ]
    assert f"MoE ({reason})" in line
    assert report.rules["InlinePass"].removed["MoE"] == 2


def test_a_dense_model_shows_the_moe_rule_without_matches(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "llama")
    report = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False).reports["model"]
    assert report.matches["MoE"] == 0
    assert f"  {'MoE':<{NAME_WIDTH}}: no matches (0 nodes affected)" in report.trace_lines
