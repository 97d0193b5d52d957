"""A nemotron_h model with no attention layer (Mamba2, MLP and MoE layers only): a decoder
with no KV cache at all, only conv and scan states. onnxruntime-genai 0.18 runs it: its
genai_config still names the KV patterns, from which og derives the states' names
(config/recurrent.py's FROM_KV_NAMES), though no graph input matches them.

transformers 5.25's cached forward fails on such a model (its cache holds no attention
layer for `create_causal_mask`'s sizes: "get_mask_sizes can only be called on Attention
layers"), so the reference here is its uncached forward over the whole sequence at each step.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

import mobius_genai
from mobius_genai import packager
from mobius_genai.bundle.validate import validate_bundle
from tests._bundles import NEW_TOKENS, PROMPT, batch_greedy_tokens, bundle_checkpoint
from tests._hf import ReferenceRun, ReferenceStep, load_reference_model, write_tiny_checkpoint
from tests._ort import max_abs_diff, og_sequence, ort_session, run_like_reference

TOLERANCE = 1e-4  # f32
#: Mamba2, MLP, MoE, Mamba2: no "*" layer
LAYERS = ["linear_attention", "mlp", "moe", "linear_attention"]
MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def _uncached_reference(ckpt, ids: np.ndarray, decode_steps: int) -> ReferenceRun:
    """A prefill and greedy decode steps, each step's logits from transformers' forward over
    the whole sequence so far without a cache (the last position's for a decode step)."""
    model = load_reference_model(ckpt)
    tokens = torch.tensor(ids)
    steps = []
    with torch.no_grad():
        for step in range(decode_steps + 1):
            logits = model(input_ids=tokens, use_cache=False).logits.float().numpy()
            new = tokens.shape[1] if step == 0 else 1
            total = tokens.shape[1]
            steps.append(
                ReferenceStep(
                    input_ids=tokens[:, total - new :].numpy(),
                    attention_mask=np.ones((tokens.shape[0], total), np.int64),
                    position_ids=np.arange(total - new, total)[None].repeat(tokens.shape[0], 0),
                    logits=logits[:, total - new :],
                )
            )
            tokens = torch.cat([tokens, torch.tensor(logits[:, -1].argmax(-1))[:, None]], 1)
    return ReferenceRun(steps)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron_h_no_attention") / "ckpt"
    return write_tiny_checkpoint(folder, "nemotron_h", seed=4, layers_block_type=LAYERS, **MOE)


@pytest.mark.parametrize("ep", ["default", "cpu", "onnx-standard"])
def test_graph_of_states_alone_matches_transformers(checkpoint, ep, tmp_path):
    """No past_key_values input at all, and the states carried through decode steps give
    transformers' logits."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    reference = _uncached_reference(checkpoint, ids, decode_steps=3)
    package = mobius_genai.build(checkpoint, ep, "f32", progress=False)
    inputs = {value.name for value in package["model"].graph.inputs}
    assert not {name for name in inputs if name.endswith((".key", ".value"))}
    assert {name for name in inputs if name.endswith("conv_state")} == {
        "past_key_values.0.conv_state",
        "past_key_values.3.conv_state",
    }
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron_h_no_attention_bundle")
    ckpt = bundle_checkpoint(folder / "ckpt", "nemotron_h", layers_block_type=LAYERS, **MOE)
    return ckpt, packager.package(ckpt, "cpu", folder / "bundle", quiet=True)


def test_og_greedy_tokens_equal_transformers(bundle):
    ckpt, folder = bundle
    # og.Model and og.Generator as a user runs them (default search: greedy)
    ours = og_sequence(folder, PROMPT, len(PROMPT) + NEW_TOKENS)[len(PROMPT) :]
    reference = _uncached_reference(ckpt, np.array([PROMPT]), NEW_TOKENS - 1)
    expected = [int(step.logits[0, -1].argmax()) for step in reference.steps]
    assert ours == expected
    assert len(set(ours)) > 4  # a real continuation, not one token repeated


def test_genai_config_names_the_kv_patterns_the_states_derive_from(bundle):
    """og derives past_key_values.%d.conv_state from past_key_values.%d.key; the bundle
    validates, and its graph has the states' names and no KV name."""
    _, folder = bundle
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    validate_bundle(folder)
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    names = {value.name for value in graph.input} | {value.name for value in graph.output}
    assert "present.3.recurrent_state" in names
    assert not any(name.endswith((".key", ".value")) for name in names)


def test_og_generates_a_batch_of_prompts_of_different_lengths(bundle):
    """og pads the shorter prompt on the right; with no KV cache the padding still stays out
    of its states: each row continues as transformers continues that prompt alone."""
    ckpt, folder = bundle
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    expected = [
        [
            int(step.logits[0, -1].argmax())
            for step in _uncached_reference(ckpt, np.array([p]), 7).steps
        ]
        for p in prompts
    ]
    assert rows == expected
