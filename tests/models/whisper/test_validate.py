"""validate on a packaged Whisper bundle: the encoder section is checked against its graph
(per-layer cross cache names expanded), the audio processor file og reads by name must be
there, and a first-layers build (the smoke test's twin) cuts the decoder only."""

from __future__ import annotations

import json
import shutil

import pytest

from mobius_genai.build import build
from mobius_genai.bundle.graph import layer_names
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError


def _copy(bundle, tmp_path):
    return shutil.copytree(bundle, tmp_path / "copy")


def test_a_packaged_whisper_bundle_validates(speech_bundle):
    report = validate_bundle(speech_bundle)
    assert report.genai_config["model"]["encoder"]["filename"] == "encoder.onnx"


def test_missing_audio_processor_config_is_named(speech_bundle, tmp_path):
    folder = _copy(speech_bundle, tmp_path)
    (folder / "audio_processor_config.json").unlink()
    with pytest.raises(
        BundleError,
        match="'audio_processor_config.json' is not a file in .*"
        "onnxruntime-genai's 'whisper' type reads it",
    ):
        validate_bundle(folder, check_hashes=False)


def test_an_encoder_cross_cache_name_the_graph_lacks_is_named(speech_bundle, tmp_path):
    folder = _copy(speech_bundle, tmp_path)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["encoder"]["outputs"]["cross_present_key_names"] = "cross_k_%d"
    path.write_text(json.dumps(config))
    with pytest.raises(
        BundleError,
        match="model.encoder.outputs.cross_present_key_names: 'cross_k_0' is not a graph output",
    ):
        validate_bundle(folder, check_hashes=False)


def test_first_layers_cut_the_decoder_and_keep_the_encoder(multilingual_checkpoint):
    _, folder = multilingual_checkpoint
    package_ = build(folder, "cpu", num_layers=1, progress=False)
    assert package_.config.num_hidden_layers == 1
    assert package_.kind_config.decoder_layers == 1 and package_.kind_config.encoder_layers == 2
    decoder_inputs = [value.name for value in package_["decoder"].graph.inputs]
    assert "past_key_self_0" in decoder_inputs and "past_key_self_1" not in decoder_inputs


def test_the_decoders_own_cache_is_its_key_family_beside_cross_caches():
    names = ["past_key_self_0", "past_key_self_1", "past_key_cross_0", "past_key_cross_1"]
    assert layer_names(names, "key").pattern == "past_key_self_%d"
    with pytest.raises(BundleError, match="several per-layer key name families"):
        layer_names(["a.0.key", "b.0.key"], "key")  # two of the decoder's own: ambiguous
