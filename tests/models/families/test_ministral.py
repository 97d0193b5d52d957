"""Ministral (2410) and Ministral 3's text decoders vs transformers 5.25.

ministral: sliding, full, sliding layers with a window of 4 (tests/_hf.py) under 12-token
prompts and 4 decode steps. ministral3: yarn rope and the query scale 1 + beta * log(1 +
floor(position / original)) with an original length of 4, so the scale steps up within the
prompt and again while decoding. f32, <= 1e-4 on the portable and cpu graphs; og.Generator's
greedy tokens equal transformers'; mutants without the window or the scale fail.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from transformers import Ministral3Config, MinistralConfig

import mobius_genai
from mobius_genai import packager
from mobius_genai.ep import get_ep
from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import (
    MINISTRAL3_ROPE,
    hf_greedy_tokens,
    hf_reference_logits,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._mutants import with_overrides
from tests._ort import case_diffs, max_abs_diff, mutant_diffs, ort_session, run_like_reference

TOLERANCE = 1e-4
EPS = ("default", "cpu")


def _ids(seed: int = 0, length: int = 12) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 128, size=(2, length))


CASES = {
    "ministral": ("ministral", {}),
    # every layer sliding: MinistralConfig's layer types where config.json lists none
    "ministral_all_sliding": ("ministral", {"layer_types": None}),
    "ministral3": ("ministral3", {}),
    # the rope dict as Ministral 3's hub config.json writes it: "type", its own length
    "ministral3_hub_rope_keys": (
        "ministral3",
        {
            "rope_parameters": {
                **{k: v for k, v in MINISTRAL3_ROPE.items() if k != "rope_type"},
                "type": "yarn",
                "max_position_embeddings": 64,
            }
        },
    ),
    "ministral3_sliding_window_tied": (
        "ministral3",
        {"sliding_window": 5, "tie_word_embeddings": True},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize(
    ("family", "mutant"),
    [
        ("ministral", lambda: with_overrides("ministral", layer_types=("full_attention",) * 3)),
        ("ministral3", lambda: with_overrides("ministral3", local_global=None)),
    ],
    ids=["ministral_without_window", "ministral3_without_query_scale"],
)
def test_parity_fails_without_the_family_difference(family, mutant, tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ours, theirs = mutant_diffs(ckpt, _ids(length=14), tmp_path, family, mutant(), monkeypatch)
    assert ours <= TOLERANCE < theirs / 10, (ours, theirs)


@pytest.mark.parametrize("family", ["ministral", "ministral3"])
def test_onnxruntime_genai_greedy_tokens_equal_transformers(family, tmp_path):
    """og.Generator over the cpu bundle (model.type mistral: og 0.18 has no ministral types):
    8 prompt tokens and 24 new ones, past the window and across 7 query-scale steps."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    bundle = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    ours = greedy_tokens(load_model(bundle), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS


def test_ministral3_query_scale_reads_the_rope_dict():
    config = get_family("ministral3").parse_config(tiny_config("ministral3").to_dict())
    tuning = config.local_global.temperature
    assert (tuning.floor_scale, tuning.scale, tuning.position_offset) == (4.0, 0.5, 0)
    assert tuning.every_layer and config.local_global.chunk_size is None
    assert FAMILIES["ministral3"].genai_type == FAMILIES["ministral"].genai_type == "mistral"


def test_absent_keys_are_what_the_transformers_configs_fill_in():
    """head_dim 128, rms_norm_eps 1e-5, yarn rope with beta 0.1 over 16384 positions
    (Ministral3Config); a window of 4096 in every layer (MinistralConfig)."""
    raw = tiny_config("ministral3").to_dict()
    for key in ("head_dim", "rms_norm_eps", "rope_parameters", "max_position_embeddings"):
        raw.pop(key)
    theirs = Ministral3Config(**raw)
    ours = get_family("ministral3").parse_config(raw)
    assert (ours.head_dim, ours.norm_eps) == (theirs.head_dim, theirs.rms_norm_eps)
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    params = theirs.rope_parameters
    assert (ours.rope.type, ours.rope.factor, ours.rope.theta) == (
        "yarn",
        params["factor"],
        params["rope_theta"],
    )
    tuning = ours.local_global.temperature
    assert (tuning.scale, tuning.floor_scale) == (
        params["llama_4_scaling_beta"],
        params["original_max_position_embeddings"],
    )
    raw = tiny_config("ministral").to_dict()
    for key in ("sliding_window", "layer_types"):
        raw.pop(key)
    theirs = MinistralConfig(**{**raw, "head_dim": 16})
    ours = get_family("ministral").parse_config(raw)
    assert ours.layer_types == tuple(theirs.layer_types)
    assert ours.window_of_layer(0) == theirs.sliding_window == 4096


