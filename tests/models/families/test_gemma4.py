"""Gemma 4 (gemma4_text) beyond the family parity table: a prompt longer than the sliding
window on the portable, cpu and strict-ONNX graphs for the dense layout (per-layer inputs,
shared caches) and the MoE one (GeGLU experts beside the MLP), a left-padded batch, the hub's
config keys; a mutant per mechanism fails
parity; each layer's cache has its own shape; int4 bundles and onnxruntime-genai's tokens
(og.Generator, og.Engine). (The dense bundle's og greedy tokens: test_bundles.py.)"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import helper

import mobius_genai
from mobius_genai import packager
from mobius_genai.components import altup_layer, per_layer_stack, stack_experts
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.per_layer_stack import per_layer_stack as stack_section
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models import FAMILIES
from mobius_genai.models.causal_lm import PerLayerTextModel
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import (
    GEMMA4_MOE,
    hf_greedy_tokens,
    hf_reference_logits,
    write_tiny_checkpoint,
)
from tests._ort import graph_diffs, left_padded_diffs
from tests.runtime._og import PROMPTS, engine_tokens

TOLERANCE = 1e-4  # f32, max abs diff of logits over the prefill and every decode step
PREFILL = 20  # four times the tiny model's sliding window (5)
MOE = GEMMA4_MOE  # the 26B-A4B layout (tests/_hf.py)
LAYOUTS = {"dense": {}, "moe": MOE}


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("gemma4") / "ckpt", "gemma4_text")


@pytest.fixture(scope="module")
def gemma4_moe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4_moe") / "ckpt"
    return write_tiny_checkpoint(folder, "gemma4_text", **MOE)


def _long_run(ckpt):
    ids = np.random.default_rng(0).integers(3, 128, size=(2, PREFILL))
    return hf_reference_logits(ckpt, ids, decode_steps=4)


@pytest.fixture(scope="module")
def long_run(gemma4):
    return _long_run(gemma4)


@pytest.fixture(scope="module")
def moe_long_run(gemma4_moe):
    return _long_run(gemma4_moe)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_long_prompt_then_decode_matches_transformers_on_every_graph(layout, request, tmp_path):
    ckpt = request.getfixturevalue("gemma4" if layout == "dense" else "gemma4_moe")
    reference = request.getfixturevalue("long_run" if layout == "dense" else "moe_long_run")
    diffs = graph_diffs(ckpt, reference, ("default", "cpu", "onnx-standard"), tmp_path)
    assert max(diffs.values()) <= TOLERANCE, diffs
    standard = mobius_genai.build(ckpt, "onnx-standard", "f32", load_weights=False)
    assert {node.domain for node in standard["model"].graph} == {""}


def test_left_padded_batch_matches_transformers(gemma4, tmp_path):
    first, rest = left_padded_diffs(gemma4, tmp_path)
    assert max(first, rest) <= TOLERANCE, (first, rest)


def test_hub_config_keys_match_transformers(gemma4, tmp_path):
    """global_head_dim and num_global_key_value_heads, as the hub's configs give the full
    layers' geometry, instead of transformers 5's per_layer_config."""
    from transformers import AutoConfig

    hub = tmp_path / "hub"
    shutil.copytree(gemma4, hub)
    config = json.loads((hub / "config.json").read_text())
    del config["per_layer_config"]
    config.update(global_head_dim=32, num_global_key_value_heads=1)
    (hub / "config.json").write_text(json.dumps(config))
    read = AutoConfig.from_pretrained(hub).to_dict()["per_layer_config"]
    assert read == json.loads((gemma4 / "config.json").read_text())["per_layer_config"]
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 14))
    reference = hf_reference_logits(hub, ids, decode_steps=2)
    diffs = graph_diffs(hub, reference, ("default",), tmp_path)
    assert max(diffs.values()) <= TOLERANCE, diffs


def _row(**section_changes):
    row = FAMILIES["gemma4_text"]
    section = lambda raw: dataclasses.replace(stack_section(raw), **section_changes)  # noqa: E731
    return dataclasses.replace(
        row, config_overrides={**row.config_overrides, "per_layer_stack": section}
    )


_ROTARY_DIM_OF = ArchitectureConfig.rotary_dim_of


def _rope_sized_by_the_sliding_head(self, rope):
    """The full layers' proportional rope built for the sliding layers' head size."""
    return self.head_dim if rope.type == "proportional" else _ROTARY_DIM_OF(self, rope)


_KEYS_VALUES = altup_layer.SharedKVAttention._keys_values


def _values_after_the_keys_norm_and_rope(self, op, x, position_ids, rotary, *rest):
    """K = V taken at the wrong place: the full layers' values are their normed, rotated keys."""
    if self.v_proj is not None:
        return _KEYS_VALUES(self, op, x, position_ids, rotary, *rest)
    k, _, past_key, _ = _KEYS_VALUES(self, op, x, position_ids, rotary, *rest)
    return k, k, past_key, past_key


