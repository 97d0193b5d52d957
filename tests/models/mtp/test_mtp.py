"""Multi-token-prediction heads (`mtp.*`): `package` writes mtp.onnx and genai_config's `mtp`
section; onnxruntime-genai 0.18's og.MtpGenerator decodes with them on CPU, and its tokens are
og.Generator's and transformers' greedy tokens (lossless) while the head drafts.

transformers has no MTP head (it drops `mtp.*`), so the head's math is checked by what it
predicts: a head whose weights make it copy the main model (tests/_hf.py `add_mtp_head(copy=
True)`) has every draft accepted, and the same weights in a graph built wrongly (the concat's
halves swapped: fc then reads the hidden state where it should read the token; or the two
pre-fc norms swapped) still decode losslessly, since the main model verifies every draft, but lose that acceptance: that is how a
wrong head shows.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

from mobius_genai import models, packager
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError, OptionError, UnsupportedModelError, WeightsError
from mobius_genai.models import mtp as mtp_model
from mobius_genai.models.families.scales import FINAL_SOFTCAP, GRANITE_MULTIPLIERS
from mobius_genai.runtime.generate import greedy_tokens, load_model
from mobius_genai.runtime.mtp import MtpStats, mtp_tokens
from tests._bundles import PROMPT, TOKENIZER_FILES
from tests._hf import (
    add_mtp_head,
    hf_greedy_tokens,
    load_reference_model,
    write_tiny_checkpoint,
)
from tests._ort import run_declared
from tests.conftest import TINY_QWEN2
from tests.models.families.test_qwen3_5_hub import LAYOUTS, _hub_checkpoint

NEW_TOKENS = 24
# the text layouts, and Qwen3.6's hub layout (Qwen3_5MoeForConditionalGeneration: the head's
# layer has MoE blocks; the decoder's keys, mtp_num_hidden_layers too, in text_config)
FAMILIES = ("qwen3_5_text", "qwen3_next", "qwen3_5_moe")


def _checkpoint(folder: Path, family: str, *, copy: bool = False) -> Path:
    """A tiny random checkpoint of `family` with the tiny qwen2 tokenizer and an MTP head."""
    if family in LAYOUTS:
        ckpt = _hub_checkpoint(folder, family)
    else:
        ckpt = write_tiny_checkpoint(
            folder, family, vocab_size=384, bos_token_id=381, eos_token_id=383
        )
        for name in TOKENIZER_FILES:
            shutil.copyfile(TINY_QWEN2 / name, ckpt / name)
    return add_mtp_head(ckpt, copy=copy)


def _decode(bundle: Path) -> tuple[list[int], list[int], MtpStats]:
    """og.Generator's greedy tokens, og.MtpGenerator's and the head's stats."""
    length = len(PROMPT) + NEW_TOKENS
    main = load_model(bundle)
    plain = greedy_tokens(main, PROMPT, length)
    stats = MtpStats()
    drafted = list(mtp_tokens(main, load_model(bundle, mtp_head=True), PROMPT, length, stats))
    return plain, drafted, stats


