"""Hybrid decoders (recurrent conv layers between attention layers: lfm2) beyond the family
parity table: the strict-ONNX graph, a left-padded batch, the portable graph on onnx's reference
evaluator, the caches and genai_config keys as onnxruntime-genai 0.18 reads them, int4; and, for
every hybrid family, the residual norms fused after the recurrent layers too."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import packager
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import (
    left_padded_diffs,
    max_abs_diff,
    ort_session,
    reference_evaluator_logits,
    run_like_reference,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lfm2") / "ckpt", "lfm2", seed=2)


def test_strict_onnx_graph_matches_transformers_and_has_no_custom_op(lfm2, tmp_path):
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(lfm2, ids, decode_steps=4)
    package = mobius_genai.build(lfm2, "onnx-standard", "f32")
    assert {node.domain for node in package["model"].graph.all_nodes()} <= {""}
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_left_padded_batch_matches_transformers(lfm2, tmp_path):
    """Padding must not leak into the conv state: transformers zeroes padded inputs. (The
    portable graph, as tests/models/test_causal_lm.py checks for attention-only decoders: onnxruntime's
    GroupQueryAttention reads positions from the mask and is not compared on padded rows.)"""
    first, rest = left_padded_diffs(lfm2, tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def test_portable_graph_runs_on_the_reference_evaluator(lfm2):
    """The default graph keeps com.microsoft::CausalConvWithState with its body: a runtime
    without the kernel (onnx's reference evaluator) runs the body and gets the same logits."""
    ids = np.random.default_rng(2).integers(3, 128, size=(1, 9))
    reference = hf_reference_logits(lfm2, ids, decode_steps=0)
    package = mobius_genai.build(lfm2, "default", "f32")
    model = package["model"]
    assert any(node.op_type == "CausalConvWithState" for node in model.graph)
    logits = reference_evaluator_logits(model, ids)
    assert max_abs_diff([logits], reference.logits[:1]) <= TOLERANCE


def test_caches_and_genai_config_as_onnxruntime_genai_reads_them(tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "lfm2")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    # onnxruntime-genai 0.18's builder writes these keys for an LFM2 checkpoint
    assert decoder["layer_types"] == ["conv", "full_attention", "conv"]
    assert decoder["conv_cache_size"] == 2
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["outputs"]["present_conv_names"] == "present.%d.conv"
    graph = validate_bundle(folder).graph
    assert set(graph.inputs) >= {"past.0.conv", "past.2.conv", "past_key_values.1.key"}
    assert "past_key_values.0.key" not in graph.inputs
    assert graph.inputs["past.0.conv"].shape == ("batch_size", 64, 2)
    path = folder / "genai_config.json"
    document = json.loads(path.read_text())
    document["model"]["decoder"]["conv_cache_size"] = 3
    path.write_text(json.dumps(document))
    with pytest.raises(BundleError, match="conv_cache_size: 3 but graph 'past.0.conv' has 2"):
        validate_bundle(folder)
    document["model"]["decoder"]["layer_types"] = ["full_attention"] * 3
    path.write_text(json.dumps(document))
    with pytest.raises(BundleError, match="lists no 'conv' layer"):
        validate_bundle(folder)


def test_int4_bundle_generates(tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "lfm2")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    model = ir.load(folder / "model.onnx")
    ops = {node.op_type for node in model.graph.all_nodes()}
    assert {"MatMulNBits", "CausalConvWithState"} <= ops
    conv_weights = [v for v in model.graph.inputs if v.name.startswith("past.")]
    assert {v.dtype for v in conv_weights} == {ir.DataType.FLOAT}
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


@pytest.mark.parametrize("family", ["lfm2", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_every_residual_norm_fuses_after_recurrent_layers_too(family, tmp_path):
    """Each layer's two residual Add + RMSNorm pairs (the attention or recurrent block's, then
    the MLP's into the next layer's input norm or the final norm) become
    SkipSimplifiedLayerNormalization on cpu: a recurrent block's output must keep the symbolic
    [batch, seq] of its input, or the fusion cannot prove the summands' shapes equal."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    package = mobius_genai.build(ckpt, "cpu", load_weights=False)
    counts = collections.Counter(node.op_type for node in package["model"].graph)
    (report,) = package.reports.values()
    assert [decline.reason for decline in report.rules["SkipNorm"].declines] == []
    assert counts["SkipSimplifiedLayerNormalization"] == 2 * layers