_PER_LAYER_INPUTS = PerLayerTextModel._per_layer_inputs


def _per_layer_inputs_reversed(self, op, input_ids, embeds):
    inputs = _PER_LAYER_INPUTS(self, op, input_ids, embeds)
    starts, ends, axes, steps = ([v] for v in (-1, -(2**62), 2, -1))
    return op.Slice(inputs, *(op.Constant(value_ints=v) for v in (starts, ends, axes, steps)))


_LAYER = per_layer_stack.PerLayerDecoderLayer.forward


def _without_layer_scalar(self, op, *args):
    hidden, present, kv = _LAYER(self, op, *args)
    return op.Div(hidden, self.layer_scalar), present, kv


def _unscaled_experts(self, op):
    return op.Constant(value_floats=[1.0])


# mutant → (layout, the row it builds with or None, the method it replaces or None)
MUTANTS = {
    "full_layers_rope_sized_by_the_sliding_head": (
        "dense",
        None,
        (ArchitectureConfig, "rotary_dim_of", _rope_sized_by_the_sliding_head),
    ),
    "values_after_the_keys_norm_and_rope": (
        "dense",
        None,
        (altup_layer.SharedKVAttention, "_keys_values", _values_after_the_keys_norm_and_rope),
    ),
    "kv_shared_from_the_wrong_layer": ("dense", _row(kv_sources=(0, 1, 2, 3, 0, 1)), None),
    "per_layer_inputs_in_reverse_layer_order": (
        "dense",
        None,
        (PerLayerTextModel, "_per_layer_inputs", _per_layer_inputs_reversed),
    ),
    "layer_scalar_dropped": (
        "dense",
        None,
        (per_layer_stack.PerLayerDecoderLayer, "forward", _without_layer_scalar),
    ),
    "per_expert_scale_dropped": (
        "moe",
        None,
        (stack_experts.StackRouter, "expert_scale", _unscaled_experts),
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_fails_parity(mutant, request, tmp_path, monkeypatch):
    layout, row, method = MUTANTS[mutant]
    ckpt = request.getfixturevalue("gemma4" if layout == "dense" else "gemma4_moe")
    reference = request.getfixturevalue("long_run" if layout == "dense" else "moe_long_run")
    if row is not None:
        monkeypatch.setitem(FAMILIES, "gemma4_text", row)
    if method is not None:
        monkeypatch.setattr(*method)
    diffs = graph_diffs(ckpt, reference, ("default",), tmp_path)
    assert min(diffs.values()) > 10 * TOLERANCE, diffs


def test_each_layer_has_its_caches_shape_and_shared_layers_read_their_sources(gemma4):
    """Full layers (1, 3, 5) cache one 32-wide kv head, sliding ones two 16-wide heads; full
    layers have no v_proj (K = V); layers 4 and 5 read layers 2 and 3's caches (no k/v
    weights of their own, their Attention nodes fed the source's keys and values)."""
    graph = mobius_genai.build(gemma4, "default", "f32", load_weights=False)["model"].graph
    for layer in range(6):
        shape = list(
            graph.inputs[[v.name for v in graph.inputs].index(f"past_key_values.{layer}.key")].shape
        )
        assert [shape[1], shape[3]] == ([1, 32] if layer % 2 else [2, 16]), layer
    weights = set(graph.initializers)
    for layer in range(6):
        prefix = f"model.layers.{layer}.self_attn."
        assert (prefix + "k_proj.weight" in weights) == (layer < 4), layer
        assert (prefix + "v_proj.weight" in weights) == (layer in (0, 2)), layer
    attention = [node for node in graph if node.op_type == "Attention"]
    for reader, source in ((4, 2), (5, 3)):
        for key in (1, 2, 4, 5):  # new keys and values, past keys and values
            assert attention[reader].inputs[key] is attention[source].inputs[key]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"per_layer_config": {"1": {"head_dim": 32}, "3": {"head_dim": 64}}},
            "per_layer_config gives the full layers 2 different",
        ),
        (
            {"num_experts": None, **{k: v for k, v in MOE.items() if k != "num_experts"}},
            "enable_moe_block is true but num_experts is missing",
        ),
        ({**MOE, "top_k_experts": 5}, "top_k_experts 5 exceeds num_experts 4"),
        ({"num_kv_shared_layers": 6}, "num_kv_shared_layers 6 leaves no layer to share from"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention is 'all'"),
    ],
)
def test_bad_config_is_one_clear_line(changes, message, gemma4):
    raw = {**json.loads((gemma4 / "config.json").read_text()), **changes}
    with pytest.raises((ConfigError, UnsupportedModelError), match=message):
        FAMILIES["gemma4_text"].parse_config(raw)