@pytest.fixture(scope="module", params=FAMILIES)
def random_head(request, tmp_path_factory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp(request.param)
    ckpt = _checkpoint(root / "ckpt", request.param)
    return ckpt, packager.package(ckpt, "cpu", root / "bundle", quiet=True), request.param


def test_bundle_has_the_head_og_opens(random_head):
    _, bundle, _ = random_head
    config = json.loads((bundle / "genai_config.json").read_text())
    model = config["model"]
    assert model["decoder"]["outputs"]["hidden_states"] == "hidden_states"
    assert model["mtp"]["filename"] == "mtp.onnx" and (bundle / "mtp.onnx").is_file()
    assert model["mtp"]["main_hidden_states"] == "hidden_states"
    assert "shared_initializers" not in model["mtp"]  # og's CPU path refuses them


def test_smoke_test_runs_the_head_and_the_card_says_so(random_head):
    _, bundle, _ = random_head
    smoke = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    measured = smoke["mtp"]
    assert measured["draft_tokens"] == 4 and measured["proposed"] > 0
    assert measured["same_tokens"]
    card = (bundle / "README.md").read_text()
    assert "## Multi-token prediction" in card
    assert f"Accepted: {measured['accepted']} of {measured['evaluated']} drafts" in card


def test_mtp_generator_is_lossless_and_drafts(random_head):
    """og.MtpGenerator's tokens == og.Generator's == transformers' greedy, with drafts."""
    ckpt, bundle, family = random_head
    model_class = LAYOUTS[family][1] if family in LAYOUTS else AutoModelForCausalLM
    plain, drafted, stats = _decode(bundle)
    expected = hf_greedy_tokens(
        ckpt, PROMPT, NEW_TOKENS, stop_at_eos=False, model_class=model_class
    )
    assert drafted == plain == expected
    assert stats.proposed > 0 and stats.evaluated > 0


@pytest.fixture(scope="module")
def copy_checkpoint(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("copy") / "ckpt", "qwen3_5_text", copy=True)


def _prefill_outputs(bundle: Path, *names: str) -> list[np.ndarray]:
    """og.Generator's outputs `names` after it appends PROMPT (one prefill)."""
    model = og.Model(str(bundle))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    return [np.asarray(generator.get_output(name)) for name in names]


def _swapped_halves(self, op, input_ids, hidden_states, attention_mask, position_ids, past):
    """A wrong head: the concat's halves swapped (hidden state first)."""
    embedded = self.pre_fc_norm_embedding(op, self.embed_tokens(op, input_ids))
    hidden = self.pre_fc_norm_hidden(op, hidden_states)
    joined = self.fc(op, op.Concat(hidden, embedded, axis=-1))
    return mtp_model.TextModel.forward(
        self, op, input_ids, attention_mask, position_ids, past, embeds=joined
    )


def _swapped_norms(self, op, input_ids, hidden_states, attention_mask, position_ids, past):
    """A wrong head: each pre-fc norm applied to the other input."""
    embedded = self.pre_fc_norm_hidden(op, self.embed_tokens(op, input_ids))
    hidden = self.pre_fc_norm_embedding(op, hidden_states)
    joined = self.fc(op, op.Concat(embedded, hidden, axis=-1))
    return mtp_model.TextModel.forward(
        self, op, input_ids, attention_mask, position_ids, past, embeds=joined
    )


def test_a_head_that_copies_the_model_is_always_accepted(copy_checkpoint, tmp_path):
    bundle = packager.package(copy_checkpoint, "cpu", tmp_path / "bundle", quiet=True)
    plain, drafted, stats = _decode(bundle)
    assert drafted == plain
    assert stats.evaluated > 0 and stats.acceptance == 1.0
    assert "(100%) on the smoke prompt" in (bundle / "README.md").read_text()


@pytest.mark.parametrize("wrong", [_swapped_halves, _swapped_norms])
def test_a_wrong_head_is_lossless_but_loses_acceptance(
    wrong, copy_checkpoint, tmp_path, monkeypatch
):
    monkeypatch.setattr(mtp_model.MtpHead, "forward", wrong)
    bundle = packager.package(copy_checkpoint, "cpu", tmp_path / "bundle", quiet=True)
    plain, drafted, stats = _decode(bundle)
    assert drafted == plain
    assert stats.evaluated > 0 and stats.acceptance < 0.5


def _edited(ckpt: Path, folder: Path, **tensors: np.ndarray) -> Path:
    shutil.copytree(ckpt, folder)
    stored = load_file(folder / "model.safetensors")
    stored.update(tensors)
    save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(
    ("tensors", "config", "error", "match"),
    [
        (
            {"mtp.fc.weight": np.zeros((64, 64), np.float32)},
            {},
            WeightsError,
            r"mtp\.fc\.weight",
        ),
        (
            {"mtp.layers.1.input_layernorm.weight": np.zeros(64, np.float32)},
            {},
            WeightsError,
            r"reads no tensor.*mtp\.layers\.1\.input_layernorm",
        ),
        ({}, {"mtp_num_hidden_layers": 2}, UnsupportedModelError, "mtp_num_hidden_layers is 2"),
        (
            {},
            {"mtp_use_dedicated_embeddings": True},
            UnsupportedModelError,
            "mtp_use_dedicated_embeddings",
        ),
    ],
    ids=["fc-shape", "extra-layer", "two-layers", "dedicated-embeddings"],
)
def test_bad_heads_are_refused_in_one_line(random_head, tmp_path, tensors, config, error, match):
    ckpt = _edited(random_head[0], tmp_path / "ckpt", **tensors)
    raw = json.loads((ckpt / "config.json").read_text())
    raw.get("text_config", raw).update(config)  # where the decoder's keys are
    (ckpt / "config.json").write_text(json.dumps(raw))
    out = tmp_path / "bundle"
    with pytest.raises(error, match=match) as raised:
        packager.package(ckpt, "cpu", out, quiet=True)
    assert "\n" not in str(raised.value)
    assert not out.exists()


def test_a_head_refuses_a_pruned_lm_head(random_head, tmp_path):
    """og.MtpGenerator reads the logits of every verified position."""
    out = tmp_path / "bundle"
    with pytest.raises(OptionError, match="prune_lm_head") as raised:
        packager.package(random_head[0], "cpu", out, quiet=True, prune_lm_head=True)
    assert "\n" not in str(raised.value) and not out.exists()


def test_a_checkpoint_without_the_config_key_builds_no_head(random_head, tmp_path):
    """config.json without mtp_num_hidden_layers: the mtp.* tensors are left unread."""
    ckpt = _edited(random_head[0], tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    del config.get("text_config", config)["mtp_num_hidden_layers"]
    (ckpt / "config.json").write_text(json.dumps(config))
    bundle = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True, smoke_test=False)
    assert "mtp" not in json.loads((bundle / "genai_config.json").read_text())["model"]
    assert not (bundle / "mtp.onnx").exists()


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("mtp", "filename", "absent.onnx", r"model\.mtp\.filename: 'absent\.onnx' is not a file"),
        ("mtp", "main_hidden_states", "h", r"model\.decoder\.outputs\.hidden_states: 'h'"),
        ("mtp.inputs", "hidden_states", "h", r"model\.mtp\.inputs\.hidden_states: 'h' is not"),
        ("mtp.outputs", "hidden_states", "h", r"model\.mtp\.outputs\.hidden_states: 'h' is not"),
    ],
)
def test_validate_checks_the_mtp_section(random_head, tmp_path, section, key, value, match):
    bundle = shutil.copytree(random_head[1], tmp_path / "bundle")
    config = json.loads((bundle / "genai_config.json").read_text())
    entry = config["model"]
    for part in section.split("."):
        entry = entry[part]
    entry[key] = value
    (bundle / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(BundleError, match=match):
        validate_bundle(bundle, check_hashes=False)


def test_the_decoders_hidden_states_are_transformers_last_hidden_state(random_head):
    """The head reads the decoder's post-final-norm hidden states (f32, within 1e-4)."""
    ckpt, bundle, family = random_head
    (ours,) = _prefill_outputs(bundle, "hidden_states")
    hub = family in LAYOUTS
    reference = load_reference_model(ckpt, LAYOUTS[family][1] if hub else AutoModelForCausalLM)
    text_model = reference.model.language_model if hub else reference.model
    with torch.no_grad():
        theirs = text_model(input_ids=torch.tensor([PROMPT])).last_hidden_state.numpy()
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= 1e-4


#: The head transforms the main decoder applies to its logits, on a head that copies the main
#: model: config.json's final_logit_softcapping and logits_scaling, read here as gemma's and
#: granite's rows read them (no family with an MTP head reads either).
_HEAD_TRANSFORMS = {"final_logit_softcapping": 12.0, "logits_scaling": 0.5}


@pytest.fixture(scope="module")
def transformed_head(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("transformed")
    ckpt = _checkpoint(root / "ckpt", "qwen3_5_text", copy=True)
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, **_HEAD_TRANSFORMS}))
    row = models.FAMILIES["qwen3_5_text"]
    scaled = {
        **row.config_overrides,
        **FINAL_SOFTCAP,
        "logits_scaling": GRANITE_MULTIPLIERS["logits_scaling"],
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            models.FAMILIES, row.model_type, dataclasses.replace(row, config_overrides=scaled)
        )
        bundle = packager.package(ckpt, "cpu", root / "bundle", quiet=True)
    return ckpt, bundle


