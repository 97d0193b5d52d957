"""What transformers keeps in float32 stays float32 in float16 and bfloat16 graphs.

The rows' `float32` (models/families/float32.py) against each transformers class's
`_keep_in_fp32_modules_strict` / `_keep_in_fp32_modules`; the float16 graphs' router weights and
correction biases stored float32 (the checkpoint's float32 values exactly) and their MatMul fed
float32; a checkpoint whose corrected scores tie in float16 but not in float32, where the
float16 graph must pick transformers' experts (run on CPU, as the smoke test runs float16
graphs); float32 graphs unchanged.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import mobius_genai
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.float32 import KeptFloat32
from tests._hf import hf_reference_logits, load_reference_model, router_picks, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

#: Each row's float32 parameters in its tiny checkpoint's float16 graph (layers 1 and 2 are MoE
#: layers in every one of them).
ROUTERS = {
    "deepseek_v3": ("gate.weight", "gate.e_score_correction_bias"),
    "glm4_moe": ("gate.weight", "gate.e_score_correction_bias"),
    "ernie4_5_moe": ("gate.weight", "gate.e_score_correction_bias"),
    "deepseek_v2": ("gate.weight",),
}
#: float16 logits of the tiny models against transformers' float32 ones (largest seen: 0.03).
FLOAT16_TOLERANCE = 0.1


def _kept(model_type: str) -> KeptFloat32:
    """What the transformers class of `model_type` keeps in float32."""
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    return KeptFloat32(
        strict=tuple(sorted(cls._keep_in_fp32_modules_strict or ())),
        in_float16=tuple(sorted(cls._keep_in_fp32_modules or ())),
    )


#: What a row leaves in the graph's dtype though transformers keeps it (float32.py says why).
NOT_KEPT = {
    "gpt_oss": KeptFloat32(in_float16=("input_layernorm", "norm", "post_attention_layernorm"))
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_rows_keep_what_transformers_keeps_in_float32(model_type):
    row = FAMILIES[model_type].float32
    ours = KeptFloat32(tuple(sorted(row.strict)), tuple(sorted(row.in_float16)))
    left = NOT_KEPT.get(model_type, KeptFloat32())
    theirs = _kept(model_type)
    expected = KeptFloat32(
        tuple(name for name in theirs.strict if name not in left.strict),
        tuple(name for name in theirs.in_float16 if name not in left.in_float16),
    )
    assert ours == expected
    assert set(left.strict) <= set(theirs.strict)
    assert set(left.in_float16) <= set(theirs.in_float16)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny float32 checkpoint of each row of ROUTERS."""
    folder = tmp_path_factory.mktemp("float32")
    return {family: write_tiny_checkpoint(folder / family, family, seed=1) for family in ROUTERS}


@pytest.mark.parametrize(
    ("family", "ep", "dtype"),
    [(family, "cpu", "f16") for family in sorted(ROUTERS)]
    + [("deepseek_v3", ep, "f16") for ep in ("cuda", "dml", "webgpu")]
    + [("glm4_moe", "cuda", "bf16")],
)
def test_router_weights_and_math_stay_float32(family, ep, dtype, checkpoints):
    """The router's parameters are float32 initializers holding the checkpoint's values exactly,
    every other float parameter is in the graph's dtype, and the router's MatMul multiplies the
    hidden state cast to float32."""
    graph = mobius_genai.build(checkpoints[family], ep, dtype, progress=False)["model"].graph
    narrow = ir.DataType.FLOAT16 if dtype == "f16" else ir.DataType.BFLOAT16
    kept = {f"model.layers.{i}.mlp.{name}" for i in (1, 2) for name in ROUTERS[family]}
    floats = {
        name: value
        for name, value in graph.initializers.items()
        if value.dtype.is_floating_point() and value.shape.rank() > 0
    }
    assert {name for name, v in floats.items() if v.dtype == ir.DataType.FLOAT} == kept
    assert {v.dtype for name, v in floats.items() if name not in kept} == {narrow}
    stored = load_file(checkpoints[family] / "model.safetensors")
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    if bias in kept:
        source = bias.replace(".gate.", ".moe_statics.") if family == "ernie4_5_moe" else bias
        assert np.array_equal(graph.initializers[bias].const_value.numpy(), stored[source])
    for layer in (1, 2):
        weight = graph.initializers[f"model.layers.{layer}.mlp.gate.weight"]
        (matmul,) = [use.node for use in weight.uses()]
        assert matmul.op_type == "MatMul"
        cast = matmul.inputs[0].producer()
        assert (cast.op_type, cast.attributes["to"].value) == ("Cast", ir.DataType.FLOAT)


def test_float32_graphs_have_no_new_cast(checkpoints, monkeypatch):
    """A float32 build is the graph it was before rows kept anything in float32."""
    row = FAMILIES["deepseek_v3"]
    counts = []
    for kept in (row.float32, KeptFloat32()):
        monkeypatch.setitem(FAMILIES, "deepseek_v3", dataclasses.replace(row, float32=kept))
        package = mobius_genai.build(checkpoints["deepseek_v3"], "cpu", "f32", load_weights=False)
        counts.append(Counter(node.op_type for node in package["model"].graph))
    assert counts[0] == counts[1]


def _near_tie(source: Path, dest: Path) -> Path:
    """`source` with experts 0 and 1 of every router scored alike (the same weight row) and
    chosen by correction biases 1.0 and 1.0001, which float16 rounds both to 1.0 (a tie its
    TopK breaks for expert 0) while float32 chooses expert 1; expert 2's bias 2.0 makes it the
    other pick, the rest's -1 none."""
    model = load_reference_model(source)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is None:
                continue
            gate.weight[1] = gate.weight[0]
            bias = torch.full_like(gate.e_score_correction_bias, -1.0)
            bias[:3] = torch.tensor([1.0, 1.0001, 2.0])
            gate.e_score_correction_bias.copy_(bias)
    model.save_pretrained(dest)
    return dest


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_float16_routing_follows_transformers_near_ties(family, tmp_path, monkeypatch):
    """transformers (float32 routing) picks experts 1 and 2 for every token, and float16
    routing would pick 0 and 2: the float16 graph's logits follow transformers', those of the
    graph with the router in float16 (the row keeping nothing) are far off."""
    base = write_tiny_checkpoint(tmp_path / "base", family, seed=1, n_group=1, topk_group=1)
    ckpt = _near_tie(base, tmp_path / "tie")
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    model = load_reference_model(ckpt)
    assert set(router_picks(model, model.model.layers[1].mlp.gate, ids)) == {(1, 2)}
    reference = hf_reference_logits(ckpt, ids, decode_steps=2)
    row = FAMILIES[family]
    diffs = {}
    for label, kept in (("float32", row.float32), ("float16", KeptFloat32())):
        monkeypatch.setitem(FAMILIES, family, dataclasses.replace(row, float32=kept))
        package = mobius_genai.build(ckpt, "cpu", "f16", progress=False)
        ours = run_like_reference(ort_session(package, tmp_path / label), reference)
        diffs[label] = max_abs_diff(ours, reference.logits)
    assert diffs["float32"] <= FLOAT16_TOLERANCE, diffs
    assert diffs["float16"] > 10 * FLOAT16_TOLERANCE, diffs
