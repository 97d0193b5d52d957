"""PEFT's rank_pattern and alpha_pattern: ranks and scales per module, matched as PEFT matches
them; og greedy with such an adapter active equals transformers' PeftModel."""

from __future__ import annotations

import json

import onnxruntime_genai as og
import pytest

from mobius_genai import packager
from mobius_genai.errors import MobiusError
from tests.adapters.conftest import NEW_TOKENS, PROMPT, make_adapter, peft_greedy
from tests.adapters.test_lora_bundle import _greedy
from tests.adapters.test_lora_errors import _copy, _one_line

#: down_proj of layer 1 only (a pattern longer than the leaf name), q_proj and v_proj everywhere.
RANKS = {"q_proj": 8, r"layers\.1\.mlp\.down_proj": 2}
ALPHAS = {"v_proj": 40, "o_proj": 1}


@pytest.fixture(scope="module")
def patterned(qwen2_lora, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-patterns")
    adapter = make_adapter(
        qwen2_lora.checkpoint, root / "patterned", 4, 3, rank_pattern=RANKS, alpha_pattern=ALPHAS
    )
    bundle = packager.package(
        qwen2_lora.checkpoint,
        "cpu",
        root / "bundle",
        adapters={"p": adapter},
        quiet=True,
        smoke_test=False,
    )
    return adapter, bundle


def test_og_greedy_with_patterns_equals_peft(qwen2_lora, patterned):
    adapter, bundle = patterned
    model = og.Model(str(bundle))
    adapters = og.Adapters(model)
    adapters.load(str(bundle / "adapters" / "p.onnx_adapter"), "p")
    expected = peft_greedy(qwen2_lora.checkpoint, adapter, PROMPT, NEW_TOKENS)
    assert _greedy(model, adapters, "p") == expected
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["lora"]["adapters"]["p"]["rank"] == 8  # the largest rank


BAD_PATTERNS = {
    "no such module": ({"rank_pattern": {"qkv_proj": 8}}, "rank_pattern 'qkv_proj' matches none"),
    "not a regex": ({"alpha_pattern": {"q_proj(": 8}}, "alpha_pattern 'q_proj(' is no regular"),
    "rank not an int": ({"rank_pattern": {"q_proj": 2.5}}, "accepted: module name patterns to"),
    "rank unlike the tensors": ({"rank_pattern": {"q_proj": 16}}, "lora_A has rank 8, adapter"),
}


@pytest.mark.parametrize("case", sorted(BAD_PATTERNS))
def test_bad_patterns_refused_before_the_build(qwen2_lora, patterned, tmp_path, case):
    changes, said = BAD_PATTERNS[case]
    bad = _copy(patterned[0], tmp_path / "bad", changes)
    out = tmp_path / "bundle"
    with pytest.raises(MobiusError) as caught:
        packager.package(qwen2_lora.checkpoint, "cpu", out, adapters={"x": bad}, quiet=True)
    assert said in _one_line(caught.value)
    assert not out.exists()
