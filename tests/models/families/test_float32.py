"""What transformers keeps in float32 stays float32 in float16 and bfloat16 graphs.

The rows' `float32` (models/families/float32.py) against each transformers class's
`_keep_in_fp32_modules_strict` / `_keep_in_fp32_modules` and the float32 buffers it declares;
the float16 graphs' router weights and correction biases stored float32 (the checkpoint's
float32 values exactly) and their MatMul fed float32; MiniMax-M2's float32 scores and LFM2-MoE's
float32 choice; checkpoints whose corrected scores tie in float16 but not in float32, where the
float16 graph must pick transformers' experts (run on CPU, as the smoke test runs float16
graphs) and its float16 bundle generate transformers' tokens in onnxruntime-genai; float32
graphs unchanged.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime_genai as og
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import mobius_genai
from mobius_genai import packager
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.float32 import KeptFloat32
from tests._bundles import PROMPT, TOKENIZER_FILES, bundle_checkpoint
from tests._hf import FAMILIES as TINY_CONFIGS
from tests._hf import (
    hf_greedy_tokens,
    hf_reference_logits,
    load_reference_model,
    router_picks,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.models.families.test_nemotron_h_moe import NEMOTRON3
from tests.runtime._og import alone

#: A corrected router's parameters, by graph name.
_BIASED = ("weight", "e_score_correction_bias")
#: Each row's float32 router parameters in its tiny checkpoint's float16 graph, and its MoE
#: layers.
ROUTERS = {
    "deepseek_v3": (_BIASED, (1, 2)),
    "glm4_moe": (_BIASED, (1, 2)),
    "ernie4_5_moe": (_BIASED, (1, 2)),
    "deepseek_v2": (("weight",), (1, 2)),
    "dots1": (_BIASED, (1, 2)),
    "glm4_moe_lite": (_BIASED, (0, 2)),
    "exaone_moe": (_BIASED, (1, 2)),
    "solar_open": (_BIASED, (0, 1, 2)),
    "hunyuan_v1_moe": (("weight",), (0, 1, 2)),  # its float32 `wg`
    "nemotron_h": (_BIASED, (1, 4)),
    "axk1": (_BIASED, (1, 2)),
    "minicpm5_moe": (_BIASED, (1, 2)),
    "hy_v3": (_BIASED, (1, 2)),
    "flint": (("weight",), (1, 2)),
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
    "gpt_oss": KeptFloat32(in_float16=("input_layernorm", "norm", "post_attention_layernorm")),
    "flint": KeptFloat32(strict=("sinks",)),
    "kimi_linear": KeptFloat32(strict=("dt_bias",)),  # a known gap (float32.py)
    "afmoe": KeptFloat32(
        in_float16=(
            "input_layernorm",
            "k_norm",
            "norm",
            "post_attention_layernorm",
            "post_mlp_layernorm",
            "pre_mlp_layernorm",
            "q_norm",
        )
    ),
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


def _search(patterns: tuple[str, ...], names) -> set[str]:
    """The `names` a transformers-style alternation of `patterns` finds (none without any)."""
    found = re.compile("|".join(patterns)) if patterns else None
    return {name for name in names if found is not None and found.search(name)}


#: Buffers a row leaves in the graph's dtype though transformers creates them float32 (a
#: known gap, float32.py).
NOT_DECLARED = {"olmo_hybrid": (r"\.linear_attn\.A_log$",)}


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) & set(TINY_CONFIGS)))
def test_rows_keep_the_buffers_transformers_declares_float32(model_type):
    """Tensors the class creates in float32 whatever the model's dtype, beyond its keep
    lists (LFM2-MoE's expert_bias), are the row's `declared`."""
    model = AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float16)
    tensors = model.state_dict()
    kept = _kept(model_type)
    listed = _search(kept.strict + kept.in_float16, tensors)
    declared = {name for name, value in tensors.items() if value.dtype == torch.float32} - listed
    left = _search(NOT_DECLARED.get(model_type, ()), tensors)
    assert left <= declared
    assert declared - left == _search(FAMILIES[model_type].float32.declared, tensors)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny float32 checkpoint of each row of ROUTERS (Nemotron-H's with MoE layers)."""
    folder = tmp_path_factory.mktemp("float32")
    return {
        family: write_tiny_checkpoint(
            folder / family, family, seed=1, **(NEMOTRON3 if family == "nemotron_h" else {})
        )
        for family in ROUTERS
    }


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
    names, layers = ROUTERS[family]
    kept = {f"model.layers.{i}.mlp.gate.{name}" for i in layers for name in names}
    floats = {
        name: value
        for name, value in graph.initializers.items()
        if value.dtype.is_floating_point() and value.shape.rank() > 0
    }
    assert {name for name, v in floats.items() if v.dtype == ir.DataType.FLOAT} == kept
    assert {v.dtype for name, v in floats.items() if name not in kept} == {narrow}
    stored = load_file(checkpoints[family] / "model.safetensors")
    for name in kept:  # the weight stored [in, out]
        value = stored[FAMILIES[family].checkpoint_name(name)]
        value = value.T if name.endswith(".weight") else value
        assert np.array_equal(graph.initializers[name].const_value.numpy(), value)
    for layer in layers:
        weight = graph.initializers[f"model.layers.{layer}.mlp.gate.weight"]
        (matmul,) = [use.node for use in weight.uses()]
        assert matmul.op_type == "MatMul"
        cast = matmul.inputs[0].producer()
        assert (cast.op_type, cast.attributes["to"].value) == ("Cast", ir.DataType.FLOAT)


def _only_use(value: ir.Value) -> ir.Node:
    (node,) = [use.node for use in value.uses()]
    return node


def _casts_to_float32(node: ir.Node | None) -> bool:
    return (
        node is not None
        and node.op_type == "Cast"
        and node.attributes["to"].value == ir.DataType.FLOAT
    )


def test_minimax_scores_and_lfm2_moe_choice_are_float32(tmp_path):
    """MiniMaxM2TopKRouter: float16 logits, their sigmoid and the choice in float32, the bias
    float16 (as transformers loads it); Lfm2MoeSparseMoeBlock: float16 logits and scores, its
    float32 expert_bias (the checkpoint's values exactly) added in float32."""
    ckpt = write_tiny_checkpoint(tmp_path / "minimax", "minimax_m2", seed=1)
    graph = mobius_genai.build(ckpt, "cpu", "f16", load_weights=False)["model"].graph
    router = "model.layers.0.mlp.gate"
    weight, bias = (graph.initializers[f"{router}.{name}"] for name in _BIASED)
    assert (weight.dtype, bias.dtype) == (ir.DataType.FLOAT16, ir.DataType.FLOAT16)
    logits = _only_use(_only_use(weight).outputs[0])  # MatMul → Reshape
    assert _casts_to_float32(_only_use(logits.outputs[0]))
    assert _casts_to_float32(_only_use(bias))
    ckpt = write_tiny_checkpoint(tmp_path / "lfm2", "lfm2_moe", seed=1)
    graph = mobius_genai.build(ckpt, "cpu", "f16")["model"].graph
    router = "model.layers.1.mlp.gate"
    weight, bias = (graph.initializers[f"{router}.{name}"] for name in _BIASED)
    assert (weight.dtype, bias.dtype) == (ir.DataType.FLOAT16, ir.DataType.FLOAT)
    stored = load_file(ckpt / "model.safetensors")["model.layers.1.feed_forward.expert_bias"]
    assert np.array_equal(bias.const_value.numpy(), stored)
    (scores,) = [value for value in _only_use(bias).inputs if value is not bias]
    assert _casts_to_float32(scores.producer())


def test_float32_graphs_have_no_new_cast(checkpoints, monkeypatch):
    """A float32 build is the graph it was before rows kept anything in float32."""
    row = FAMILIES["deepseek_v3"]
    counts = []
    for kept in (row.float32, KeptFloat32()):
        monkeypatch.setitem(FAMILIES, "deepseek_v3", dataclasses.replace(row, float32=kept))
        package = mobius_genai.build(checkpoints["deepseek_v3"], "cpu", "f32", load_weights=False)
        counts.append(Counter(node.op_type for node in package["model"].graph))
    assert counts[0] == counts[1]


def _router(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    block = model.model.layers[layer]
    return getattr(block, "mlp", None) or block.feed_forward


def _near_tie(source: Path, dest: Path) -> Path:
    """`source` with experts 0 and 1 of every router scored alike (the same weight row) and
    chosen by correction biases 1.0 and 1.0001, which float16 rounds both to 1.0 (a tie its
    TopK breaks for expert 0) while float32 chooses expert 1; expert 2's bias 2.0 makes it the
    other pick, the rest's -1 none."""
    model = load_reference_model(source)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(".gate.weight"):
                tensor[1] = tensor[0]
            elif name.endswith(("e_score_correction_bias", "expert_bias")):
                tensor.fill_(-1.0)
                tensor[:3] = torch.tensor([1.0, 1.0001, 2.0])
    model.save_pretrained(dest)
    return dest


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe", "lfm2_moe"])
def test_float16_routing_follows_transformers_near_ties(family, tmp_path, monkeypatch):
    """transformers (float32 routing: a float32 bias; DeepSeek's float32 router) picks experts
    1 and 2 for every token, and float16 routing would pick 0 and 2: the float16 graph's
    logits follow transformers', those of the graph with the router in float16 (the row
    keeping nothing) are far off."""
    groups = {} if family == "lfm2_moe" else {"n_group": 1, "topk_group": 1}
    base = write_tiny_checkpoint(tmp_path / "base", family, seed=1, **groups)
    ckpt = _near_tie(base, tmp_path / "tie")
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    model = load_reference_model(ckpt)
    assert set(router_picks(model, _router(model, 1).gate, ids)) == {(1, 2)}
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


def test_float16_bundle_generates_transformers_tokens_near_ties(tmp_path, monkeypatch):
    """A float16 cpu bundle of the near-tie DeepSeek-V3 checkpoint, validated and smoke-tested
    by `package`, generates transformers' greedy tokens in onnxruntime-genai; with the router in
    float16 (the row keeping nothing) it does not."""
    base = bundle_checkpoint(tmp_path / "base", "deepseek_v3", n_group=1, topk_group=1)
    ckpt = _near_tie(base, tmp_path / "tie")
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, ckpt / name)
    expected = hf_greedy_tokens(ckpt, PROMPT, 16)
    row = FAMILIES["deepseek_v3"]
    tokens = {}
    for label, kept in (("float32", row.float32), ("float16", KeptFloat32())):
        monkeypatch.setitem(FAMILIES, "deepseek_v3", dataclasses.replace(row, float32=kept))
        bundle = packager.package(ckpt, "cpu", tmp_path / label, precision="fp16", quiet=True)
        tokens[label] = alone(og.Model(str(bundle)), PROMPT, 16)
    assert tokens["float32"] == expected
    assert tokens["float16"] != expected
