"""FusedMatMul (MatMul of a transposed 2-D operand → com.microsoft FusedMatMul): graph and ORT."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.rules import fused_matmul
from tests.optimize._graphs import (
    clone,
    decline_reasons,
    op_counts,
    parse,
    random_feeds,
    rewrite,
    run,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-5  # f32, max abs diff before vs after

TRANSPOSED_B = """
agraph (float[2,5,8] h, float[16,8] table) => (float[2,5,16] y) {
    t = Transpose<perm=[1, 0]>(table)
    y = MatMul(h, t)
}
"""

TRANSPOSED_A = """
agraph (float[8,5] a, float[8,3] b) => (float[5,3] y) {
    t = Transpose<perm=[1, 0]>(a)
    y = MatMul(t, b)
}
"""


@pytest.mark.parametrize(("graph", "side"), [(TRANSPOSED_B, "B"), (TRANSPOSED_A, "A")])
def test_matmul_of_a_transpose_becomes_fused_matmul_with_the_matching_overload(graph, side):
    model = parse(graph)
    assert rewrite(model, fused_matmul.rules()) == 1
    (node,) = model.graph
    assert (node.domain, node.op_type) == (MS_DOMAIN, "FusedMatMul")
    assert node.attributes.get_int(f"trans{side}") == 1
    assert node.overload == f"trans{side}"
    assert (MS_DOMAIN, "FusedMatMul", f"trans{side}") in model.functions


def test_the_tied_lm_head_reads_the_shared_embedding_table_directly():
    model, _ = tiny_decoder(tiny_config(tie_word_embeddings=True), weights="none")
    table = model.graph.initializers["model.embed_tokens.weight"]
    assert rewrite(model, fused_matmul.rules()) == 1
    transposed = [n.outputs[0] for n in model.graph if n.op_type == "Transpose"]
    assert not [use for value in transposed for use, _ in value.uses() if "MatMul" in use.op_type]
    (head,) = [n for n in model.graph if n.op_type == "FusedMatMul"]
    assert head.inputs[1] is table
    assert head.outputs[0] is model.graph.outputs[0]  # logits
    assert {node.op_type for node, _ in table.uses()} == {"Gather", "FusedMatMul"}


def test_an_untied_head_has_no_transpose_and_nothing_fuses():
    model, _ = tiny_decoder(tiny_config(), weights="none")
    assert rewrite(model, fused_matmul.rules()) == 0


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (
            TRANSPOSED_B.replace("float[16,8] table", "float[2,16,8] table").replace(
                "perm=[1, 0]", "perm=[0, 2, 1]"
            ),
            "not a 2-D transpose",
        ),
        (TRANSPOSED_B.replace("float[2,5,8] h", "float[8] h"), "not known to be >= 2-D"),
    ],
    ids=["3d-transpose", "1d-operand"],
)
def test_declines_what_the_2d_function_bodies_do_not_cover(graph, reason):
    model = parse(graph)
    assert any(reason in r for r in decline_reasons(model, fused_matmul.rules()))
    assert rewrite(model, fused_matmul.rules()) == 0


def test_declines_below_ir_version_10_which_has_no_function_overloads():
    model = parse(TRANSPOSED_B, header='<ir_version: 9, opset_import: ["" : 21]>')
    assert any("IR version 9" in r for r in decline_reasons(model, fused_matmul.rules()))


@pytest.mark.parametrize("graph", [TRANSPOSED_B, TRANSPOSED_A], ids=["transB", "transA"])
def test_ort_outputs_agree_before_after_and_after_inlining_the_body(graph):
    model = parse(graph)
    feeds = random_feeds(model)
    before = run(model, feeds)[0]
    fused = clone(model)
    assert rewrite(fused, fused_matmul.rules()) == 1
    np.testing.assert_allclose(run(fused, feeds)[0], before, atol=TOLERANCE, rtol=0)
    # The registered body is the Transpose + MatMul it replaced.
    InlinePass()(fused)
    assert op_counts(fused) == {"Transpose": 1, "MatMul": 1}
    np.testing.assert_allclose(run(fused, feeds)[0], before, atol=TOLERANCE, rtol=0)