def test_moe_bundle_generates_like_transformers_with_og_generator_and_engine(tmp_path):
    """The MoE layout's bundle (its GeGLU experts expanded to standard ops on cpu): og's greedy
    tokens and og.Engine's batch of prompts of different lengths equal transformers'."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma4_text", **MOE)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    model = load_model(folder)
    expected = hf_greedy_tokens(ckpt, PROMPT, 16)
    assert greedy_tokens(model, PROMPT, len(PROMPT) + 16) == expected
    rows, failures = engine_tokens(model, PROMPTS, 8)
    assert failures == []
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in PROMPTS]


def test_og_engine_batches_prompts_of_different_lengths_like_transformers(tmp_path):
    """og.Engine places each row's keys in caches of per-layer shapes; the layers sharing a
    cache read the placed keys of their source."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma4_text")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    rows, failures = engine_tokens(load_model(folder), PROMPTS, 8)
    assert failures == []
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in PROMPTS]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_int4_bundle_packages_and_generates(layout, tmp_path):
    """int4 for cpu: every projection MatMulNBits, the dense layout's per-layer table too
    (GatherBlockQuantized); the MoE layout's experts 4-bit codes, a MatMulNBits per expert
    and projection on cpu (no MoE or QMoE node: onnxruntime's CPU kernels take no GeGLU
    experts; tests/quantize/test_geglu_experts.py); og generates."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma4_text", **LAYOUTS[layout])
    options = Int4Options(block_size=16)  # the tiny per-layer size (16) takes 16
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=options, quiet=True
    )
    nodes = list(ir.load(folder / "model.onnx").graph.all_nodes())
    ops = Counter(node.op_type for node in nodes)
    float_matmuls = [node for node in nodes if node.op_type == "MatMul"]
    assert "MoE" not in ops and "QMoE" not in ops
    if layout == "dense":
        # per layer q (k packed beside it in sliding layers with a cache), o, gate, up, down,
        # per-layer gate and projection; k alone in the full layers with a cache (1, 3) and v
        # in the sliding ones (0, 2); the per-layer model projection and the tied head
        assert ops["MatMulNBits"] == 6 * 7 + 4 + 2
        assert float_matmuls == []
        # the token embedding and the per-layer table, both read by the token ids
        assert ops["GatherBlockQuantized"] == 2 and ops["Gather"] == 6  # each layer's slice
    else:
        # per layer q and k (packed in the sliding layers, which have a v beside them), o,
        # gate, up, down, the router's projection; the tied head; and each expert's two
        # projections (the cpu EP's "MatMulNBits.experts"): no float MatMul, If or Loop, and
        # GatherBlockQuantized only for the token embedding
        assert ops["MatMulNBits"] == 6 * 7 + 1 + 6 * MOE["num_experts"] * 2
        assert float_matmuls == [] and "If" not in ops and "Loop" not in ops
        assert ops["GatherBlockQuantized"] == 1
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


@pytest.mark.parametrize("op_type", ["MoE", "QMoE"])
def test_onnxruntime_cpu_refuses_geglu_experts(op_type):
    """Why the "MoE.geglu" kernel row is off for every EP (and og's own builder's Gemma 4 MoE
    bundle fails on CPU): onnxruntime 1.32's CPU MoE and QMoE refuse GeGLU experts. Should a
    release take them, this fails and the row can name the EPs that run them."""
    experts, hidden, inter = 4, 32, 32
    if op_type == "MoE":
        weights = {
            "fc1": np.zeros([experts, 2 * inter, hidden], np.float32),
            "fc2": np.zeros([experts, hidden, inter], np.float32),
        }
        inputs, extra = ["x", "router", "fc1", "", "fc2"], {}
    else:
        weights = {
            "fc1": np.zeros([experts, 2 * inter, hidden // 2], np.uint8),
            "s1": np.ones([experts, 2 * inter], np.float32),
            "fc2": np.zeros([experts, hidden, inter // 2], np.uint8),
            "s2": np.ones([experts, hidden], np.float32),
        }
        inputs, extra = ["x", "router", "fc1", "s1", "", "fc2", "s2"], {"expert_weight_bits": 4}
    node = helper.make_node(
        op_type,
        inputs,
        ["y"],
        domain="com.microsoft",
        k=2,
        activation_type="geglu",
        swiglu_fusion=1,
        normalize_routing_weights=1,
        **extra,
    )
    graph = helper.make_graph(
        [node],
        "experts",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, hidden]),
            helper.make_tensor_value_info("router", onnx.TensorProto.FLOAT, [3, experts]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, hidden])],
        [onnx.numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    with pytest.raises(Exception, match="Unsupported MoE activation type: geglu"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("ep", ["cuda", "dml", "webgpu", "trt-rtx", "mlx"])
def test_gpu_graphs_run_each_layer_in_gqa_with_its_geometry(ep, gemma4, gemma4_moe):
    """The GPU EPs' graphs (their default dtype; not run here): every layer a
    GroupQueryAttention with its layer's key/value heads (one in the full layers, two in the
    sliding ones, which keep their window), and the MoE layout's GeGLU experts standard ops
    (no MoE node: no EP's kernel takes GeGLU, ep/kernels.py's "MoE.geglu")."""
    for ckpt in (gemma4, gemma4_moe):
        graph = mobius_genai.build(ckpt, ep, load_weights=False, progress=False)["model"].graph
        gqa = [node for node in graph.all_nodes() if node.op_type == "GroupQueryAttention"]
        heads = [node.attributes.get_int("kv_num_heads") for node in gqa]
        windows = [node.attributes.get_int("local_window_size", -1) for node in gqa]
        assert heads == [2, 1] * 3, ep
        assert windows == [5, -1] * 3, ep
        assert not [node for node in graph.all_nodes() if node.op_type in ("MoE", "QMoE")]


def test_absent_keys_read_as_transformers_defaults_them():
    """A config.json naming only the sizes: the layer pattern, head sizes, kv heads, per-layer
    inputs, rope and window are Gemma4TextConfig's defaults."""
    from transformers import Gemma4TextConfig

    sizes = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96}
    raw = {"model_type": "gemma4_text", "num_hidden_layers": 7, "num_attention_heads": 8, **sizes}
    ours = FAMILIES["gemma4_text"].parse_config(raw)
    theirs = Gemma4TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    layers = range(theirs.num_hidden_layers)
    assert list(ours.layer_types) == theirs.layer_types
    assert [ours.head_dim_of(i) for i in layers] == [
        theirs.per_layer_config[i].head_dim for i in layers
    ]
    assert [ours.kv_heads_of(i) for i in layers] == [
        theirs.per_layer_config[i].num_key_value_heads for i in layers
    ]
    stack = ours.per_layer_stack
    assert (stack.per_layer_size, stack.per_layer_vocab) == (
        theirs.hidden_size_per_layer_input,
        theirs.vocab_size_per_layer_input,
    )
    assert ours.sliding_window == theirs.sliding_window
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    full = theirs.rope_parameters["full_attention"]
    assert (ours.rope.type, ours.rope.theta) == (full["rope_type"], full["rope_theta"])
    assert ours.rope.partial_rotary_factor == full["partial_rotary_factor"]
    assert ours.rope_local.theta == theirs.rope_parameters["sliding_attention"]["rope_theta"]
