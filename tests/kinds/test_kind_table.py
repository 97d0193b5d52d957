"""A kind is looked up from `kinds.table.KINDS`: one registered here, and nowhere else, gets
built, written and validated by `build()`, the packager and validate as they are."""

from __future__ import annotations

import dataclasses
import json
import shutil

import onnx_ir as ir
import onnxruntime_genai as og
import pytest

from mobius_genai.build import build
from mobius_genai.bundle.genai_config import make_genai_config
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.ep import get_ep
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.kinds import table
from mobius_genai.kinds.base import KindGraphs, KindInput
from mobius_genai.kinds.og_types import OG_TYPES
from mobius_genai.kinds.text import TextDecoderKind
from mobius_genai.kinds.vision_language import VisionLanguageKind
from mobius_genai.kinds.whisper import WhisperKind
from mobius_genai.models.families import FAMILIES
from mobius_genai.models.vision_language import VISION_LANGUAGE
from mobius_genai.packager import package
from mobius_genai.target import resolve_target
from tests._qwen_vl import TINY_QWEN2

_FAKE_TYPE = "fake_lm"
_FAKE_FILE = "fake_kind.json"


class _FakeKind:
    """A kind no module of the package knows: the tiny decoder's graph under a package key,
    a model.type, a search setting and a file of its own."""

    name = "fake"

    def claims(self, model_type: str) -> bool:
        return model_type == _FAKE_TYPE

    def build(self, given: KindInput) -> KindGraphs:
        text = dataclasses.replace(given, raw={**given.raw, "model_type": "qwen2"})
        built = table.TEXT_DECODER.build(text)
        built.graphs = {"decoder": ("decoder", built.graphs["model"][1])}
        return built

    def genai_config(self, package, written) -> dict:
        document = make_genai_config(
            package.config,
            package.ep,
            written.decoder,
            filename="decoder.onnx",
            genai_type="decoder",  # og's generic decoder, where the qwen2 row says "qwen2"
        )
        document["search"]["top_k"] = 7
        return document

    def bundle_files(self, checkpoint, package) -> dict:
        return {_FAKE_FILE: {"kind": self.name, "layers": package.config.num_hidden_layers}}

    def twin_layers(self, package) -> None:
        return None


@pytest.fixture
def fake_checkpoint(tmp_path):
    folder = tmp_path / "fake-ckpt"
    shutil.copytree(TINY_QWEN2, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": _FAKE_TYPE}))
    return folder


def test_an_unregistered_model_type_is_refused(fake_checkpoint):
    with pytest.raises(UnsupportedModelError, match=f"model_type '{_FAKE_TYPE}' is not supported"):
        build(fake_checkpoint, "cpu", "fp32", load_weights=False, progress=False)


def test_a_registered_kind_is_built_written_and_validated(fake_checkpoint, tmp_path, monkeypatch):
    fake = _FakeKind()
    monkeypatch.setattr(table, "KINDS", (fake, *table.KINDS))

    built = build(fake_checkpoint, "cpu", "fp32", progress=False)
    assert built.kind is fake and list(built) == ["decoder"]
    assert built.roles == {"decoder": "decoder"} and set(built.reports) == {"decoder"}

    out = package(fake_checkpoint, "cpu", tmp_path / "bundle", quiet=True)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["type"] == "decoder"
    assert config["model"]["decoder"]["filename"] == "decoder.onnx"
    assert config["search"]["top_k"] == 7
    assert json.loads((out / _FAKE_FILE).read_text()) == {"kind": "fake", "layers": 2}
    assert validate_bundle(out).genai_config == config
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    assert manifest["build"]["genai_model_type"] == "decoder"
    assert manifest["build"]["smoke_test"]["ran"] is True
    og.Model(str(out))  # onnxruntime-genai's own parser takes what the kind wrote


def test_every_row_of_a_kind_table_finds_its_kind():
    for model_type in VISION_LANGUAGE:
        assert isinstance(table.kind_of(model_type), VisionLanguageKind), model_type
    assert isinstance(table.kind_of("whisper"), WhisperKind)
    for model_type in FAMILIES:
        assert isinstance(table.kind_of(model_type), TextDecoderKind), model_type


def test_a_vision_language_row_names_an_og_type_with_an_image_placeholder():
    for row in VISION_LANGUAGE.values():
        assert OG_TYPES[row.genai_type].image_placeholder, row.model_type


def test_the_package_carries_the_target_it_was_built_for():
    target = resolve_target("cuda", dtype="fp16", context_length=64)
    built = build(TINY_QWEN2, target=target, load_weights=False, progress=False)
    assert built.target is target
    assert (built.ep, built.dtype) == (get_ep("cuda"), ir.DataType.FLOAT16)
    assert built.context_length == 64 and built.roles == {"model": "decoder"}