def test_a_zero_beta_builds_no_scale_and_a_missing_one_is_refused_in_one_line():
    raw = tiny_config("ministral3").to_dict()
    zero = {**raw, "rope_parameters": {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.0}}
    assert get_family("ministral3").parse_config(zero).local_global is None
    rope = {k: v for k, v in MINISTRAL3_ROPE.items() if k != "llama_4_scaling_beta"}
    with pytest.raises(ConfigError, match="llama_4_scaling_beta None.*accepted") as error:
        get_family("ministral3").parse_config({**raw, "rope_parameters": rope})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("ep", ["cuda", "dml", "webgpu"])
def test_gpu_graphs_keep_the_window_and_the_query_scale(ep, tmp_path):
    """The graphs a GPU EP gets (not run here): GroupQueryAttention in every layer, windowed
    where the layer slides (local_window_size: the window of 4), and
    Ministral 3's factor computed from position_ids, which the graph keeps as an input."""
    windows = {}
    for family in ("ministral", "ministral3"):
        ckpt = write_tiny_checkpoint(tmp_path / family, family)
        graph = mobius_genai.build(ckpt, ep, load_weights=False, progress=False)["model"].graph
        gqa = [node for node in graph if node.op_type == "GroupQueryAttention"]
        assert len(gqa) == 3, family
        windows[family] = [node.attributes.get_int("local_window_size", -1) for node in gqa]
        scaled = family == "ministral3"
        assert ({"Floor", "Log"} <= {node.op_type for node in graph}) == scaled, family
        if scaled:  # ministral's GQA may compute positions itself and drop the input
            assert "position_ids" in [value.name for value in graph.inputs]
    assert windows == {"ministral": [4, -1, 4], "ministral3": [-1, -1, -1]}


def _gqa(graph) -> list:
    return [node for node in graph if node.op_type == "GroupQueryAttention"]


@pytest.mark.parametrize(
    ("ep", "rotates"), [("cuda", 1), ("webgpu", 1), ("trt-rtx", 1), ("dml", 0)]
)
def test_ministral3_rotary_fuses_into_gqa_where_the_ep_rotates(ep, rotates, tmp_path):
    """The query scale, one factor per position, commutes with the rotary, so it comes before
    it and the rotary joins GroupQueryAttention (do_rotary) wherever the EP's GQA rotates: as
    llama's (dml's GQA does not rotate)."""
    graphs = {}
    for family in ("ministral3", "llama"):
        ckpt = write_tiny_checkpoint(tmp_path / family, family)
        package = mobius_genai.build(ckpt, ep, load_weights=False, progress=False)
        graphs[family] = package["model"].graph
    for family, graph in graphs.items():
        gqa = _gqa(graph)
        assert len(gqa) == 3, family
        assert {node.attributes.get_int("do_rotary", 0) for node in gqa} == {rotates}, family
        rotary = [node for node in graph if node.op_type == "RotaryEmbedding"]
        assert len(rotary) == (0 if rotates else 6), family


def test_ministral3_cuda_graph_with_rotary_in_gqa_matches_transformers(tmp_path):
    """cuda's graph, its GroupQueryAttention admitted in float32 (nothing else changed), run
    by the CPU provider: the scaled, rotated queries equal transformers' within 1e-4 over a
    prompt that crosses two scale steps and 4 decode steps."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "ministral3", seed=1)
    cuda = get_ep("cuda")
    wide = cuda.with_kernels({"GroupQueryAttention": (*cuda.gqa_dtypes, ir.DataType.FLOAT)})
    package = mobius_genai.build(ckpt, wide, "f32", progress=False)
    gqa = _gqa(package["model"].graph)
    assert len(gqa) == 3 and all(node.attributes.get_int("do_rotary", 0) for node in gqa)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=4)
    ours = run_like_reference(ort_session(package, tmp_path / "cuda"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
