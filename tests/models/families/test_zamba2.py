"""Zamba2 (Mamba2 layers, and hybrid layers that first invoke one of two shared transformer
blocks in turn: tests/_hf.py's tiny row): a 12-token prefill and cached decode steps against
transformers on the portable and cpu graphs, and a left-padded batch; each shared block stored
once and read by each of its invocations, each invocation with its own KV cache and adapters;
a graph without the embeddings beside the hidden state, without the adapters, or with the
blocks' weights swapped fails; refused configs; the GPU EP graphs. Slow: onnxruntime-genai's
greedy tokens alone and in a batch of prompts of different lengths (also test_bundles.py's
test over every family), and an int4 bundle.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import ConfigError, UnsupportedModelError, packager
from mobius_genai.bundle.og_support import BEAM, ENGINE, NGRAM, REWIND, bundle_og_limits
from mobius_genai.components import shared_blocks
from mobius_genai.models import get_family
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime import smoke_plan
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, batch_greedy_tokens, bundle_checkpoint
from tests._hf import hf_greedy_tokens, hf_reference_logits, write_tiny_checkpoint
from tests._ort import graph_diffs, left_padded_diffs, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4  # f32, max abs diff of logits over the prefill and every decode step
HYBRID = (1, 3, 4)  # the tiny row's hybrid layers: invocations 0, 1, 2 of blocks 0, 1, 0
SHARED = "model.layers.{}.shared_transformer."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("zamba2") / "ckpt", "zamba2", seed=1)


@pytest.fixture(scope="module")
def reference(checkpoint):
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    return hf_reference_logits(checkpoint, ids, decode_steps=4)


def test_prefill_and_decode_match_transformers(checkpoint, reference, tmp_path):
    diffs = graph_diffs(checkpoint, reference, ("default", "cpu"), tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.slow
def test_one_block_without_attention_adapters_or_rotary_matches_transformers(tmp_path):
    """Zamba2-2.7B's switches: every invocation runs one block, adapters on gate_up alone, no
    rotary in the blocks, no biases."""
    changes = {
        "num_mem_blocks": 1,
        "use_shared_attention_adapter": False,
        "use_mem_rope": False,
        "add_bias_linear": False,
    }
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "zamba2", seed=2, **changes)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(ckpt, ids, decode_steps=4)
    diffs = graph_diffs(ckpt, reference, ("default", "cpu"), tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_left_padded_batch_matches_transformers(checkpoint, tmp_path):
    """Padding stays out of the Mamba2 states while each invocation's attention masks it."""
    first, rest = left_padded_diffs(checkpoint, tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def test_each_shared_block_is_stored_once_and_each_invocation_caches_apart(checkpoint):
    graph = mobius_genai.build(checkpoint, "cpu", "f32", load_weights=False, progress=False)[
        "model"
    ].graph
    shared = [name for name in graph.initializers if ".shared_transformer." in name]
    # block 0 under layer 1 (its first invocation), block 1 under layer 3; layer 4 owns none
    assert {name.split(".")[2] for name in shared} == {"1", "3"}
    q_proj = graph.initializers[SHARED.format(1) + "self_attn.q_proj.weight"]
    assert len(q_proj.uses()) == 2  # invocations 0 and 2
    # invocation 2's adapters belong to block 0, named as the checkpoint names them
    adapter = SHARED.format(1) + "feed_forward.gate_up_proj_adapter_list.2.0.weight"
    assert len(graph.initializers[adapter].uses()) == 1
    caches = {value.name for value in graph.inputs if value.name.startswith("past_")}
    states = ("conv_state", "recurrent_state")
    assert caches == {
        *(f"past_key_values.{i}.{kind}" for i in HYBRID for kind in ("key", "value")),
        *(f"past_key_values.{i}.{state}" for i in range(5) for state in states),
    }
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 3 and ops.count("LinearAttention") == 5


def _swapped_blocks(checkpoint, folder):
    """A copy of the checkpoint with blocks 0 and 1 (their shared weights, not the
    invocations' adapters) swapped: what reading the blocks in the wrong order computes."""
    shutil.copytree(checkpoint, folder)
    tensors = load_file(folder / "model.safetensors")
    first, second = SHARED.format(1), SHARED.format(3)
    for name in [n for n in tensors if n.startswith(first) and "adapter_list" not in n]:
        other = second + name[len(first) :]
        tensors[name], tensors[other] = tensors[other], tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_og_lora_inputs_of_a_shared_projection_are_one_pair_read_by_each_invocation(checkpoint):
    """PEFT wraps the one q_proj a block's invocations share: og's adapter feeds one pair."""
    graph = mobius_genai.build(
        checkpoint, "default", "f32", load_weights=False, lora_targets=("q_proj",), progress=False
    )["model"].graph
    inputs = {value.name: value for value in graph.inputs if "lora" in value.name}
    assert len(inputs) == 4  # blocks 0 and 1
    assert len(inputs[SHARED.format(1) + "self_attn.q_proj.lora_A"].uses()) == 2


def test_a_checkpoint_storing_each_invocations_copy_of_its_block_builds(checkpoint, tmp_path):
    """transformers ties a block's later invocations to its first; a checkpoint that stores
    their copies anyway (equal) builds the same graph, reading the first."""
    folder = shutil.copytree(checkpoint, tmp_path / "copies")
    tensors = load_file(folder / "model.safetensors")
    owner = SHARED.format(1)
    for name in [n for n in tensors if n.startswith(owner)]:
        tensors[SHARED.format(4) + name[len(owner) :]] = tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    graph = mobius_genai.build(folder, "default", "f32", progress=False)["model"].graph
    assert not [name for name in graph.initializers if name.startswith(SHARED.format(4))]


def _mutated(op_name, monkeypatch):
    if op_name == "embeddings_not_concatenated":
        monkeypatch.setattr(
            shared_blocks, "block_input", lambda op, hidden, _: op.Concat(hidden, hidden, axis=-1)
        )
    elif op_name == "adapters_dropped":
        original = shared_blocks._Adapter.forward

        def dropped(self, op, x):
            y = original(self, op, x)
            return y if y is None else op.Sub(y, y)

        monkeypatch.setattr(shared_blocks._Adapter, "forward", dropped)


@pytest.mark.parametrize(
    "mutant", ["embeddings_not_concatenated", "adapters_dropped", "blocks_swapped"]
)
def test_a_mechanism_changed_fails_parity(checkpoint, reference, mutant, monkeypatch, tmp_path):
    built = checkpoint
    if mutant == "blocks_swapped":
        built = _swapped_blocks(checkpoint, tmp_path / "swapped")
    _mutated(mutant, monkeypatch)
    package = mobius_genai.build(built, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert not max_abs_diff(ours, reference.logits) <= 10 * TOLERANCE


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"num_key_value_heads": 2},
            UnsupportedModelError,
            "num_key_value_heads is 2 with use_shared_attention_adapter; accepted: "
            "num_attention_heads (4)",
        ),
        (
            {"layers_block_type": ["mamba", "hybrid", "attention", "hybrid", "hybrid"]},
            ConfigError,
            "layers_block_type is",
        ),
        ({"layers_block_type": ["hybrid"]}, ConfigError, "accepted: a list of 5 of"),
    ],
)
def test_a_config_the_row_cannot_build_is_refused_in_one_line(checkpoint, changes, error, message):
    raw = {**json.loads((checkpoint / "config.json").read_text()), **changes}
    with pytest.raises(error, match=re.escape(message)) as raised:
        get_family("zamba2").parse_config(raw)
    assert "\n" not in str(raised.value)