def test_the_heads_logits_take_the_main_models_head_transforms(transformed_head):
    """A head that copies the model predicts, from (t_{i+1}, h_i), the main model's logits at
    position i + 1: scaled and softcapped as those are (the main model's logits are float16
    beside a head: models/causal_lm.py `_logits_for_mtp`)."""
    import onnxruntime as ort

    _, bundle = transformed_head
    outputs = _prefill_outputs(bundle, "logits", "hidden_states")
    main, hidden = (np.asarray(output, np.float32) for output in outputs)
    session = ort.InferenceSession(str(bundle / "mtp.onnx"), providers=["CPUExecutionProvider"])
    steps = len(PROMPT) - 1
    feeds = {
        "input_ids": np.array([PROMPT[1:]], np.int64),
        "hidden_states": hidden[:, :steps],
        "attention_mask": np.ones((1, steps), np.int64),
        "position_ids": np.arange(steps, dtype=np.int64)[None],
    }
    for value in session.get_inputs():
        if value.name.startswith("past_key_values."):
            _, heads, _, width = value.shape
            feeds[value.name] = np.zeros((1, heads, 0, width), np.float32)
    head = run_declared(session, feeds)["logits"]
    cap = _HEAD_TRANSFORMS["final_logit_softcapping"]
    assert np.abs(main).max() > 0.6 * cap  # tanh bends these logits by a tenth and more
    np.testing.assert_allclose(head, main[:, 1:], atol=2e-3 * cap, rtol=0)


def test_mtp_greedy_with_head_transforms_is_og_and_transformers_greedy(transformed_head):
    """Scaled and capped logits keep their order: og.MtpGenerator's tokens are og.Generator's
    and transformers' (which reads neither key for Qwen3.5), every draft accepted."""
    ckpt, bundle = transformed_head
    plain, drafted, stats = _decode(bundle)
    assert drafted == plain == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS, stop_at_eos=False)
    assert stats.evaluated > 0 and stats.acceptance == 1.0
