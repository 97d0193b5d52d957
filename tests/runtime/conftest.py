"""Bundles of each model kind, packaged once per session for the onnxruntime-genai contract
tests (default options, no smoke test: each test runs what it checks)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime_genai as og
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
)

from mobius_genai import packager
from mobius_genai.quantize import Int4Options
from tests._bundles import TOKENIZER_FILES, bundle_checkpoint
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2


@dataclasses.dataclass(frozen=True)
class Packaged:
    bundle: Path
    checkpoint: Path


def _package(factory: pytest.TempPathFactory, checkpoint: Path, name: str, **options) -> Packaged:
    out = factory.mktemp("runtime") / name
    bundle = packager.package(checkpoint, "cpu", out, quiet=True, smoke_test=False, **options)
    return Packaged(bundle, checkpoint)


def _family(factory: pytest.TempPathFactory, family: str) -> Path:
    return bundle_checkpoint(factory.mktemp("runtime-ckpt") / family, family)


@pytest.fixture(scope="session")
def dense(packaged) -> Packaged:
    return Packaged(packaged("cpu"), TINY_QWEN2)


@pytest.fixture(scope="session")
def default_ep(packaged) -> Packaged:
    """The `default` EP: ONNX Attention, a KV cache that grows by concatenation."""
    return Packaged(packaged("default"), TINY_QWEN2)


@pytest.fixture(scope="session")
def windowed_default_ep(tmp_path_factory) -> Packaged:
    """A `default` EP gemma2 bundle: sliding-window layers (5 keys) on a concatenated cache."""
    out = tmp_path_factory.mktemp("runtime") / "gemma2-default"
    checkpoint = _family(tmp_path_factory, "gemma2")
    bundle = packager.package(checkpoint, "default", out, quiet=True, smoke_test=False)
    return Packaged(bundle, checkpoint)


@pytest.fixture(scope="session")
def dense_int4(tiny_int4) -> Packaged:
    return Packaged(tiny_int4, TINY_QWEN2)


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory) -> Path:
    return _family(tmp_path_factory, "qwen2_moe")


@pytest.fixture(scope="session")
def moe(tmp_path_factory, moe_checkpoint) -> Packaged:
    return _package(tmp_path_factory, moe_checkpoint, "qwen2_moe")


@pytest.fixture(scope="session")
def qmoe(tmp_path_factory, moe_checkpoint) -> Packaged:
    """int4 experts as QMoE (block size 16: the shared expert's 48 rows)."""
    int4 = Int4Options(block_size=16)
    return _package(tmp_path_factory, moe_checkpoint, "qmoe", precision="int4", int4=int4)


@pytest.fixture(scope="session")
def lfm2(tmp_path_factory) -> Packaged:
    return _package(tmp_path_factory, _family(tmp_path_factory, "lfm2"), "lfm2")


@pytest.fixture(scope="session")
def delta_net(tmp_path_factory) -> Packaged:
    """qwen3_5_text: gated delta nets between attention layers."""
    return _package(tmp_path_factory, _family(tmp_path_factory, "qwen3_5_text"), "qwen3_5")


def run_builder(
    factory: pytest.TempPathFactory, checkpoint: Path, name: str, *extra: str
) -> tuple[Path, subprocess.CompletedProcess]:
    """Run onnxruntime-genai's own builder for an fp32 cpu bundle of `checkpoint` (offline):
    its output folder and how the run ended."""
    out = factory.mktemp("builder") / name
    command = [sys.executable, "-I", "-m", "onnxruntime_genai.models.builder"]
    command += ["-i", str(checkpoint), "-o", str(out), "-p", "fp32", "-e", "cpu"]
    command += ["-c", str(factory.mktemp("builder-cache"))]
    if extra:
        command += ["--extra_options", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return out, subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def _builder(factory: pytest.TempPathFactory, checkpoint: Path, name: str, *extra: str) -> Path:
    """onnxruntime-genai's own builder's fp32 cpu bundle of `checkpoint` (offline)."""
    out, done = run_builder(factory, checkpoint, name, *extra)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def mamba2(tmp_path_factory) -> Packaged:
    """granitemoehybrid: Mamba2 layers between attention layers, MoE beside a shared MLP."""
    checkpoint = _family(tmp_path_factory, "granitemoehybrid")
    return _package(tmp_path_factory, checkpoint, "granitemoehybrid")


@pytest.fixture(scope="session")
def granite_micro(tmp_path_factory) -> Packaged:
    """granitemoehybrid in Granite-4.0-Micro's layout: attention layers only (with rotary), the
    shared MLP alone."""
    checkpoint = write_tiny_checkpoint(
        tmp_path_factory.mktemp("runtime-ckpt") / "granite-micro",
        "granitemoehybrid",
        seed=3,
        vocab_size=384,
        bos_token_id=381,
        eos_token_id=383,
        pad_token_id=0,
        layer_types=["attention"] * 3,
        num_local_experts=0,
        position_embedding_type="rope",
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, checkpoint / name)
    return _package(tmp_path_factory, checkpoint, "granite-micro")


@pytest.fixture(scope="session")
def builder_pruned(tmp_path_factory) -> Path:
    """The builder's tiny-qwen2 bundle with its prune_lm_head option."""
    return _builder(tmp_path_factory, TINY_QWEN2, "qwen2-pruned", "prune_lm_head=true")


@pytest.fixture(scope="session")
def pruned(pruned_head) -> Packaged:
    return Packaged(pruned_head, TINY_QWEN2)


@pytest.fixture(scope="session")
def builder_lfm2(tmp_path_factory, lfm2) -> Path:
    return _builder(tmp_path_factory, lfm2.checkpoint, "lfm2")


@pytest.fixture(scope="session")
def builder_granite_micro(tmp_path_factory, granite_micro) -> Path:
    return _builder(tmp_path_factory, granite_micro.checkpoint, "granite-micro")


@pytest.fixture(scope="session")
def builder_qwen2_5_vl(tmp_path_factory, qwen2_5_vl_checkpoint) -> Path:
    """The builder's bundle of the tiny Qwen2.5-VL checkpoint: its text component only."""
    return _builder(tmp_path_factory, qwen2_5_vl_checkpoint[1], "qwen2_5_vl")


@pytest.fixture(scope="session")
def builder_qwen2_5_vl_decoder(tmp_path_factory, qwen2_5_vl_checkpoint) -> Path:
    """The builder's pipeline decoder of the same checkpoint (exclude_embeds: inputs_embeds in,
    model.type qwen2_5_vl), which it writes without the vision and embedding models."""
    checkpoint = qwen2_5_vl_checkpoint[1]
    return _builder(tmp_path_factory, checkpoint, "qwen2_5_vl-decoder", "exclude_embeds=true")


#: A tiny Qwen3.5 vision tower: og's builder reads Qwen3.5 only in its vision-language layout.
_QWEN3_5_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 48,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
    "patch_size": 4,
}


def _qwen3_5_hub_layout(text_checkpoint: Path, folder: Path) -> Path:
    """`text_checkpoint`'s Qwen3_5ForCausalLM as the decoder of a Qwen3_5ForConditionalGeneration
    (the hub's layout of Qwen3.5, the only one og's builder reads: it refuses
    Qwen3_5ForCausalLM) in `folder`, with its tokenizer; the vision tower random."""
    text_model = AutoModelForCausalLM.from_pretrained(text_checkpoint, dtype=torch.float32)
    text = text_model.config.to_dict()
    # the vision-language decoder's mrope: 3 sections of the rotary half (4 dims rotate)
    text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": [1, 1, 0]}
    config = Qwen3_5Config(
        text_config=text, vision_config=_QWEN3_5_VISION, tie_word_embeddings=False
    )
    model = Qwen3_5ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    model.lm_head.load_state_dict(text_model.lm_head.state_dict())
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(text_checkpoint / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def builder_delta_net(tmp_path_factory, delta_net) -> Path:
    """The builder's bundle of delta_net's decoder (written in the hub's Qwen3.5 layout)."""
    folder = tmp_path_factory.mktemp("builder-ckpt") / "qwen3_5"
    return _builder(tmp_path_factory, _qwen3_5_hub_layout(delta_net.checkpoint, folder), "qwen3_5")


def open_kind(request: pytest.FixtureRequest, name: str) -> tuple:
    """(og.Model, bundle folder, checkpoint folder, transformers class) of the bundle fixture
    `name` ("vlm": the Qwen2.5-VL bundle of tests/models): the contract tests' `kind`."""
    if name == "vlm":
        _, checkpoint = request.getfixturevalue("qwen2_5_vl_checkpoint")
        bundle = request.getfixturevalue("qwen2_5_vl_bundle")
        model_class = Qwen2_5_VLForConditionalGeneration
    else:
        packaged = request.getfixturevalue(name)
        bundle, checkpoint, model_class = packaged.bundle, packaged.checkpoint, AutoModelForCausalLM
    return og.Model(str(bundle)), bundle, checkpoint, model_class