def test_zamba_v1_is_refused_in_one_line():
    with pytest.raises(UnsupportedModelError, match="model_type 'zamba' is not supported") as e:
        get_family("zamba")
    assert "\n" not in str(e.value)


def test_the_row_reads_zamba2_layouts_as_transformers_does(checkpoint):
    """Zamba2Config's facts: heads of 2 x hidden / heads scaled by (head_dim / 2) ** -0.5,
    rotary only with use_mem_rope, the Mamba2 conv biased whatever use_conv_bias says, the
    blocks' count and adapters."""
    raw = json.loads((checkpoint / "config.json").read_text())
    config = get_family("zamba2").parse_config(raw)
    assert (config.head_dim, config.scale) == (8, 4**-0.5)
    assert config.layer_types == ("mamba2", "full_attention", "mamba2") + ("full_attention",) * 2
    assert config.shared_blocks.hybrid_layers == HYBRID and config.shared_blocks.count == 2
    off = get_family("zamba2").parse_config(
        {**raw, "use_mem_rope": False, "use_conv_bias": False, "num_mem_blocks": 1}
    )
    assert off.no_rope_layers == tuple(range(5)) and off.mamba2.conv_bias
    assert [off.shared_blocks.block_of(j) for j in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(
    "ep",
    [
        "cuda",
        pytest.param("dml", marks=pytest.mark.slow),
        pytest.param("webgpu", marks=pytest.mark.slow),
    ],
)
def test_gpu_ep_graphs_attend_with_group_query_attention(checkpoint, ep):
    """Each invocation's attention becomes GroupQueryAttention (float16); the Mamba2 mixers
    keep their conv op and run their scan as its standard body."""
    graph = mobius_genai.build(checkpoint, ep, "f16", load_weights=False, progress=False)[
        "model"
    ].graph
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 3 and "Attention" not in ops
    assert ops.count("CausalConvWithState") == 5 and ops.count("Scan") == 5


@pytest.mark.slow
def test_bundle_generates_like_transformers_alone_and_in_a_batch(tmp_path):
    """og.Generator's greedy tokens are transformers', for one prompt and for a batch of two of
    different lengths; og refuses its Engine, beam search, n-gram decoding and rewind for the
    Mamba2 states, as for the other Mamba2 hybrids."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "zamba2")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 16)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, 16) and len(ours) == 16
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in prompts]
    assert set(bundle_og_limits(folder)) == {ENGINE, BEAM, NGRAM, REWIND}


@pytest.mark.slow
def test_int4_bundle_stores_each_shared_projection_once_and_generates(tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "zamba2")
    folder = packager.package(
        ckpt,
        "cpu",
        tmp_path / "bundle",
        precision="int4",
        int4=Int4Options(block_size=16),
        quiet=True,
    )
    model = ir.load(folder / "model.onnx")
    readers = [
        node.inputs[1].name for node in model.graph.all_nodes() if node.op_type == "MatMulNBits"
    ]
    shared = SHARED.format(1) + "self_attn.q_proj.weight_Q4"
    assert readers.count(shared) == 2 and shared in model.graph.initializers
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


@pytest.mark.slow
def test_a_twin_of_the_first_layers_reads_its_blocks_and_their_adapters(
    tmp_path, capsys, monkeypatch
):
    """Where memory is short the smoke test runs the first two layers: a Mamba2 layer and the
    first invocation of block 0, which still reads every invocation's adapters of it."""
    monkeypatch.setattr(smoke_plan, "available_memory", lambda: 400 << 20)
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "zamba2")
    packager.package(ckpt, "cpu", tmp_path / "bundle")
    assert "smoke test on a twin bundle of the first 2 of 5 layers" in capsys.readouterr().err
