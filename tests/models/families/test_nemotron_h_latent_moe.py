"""Nemotron-3 Super's latent MoE in nemotron_h (transformers 5.25's NemotronHMoE with
`moe_latent_size`): the routed experts read fc1_latent_proj(x) and their weighted sum, times
the routing's scaling factor, goes back through fc2_latent_proj; the router and the shared
expert read x itself. Checked against transformers over a 70-token prefill and decode steps
on the portable, cpu and onnx-standard graphs (the projections with biases, so that where the
scaling factor applies matters), mutants that fail it, onnxruntime-genai's greedy tokens, and
int4 (the latent experts as QMoE)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai import ConfigError
from mobius_genai.components import moe as moe_component
from mobius_genai.models import get_family
from tests._hf import edit_config, write_tiny_checkpoint
from tests._ort import long_prefill_reference, mutant_diffs
from tests.models.families.test_nemotron_h_moe import (  # noqa: F401 (collected here)
    MOE_LAYERS,
    NEMOTRON3,
    test_int4_bundle_runs_the_experts_as_qmoe,
    test_long_prefill_then_decode_matches_transformers,
    test_og_greedy_tokens_equal_transformers,
    test_qmoe_computes_the_relu2_experts_its_codes_stand_for,
)

# the tests imported above run here on this module's checkpoint, long_run and bundle_config:
# the 70-token prefill and decode steps on the portable (MoE nodes with their bodies), cpu and
# onnx-standard (the bodies inlined) graphs; onnxruntime-genai's greedy tokens against
# transformers'; an int4 bundle with the latent experts as QMoE nodes that og runs, and the
# QMoE graph equal to the same graph holding the dequantized experts as float MoE nodes

TOLERANCE = 1e-4  # f32
#: NEMOTRON3 with the experts in a latent of 48 (hidden 64), the projections biased
LATENT = {**NEMOTRON3, "moe_latent_size": 48, "mlp_bias": True}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron3_super") / "ckpt"
    return write_tiny_checkpoint(folder, "nemotron_h", seed=5, **LATENT)


@pytest.fixture(scope="module")
def long_run(checkpoint):
    """transformers' chunked scan and routing over 70 tokens, then 4 decode steps."""
    return long_prefill_reference(checkpoint)


def test_the_experts_are_latent_wide_between_the_projections(checkpoint):
    """The MoE node's experts are [experts, 2 * 32, 48] and [experts, 48, 32]; the router and
    the shared expert stay hidden-wide (64)."""
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    weights = {
        name: value.const_value.numpy().shape
        for name, value in package["model"].graph.initializers.items()
    }
    layer = f"model.layers.{MOE_LAYERS[0]}.mlp"
    assert weights[f"{layer}.experts.gate_up_proj"] == (8, 64, 48)
    assert weights[f"{layer}.experts.down_proj"] == (8, 48, 32)
    assert weights[f"{layer}.fc1_latent_proj.weight"] == (64, 48)
    assert weights[f"{layer}.fc2_latent_proj.bias"] == (64,)
    assert weights[f"{layer}.shared_expert.fc1.weight"] == (64, 48)


def _scaled_after_the_way_back(self, op, x):
    """The routing's scaling factor applied after fc2_latent_proj (its bias scaled too)."""
    router, factor = self.gate(op, x)
    out = self._experts(op, self.fc1_latent_proj(op, x), router, self.moe.top_k, True)
    return self._with_shared_expert(op, x, op.Mul(self.fc2_latent_proj(op, out), factor))


def _back_through_the_way_in(self, op, x):
    """fc1_latent_proj's weight, transposed, as the way back (fc2's read, times zero)."""
    router, factor = self.gate(op, x)
    out = op.Mul(self._experts(op, self.fc1_latent_proj(op, x), router, 1, True), factor)
    back = op.MatMul(out, op.Transpose(self.fc1_latent_proj.weight))
    unused = op.Mul(self.fc2_latent_proj(op, out), op.CastLike(op.Constant(value_float=0.0), x))
    return self._with_shared_expert(op, x, op.Add(back, unused))


#: mutant → (module or class, attribute, replacement)
MUTANTS = {
    "scaling_after_the_way_back": (moe_component.MoEBlock, "forward", _scaled_after_the_way_back),
    "way_back_swapped_for_the_way_in": (
        moe_component.MoEBlock,
        "forward",
        _back_through_the_way_in,
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mechanism_changed_fails_parity(checkpoint, long_run, mutant, monkeypatch, tmp_path):
    ids = long_run.prefill.input_ids[:, :24]
    ours, changed = mutant_diffs(
        checkpoint, ids, tmp_path, "nemotron_h", MUTANTS[mutant], monkeypatch
    )
    assert ours <= TOLERANCE and not changed <= 10 * TOLERANCE, (ours, changed)


@pytest.mark.parametrize("value", [0, -8, 2.5, "24"])
def test_a_latent_size_that_is_not_a_positive_integer_is_refused_in_one_line(checkpoint, value):
    raw = {**json.loads((checkpoint / "config.json").read_text()), "moe_latent_size": value}
    with pytest.raises(ConfigError, match="moe_latent_size") as raised:
        get_family("nemotron_h").parse_config(raw)
    assert "\n" not in str(raised.value)


def test_without_a_latent_size_the_experts_read_the_hidden_state(checkpoint):
    raw = {**json.loads((checkpoint / "config.json").read_text()), "moe_latent_size": None}
    assert get_family("nemotron_h").parse_config(raw).moe.latent_size == 0


@pytest.fixture(scope="module")
def bundle_config():
    return LATENT


def test_the_mtp_layers_are_left_out_of_the_bundle(checkpoint, tmp_path):
    """Nemotron-3 Super's MTP layers (`num_nextn_predict_layers`, tensors under `mtp.`) are
    not built: transformers 5.25's NemotronH loads none (`mtp.*` ignored), so no head could
    be checked against it. The decoder builds without them, the same as without them."""
    ckpt = shutil.copytree(checkpoint, tmp_path / "ckpt")
    edit_config(ckpt, num_nextn_predict_layers=1, mtp_layers_block_type=["attention", "moe"])
    tensors = load_file(ckpt / "model.safetensors")
    head = {"mtp.layers.0.mixer.fc1_latent_proj.weight": np.ones((48, 64), np.float32)}
    save_file({**tensors, **head}, ckpt / "model.safetensors")
    package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    assert list(package.models) == ["model"]
    weights = package["model"].graph.initializers
    assert not any(name.startswith("mtp.") for name in weights)
    assert len(weights) == len(
        mobius_genai.build(checkpoint, "cpu", "f32").models["model"].graph.initializers
    )
