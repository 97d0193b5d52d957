"""What a family keeps in float32 stays float in int4 (models/families/float32.py).

A MoE router's weight (DeepSeek-V3's and the classes copying its router) is left a float32
MatMul in int4 graphs of every dtype, with the manifest and the card saying so, while the other
matrices are 4-bit. A checkpoint whose router scores tie in float32 (a feature no token has,
where expert 1's row alone is large, and correction biases choosing expert 1) keeps
transformers' choice in its int4 graph; with the router rounded to 4 bits (the row keeping
nothing) the large value coarsens expert 1's block and the tie breaks another way.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime_genai as og
import pytest
import torch
from safetensors.numpy import load_file

from mobius_genai import build, resolve_target
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.float32 import KeptFloat32
from mobius_genai.packager import package
from mobius_genai.quantize import Int4Options
from mobius_genai.quantize.package_weights import quantize_package
from tests._bundles import PROMPT, TOKENIZER_FILES, bundle_checkpoint
from tests._hf import load_reference_model, router_picks, write_tiny_checkpoint
from tests._ort import ort_session
from tests.runtime._og import alone

#: Quick rounding: which ops are written, not their accuracy.
QUICK = Int4Options(quality="builder")
#: The tiny checkpoints' MoE layers.
MOE_LAYERS = (1, 2)
#: The feature no token has (its norm weight zero) where expert 1's router row is large.
_HIDDEN_FEATURE = 0


def _routers(layers=MOE_LAYERS) -> set[str]:
    return {f"model.layers.{layer}.mlp.gate.weight" for layer in layers}


@pytest.mark.parametrize(
    ("family", "ep", "dtype"),
    [("deepseek_v3", "cpu", "f32"), ("glm4_moe", "cpu", "f32"), ("deepseek_v3", "cuda", "f16")],
)
def test_int4_leaves_the_router_a_float32_matmul(family, ep, dtype, tmp_path):
    """The router weights are float32 initializers holding the checkpoint's values, each read
    by one MatMul; every other matrix is a 4-bit MatMulNBits; the report names the routers."""
    ckpt = write_tiny_checkpoint(tmp_path / family, family, seed=1)
    target = resolve_target(ep, dtype=dtype, int4=QUICK)
    built = build(ckpt, target=target, progress=False)
    report = quantize_package(built, target).int4
    graph = built["model"].graph
    stored = load_file(ckpt / "model.safetensors")
    for name in _routers():
        weight = graph.initializers[name]
        assert weight.dtype == ir.DataType.FLOAT
        assert [use.node.op_type for use in weight.uses()] == ["MatMul"]
        assert np.array_equal(weight.const_value.numpy(), stored[name].T)
    assert set(report.kept_float32) == _routers()
    nbits = [node for node in graph if node.domain == MS_DOMAIN and node.op_type == "MatMulNBits"]
    assert nbits and {node.attributes.get_int("bits", 4) for node in nbits} == {4}
    float_matmuls = {
        node.inputs[1].name
        for node in graph
        if node.op_type == "MatMul" and node.inputs[1].is_initializer()
    }
    assert float_matmuls == _routers()


def _router_tie(source: Path, dest: Path) -> Path:
    """`source` with experts 0 and 1 of every router scored alike in float32 and chosen by
    correction biases 1.0 and 1.0001 (expert 2's 2.0 the other pick, the rest's -1 none):
    their rows differ only at a feature the MoE layer's norm zeroes, where expert 1's is 50
    times the row's largest, which 4-bit rounding of the router spreads over its block."""
    model = load_reference_model(source)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(".gate.weight"):
                tensor[1] = tensor[0]
                tensor[1, _HIDDEN_FEATURE] = 50 * tensor[0].abs().max()
            elif name.endswith("e_score_correction_bias"):
                tensor.fill_(-1.0)
                tensor[:3] = torch.tensor([1.0, 1.0001, 2.0])
        for layer in MOE_LAYERS:
            model.model.layers[layer].post_attention_layernorm.weight[_HIDDEN_FEATURE] = 0.0
    model.save_pretrained(dest)
    return dest


def _graph_picks(built, folder: Path, ids: np.ndarray) -> list[tuple]:
    """The experts the graph's layer-1 router picks for each token of `ids` (a prefill), each
    token's sorted: its TopK's indices made a graph output."""
    graph = built["model"].graph
    (topk,) = [n for n in graph if n.op_type == "TopK" and "layers.1/mlp/gate" in n.name]
    graph.outputs.append(topk.outputs[1])
    session = ort_session(built, folder)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for info in session.get_inputs():
        if info.name == "position_ids":
            feeds[info.name] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        elif info.name.startswith("past_key_values."):
            _, heads, _, head_dim = info.shape
            feeds[info.name] = np.zeros((ids.shape[0], heads, 0, head_dim), np.float32)
    (picks,) = session.run([topk.outputs[1].name], feeds)
    return [tuple(sorted(row)) for row in picks.tolist()]


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_int4_routing_follows_transformers_near_ties(family, tmp_path, monkeypatch):
    """transformers picks experts 1 and 2 for every token, and so does the int4 graph; with
    the router in 4 bits (the row keeping nothing) it picks expert 0 for some tokens."""
    base = write_tiny_checkpoint(tmp_path / "base", family, seed=1, n_group=1, topk_group=1)
    ckpt = _router_tie(base, tmp_path / "tie")
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    model = load_reference_model(ckpt)
    expected = router_picks(model, model.model.layers[1].mlp.gate, ids)
    assert set(expected) == {(1, 2)}
    row = FAMILIES[family]
    target = resolve_target("cpu", int4=QUICK)
    picks = {}
    for label, kept in (("float32", row.float32), ("int4", KeptFloat32())):
        monkeypatch.setitem(FAMILIES, family, dataclasses.replace(row, float32=kept))
        built = build(ckpt, target=target, progress=False)
        quantize_package(built, target)
        picks[label] = _graph_picks(built, tmp_path / label, ids)
    assert picks["float32"] == expected
    assert (0, 2) in set(picks["int4"]), picks["int4"]


def test_the_int4_bundle_says_its_routers_are_float32(tmp_path):
    """`package --precision int4`: validated (the manifest schema admits the list), smoke-tested
    in onnxruntime-genai, its manifest listing the routers and its card counting them."""
    base = bundle_checkpoint(tmp_path / "base", "deepseek_v3", n_group=1, topk_group=1)
    ckpt = _router_tie(base, tmp_path / "tie")
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, ckpt / name)
    bundle = package(ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=QUICK, quiet=True)
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert set(manifest["build"]["quantization"]["weights_float32"]) == _routers()
    assert "2 left float32 as the family keeps them" in (bundle / "README.md").read_text()
    tokens = alone(og.Model(str(bundle)), PROMPT, 4)
    assert len(tokens) == 4
