"""`package --prune-lm-head`: logits for each sequence's last token only (off by default).

og.Generator reads one row of logits per sequence; the pruned bundle must give the same
greedy tokens as a bundle with every position's logits, for one prompt and for a batch of
prompts of different lengths (which onnxruntime-genai pads on the right), fp32 and int4, and
its manifest and card must name the onnxruntime-genai APIs it gives up.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime_genai as og
import pytest

from mobius_genai import packager
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.og_support import ALL_LOGITS, ENGINE, NGRAM
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from mobius_genai.runtime.generate import greedy_tokens
from tests.conftest import TINY_QWEN2

PROMPTS = ["The capital of France is", "Hi", "Once upon a time there"]


def _package(tmp_path: Path, ep: str, prune: bool, precision: str = "fp32") -> Path:
    out = tmp_path / f"{ep}-{precision}-{'pruned' if prune else 'full'}"
    return packager.package(
        TINY_QWEN2, ep, out, precision=precision, prune_lm_head=prune, quiet=True
    )


def _logits_positions(folder: Path) -> object:
    return GraphInfo.from_file(folder / "model.onnx").outputs["logits"].shape[1]


def _batched_tokens(folder: Path, max_length: int = 24) -> list[list[int]]:
    model = og.Model(str(folder))
    ids = og.Tokenizer(model).encode_batch(PROMPTS)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(PROMPTS))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("ep", ["cpu", "default"])
def test_pruned_bundle_generates_what_the_full_one_does(tmp_path: Path, ep: str):
    pruned, full = _package(tmp_path, ep, True), _package(tmp_path, ep, False)
    validate_bundle(pruned)
    assert _logits_positions(pruned) == 1
    assert _logits_positions(full) == "sequence_length"
    manifest = json.loads((pruned / "mobius_manifest.json").read_text())
    assert manifest["build"]["optimization"]["PruneLmHead"] == 2
    prompt = [int(t) for t in og.Tokenizer(og.Model(str(full))).encode(PROMPTS[0])]
    ours = greedy_tokens(og.Model(str(pruned)), prompt, len(prompt) + 24)
    assert len(ours) == 24
    assert ours == greedy_tokens(og.Model(str(full)), prompt, len(prompt) + 24)
    # A right-padded batch: each sequence continues from its own last token.
    batched = _batched_tokens(pruned)
    assert batched == _batched_tokens(full)
    model = og.Model(str(pruned))
    tokenizer = og.Tokenizer(model)
    prompts = [[int(t) for t in tokenizer.encode(text)] for text in PROMPTS]
    padded = max(len(ids) for ids in prompts)
    for alone, sequence in zip(prompts, batched, strict=True):
        assert sequence[padded : padded + 4] == greedy_tokens(model, alone, len(alone) + 4)


def test_int4_pruned_bundle_generates_what_the_full_one_does(tmp_path: Path):
    """Also: calibration measures the pruned graph over every position (its last-token
    gathers pass all rows through), so both bundles hold the very same int4 weights."""
    pruned = _package(tmp_path, "cpu", True, "int4")
    full = _package(tmp_path, "cpu", False, "int4")
    assert _logits_positions(pruned) == 1
    assert _batched_tokens(pruned) == _batched_tokens(full)
    weights = [_weights(folder) for folder in (pruned, full)]
    assert weights[0].keys() == weights[1].keys() and len(weights[0]) >= 10
    for name, values in weights[0].items():
        np.testing.assert_array_equal(values, weights[1][name], err_msg=name)


def _weights(folder: Path) -> dict[str, np.ndarray]:
    graph = onnx.load(str(folder / "model.onnx"))
    return {
        tensor.name: onnx.numpy_helper.to_array(tensor)
        for tensor in graph.graph.initializer
        if tensor.data_type == onnx.TensorProto.UINT8
    }


def test_cli_keeps_every_position_unless_asked_to_prune(tmp_path: Path, capsys):
    args = ["package", str(TINY_QWEN2), "--ep", "cpu", "--quiet", "--no-smoke-test"]
    assert main([*args, "-o", str(tmp_path / "default")]) == 0
    assert _logits_positions(tmp_path / "default") == "sequence_length"
    assert main([*args, "-o", str(tmp_path / "full"), "--full-logits"]) == 0
    assert _logits_positions(tmp_path / "full") == "sequence_length"
    assert main([*args, "-o", str(tmp_path / "pruned"), "--prune-lm-head"]) == 0
    assert _logits_positions(tmp_path / "pruned") == 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "-o", str(tmp_path / "both"), "--prune-lm-head", "--full-logits"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_pruned_bundle_names_the_apis_it_gives_up(tmp_path: Path, bundle_copy):
    """The manifest records og_limits and the card shows them; a full bundle gives up none."""
    pruned = _package(tmp_path, "cpu", True)
    limits = json.loads((pruned / "mobius_manifest.json").read_text())["build"]["og_limits"]
    assert set(limits) == {ENGINE, NGRAM, ALL_LOGITS}
    card = (pruned / "README.md").read_text()
    assert "**Not**: og.Engine, n-gram speculative decoding" in card and "prune-lm-head" in card
    full = bundle_copy("cpu")
    assert json.loads((full / "mobius_manifest.json").read_text())["build"]["og_limits"] == {}
    assert "every 0.18 API" in (full / "README.md").read_text()
    manifest = json.loads((full / "mobius_manifest.json").read_text())
    manifest["build"]["og_limits"] = limits  # a manifest that says what the bundle is not
    (full / "mobius_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"build\.og_limits names \['Generator"):
        validate_bundle(full, check_hashes=False)


def test_transformers_parity_builds_keep_every_position():
    """build() (what parity checks use) keeps every position unless asked."""
    import mobius_genai

    built = mobius_genai.build(TINY_QWEN2, "cpu", "f32", load_weights=False)
    logits = next(v for v in built["model"].graph.outputs if v.name == "logits")
    assert str(logits.shape[1]) == "sequence_length"
    pruned = mobius_genai.build(TINY_QWEN2, "cpu", "f32", load_weights=False, prune_lm_head=True)
    logits = next(v for v in pruned["model"].graph.outputs if v.name == "logits")
    assert logits.shape[1] == 1
    assert np.isscalar(logits.shape[1])
