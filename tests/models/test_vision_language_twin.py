"""The smoke-test twin of a vision-language bundle: the same checkpoint cut to the decoder's first
layers of every kind and the vision tower's, every graph's contract and genai_config unchanged,
its image smoke test recorded as a twin's; the memory plan counts every graph."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from mobius_genai import packager
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.config.qwen_vision import QwenVisionConfig
from mobius_genai.config.vision import VisionConfig
from mobius_genai.models.vision_language import vision_language_family
from mobius_genai.runtime import smoke_plan
from mobius_genai.runtime.smoke_plan import TWIN_FOLDER, model_bytes

pytest.importorskip("onnxruntime_genai")

SECTIONS = ("vision", "embedding", "decoder")
#: Per family: the numbered layers of the vision graph, and the layers (decoder, vision) of
#: the twin and of the whole model. Gemma 3's tiny decoder is sliding, full, sliding; SigLIP's
#: layers are all alike. Qwen2.5-VL's decoder layers are alike; its tower's block 1 of 3
#: attends to the whole frame, block 0 within windows.
FAMILIES = {
    "gemma3": (r"^vision_tower\.encoder\.layers\.(\d+)\.", (2, 1), (3, 2)),
    "qwen2_5_vl": (r"^visual\.blocks\.(\d+)\.", (1, 2), (2, 3)),
    # DeepStack blocks 0 and 2 of 3: the twin keeps blocks 0 and 1, block 2's features zeros
    "qwen3_vl": (r"^visual\.blocks\.(\d+)\.", (1, 2), (3, 3)),
    # Mistral 3's decoder layers are alike, and so are the Pixtral tower's
    "mistral3": (r"^vision_tower\.transformer\.layers\.(\d+)\.", (1, 1), (2, 2)),
    # Gemma 4's tiny decoder is sliding, full, full; its tower's layers are alike
    "gemma4": (r"^vision_tower\.encoder\.layers\.(\d+)\.", (2, 1), (3, 2)),
}
#: The tensors of the layers a twin drops, in either checkpoint layout (hub, transformers 5).
DROPPED = {
    "gemma3": r"^(language_model\.model\.layers\.2|vision_tower\.(vision_model\.)?encoder\.layers\.1)\.",
    # the merger's numbered mlp (visual.merger.mlp.2) is no block: it stays read
    "qwen2_5_vl": r"^(model\.(language_model\.)?layers\.1|(model\.)?visual\.blocks\.2)\.",
    "qwen3_vl": r"^(model\.(language_model\.)?layers\.[12]|(model\.)?visual\.(blocks\.2|"
    r"deepstack_merger_list\.1))\.",
    "mistral3": r"^(language_model\.model\.layers\.1|vision_tower\.transformer\.layers\.1)\.",
    "gemma4": r"^model\.(language_model\.layers\.2|vision_tower\.encoder\.layers\.1)\.",
}
DECODER_LAYERS = r"^model\.layers\.(\d+)\."
PAST = re.compile(r"^(past_key_values|present)\.(\d+)\.")


def _graph(path: Path) -> dict:
    proto = onnx.load(str(path), load_external_data=False)
    info = GraphInfo.from_proto(proto)
    return {
        "inputs": info.inputs,
        "outputs": info.outputs,
        "nodes": len(proto.graph.node),
        "initializers": [tensor.name for tensor in proto.graph.initializer],
    }


def _bundle(folder: Path) -> dict:
    config = json.loads((folder / "genai_config.json").read_text())
    model = config["model"]
    processor = (folder / model["vision"]["config_filename"]).read_text()
    graphs = {section: _graph(folder / model[section]["filename"]) for section in SECTIONS}
    return {"config": config, "processor": processor, "graphs": graphs}


def _layers(names: list[str], pattern: str) -> set[int]:
    return {int(match.group(1)) for name in names if (match := re.match(pattern, name))}


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Memory for the twin only; records each bundle the smoke test runs."""
    monkeypatch.setattr(smoke_plan, "available_memory", lambda: 400 << 20)
    runs: list[dict] = []
    real = smoke_plan.smoke_test

    def spy(folder, ep, **kwargs):
        runs.append({"folder": folder, **_bundle(folder)})
        return real(folder, ep, **kwargs)

    monkeypatch.setattr(smoke_plan, "smoke_test", spy)
    return runs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_twin_of_a_vision_language_bundle_cuts_the_decoder_and_the_tower(
    family, request, tmp_path, capfd, little_memory
):
    checkpoint = request.getfixturevalue(f"{family}_checkpoint")[1]
    vision_layers, (twin_decoder, twin_vision), (decoder, vision) = FAMILIES[family]
    out = packager.package(checkpoint, "cpu", tmp_path / "out")
    err = capfd.readouterr().err
    scope = (
        f"the first {twin_decoder} of {decoder} layers and {twin_vision} of {vision} vision layers"
    )
    assert f"smoke test on a twin bundle of {scope}: the whole" in err
    [run] = little_memory
    assert run["folder"].name == TWIN_FOLDER
    whole, twin = _bundle(out), run
    for key, kept, of in (
        (DECODER_LAYERS, twin_decoder, decoder),
        (vision_layers, twin_vision, vision),
    ):
        graph = "decoder" if key == DECODER_LAYERS else "vision"
        assert _layers(twin["graphs"][graph]["initializers"], key) == set(range(kept))
        assert _layers(whole["graphs"][graph]["initializers"], key) == set(range(of))
        assert twin["graphs"][graph]["nodes"] < whole["graphs"][graph]["nodes"]
    # the contract: every graph's inputs and outputs, but the decoder's dropped layers' caches
    for section in SECTIONS:
        for side in ("inputs", "outputs"):
            kept = {
                name: spec
                for name, spec in whole["graphs"][section][side].items()
                if not ((match := PAST.match(name)) and int(match.group(2)) >= twin_decoder)
            }
            assert twin["graphs"][section][side] == kept, (section, side)
    assert twin["graphs"]["embedding"] == whole["graphs"]["embedding"]
    assert twin["config"]["model"]["decoder"].pop("num_hidden_layers") == twin_decoder
    assert whole["config"]["model"]["decoder"].pop("num_hidden_layers") == decoder
    assert twin["config"] == whole["config"]
    assert twin["processor"] == whole["processor"]
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert (record["ran"], record["layers"], record["of"]) == (True, twin_decoder, decoder)
    assert record["vision_layers"] == {"layers": twin_vision, "of": vision}
    assert re.search(rf"with a \d+x\d+ image.*\(twin of {scope}\)$", record["note"])
    assert f"| Smoke test | passed on a twin of the bundle with its {scope[4:]}, built" in (
        (out / "README.md").read_text()
    )
    assert TWIN_FOLDER not in {path.name for path in out.iterdir()}


def test_model_bytes_count_every_graph_of_a_vision_language_bundle(gemma3_bundle):
    files = [path for path in gemma3_bundle.iterdir() if ".onnx" in path.name]
    assert {path.name for path in files} == {
        f"{section}.onnx{suffix}" for section in SECTIONS for suffix in ("", ".data")
    }
    assert model_bytes(gemma3_bundle) == sum(path.stat().st_size for path in files)


@pytest.mark.parametrize(
    ("full", "depth", "twin", "twin_full"),
    [
        ((7, 15, 23, 31), 32, 8, (7,)),  # Qwen2.5-VL-7B: seven windowed blocks, then a full one
        ((0, 2), 4, 2, (0,)),
        ((), 4, 1, ()),  # every block windowed
        ((0, 1, 2), 3, 1, (0,)),  # every block full
    ],
)
def test_the_qwen_tower_twin_keeps_a_windowed_and_a_full_attention_block(
    full, depth, twin, twin_full
):
    config = QwenVisionConfig(depth=depth, fullatt_block_indexes=full)
    assert config.layers_of_every_kind() == twin
    cut = config.first_layers(twin)
    assert (cut.depth, cut.fullatt_block_indexes) == (twin, twin_full)


def test_the_siglip_tower_twin_is_its_first_layer():
    config = VisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=27,
        num_attention_heads=2,
        image_size=32,
        patch_size=4,
    )
    assert config.layers_of_every_kind() == 1
    assert config.first_layers(1).num_hidden_layers == 1


@pytest.mark.parametrize("family", list(DROPPED))
def test_only_the_dropped_layers_tensors_count_as_unread(family, request):
    folder = request.getfixturevalue(f"{family}_checkpoint")[1]
    checkpoint = Checkpoint(folder)
    row = vision_language_family(family)
    config = row.parse_config(json.loads((folder / "config.json").read_text()))
    _, (decoder, _), _ = FAMILIES[family]
    expected = sorted(name for name in checkpoint if re.match(DROPPED[family], name))
    assert expected  # the pattern names the checkpoint's own tensors
    assert sorted(row.dropped_layers(checkpoint, config.first_layers(decoder))) == expected
    assert row.dropped_layers(checkpoint, config) == []


def test_the_qwen3_tower_twin_keeps_its_first_deepstack_block_and_the_feature_width():
    """Qwen3-VL-8B's tower: DeepStack blocks 8, 16, 24 of 27. The twin keeps blocks 0-8 (a
    plain block and the first DeepStack one) and all three DeepStack parts of the features
    (the contract), computing only the first."""
    from mobius_genai.config.qwen3_vision import Qwen3VisionConfig

    config = Qwen3VisionConfig()
    assert config.layers_of_every_kind() == 9
    cut = config.first_layers(9)
    assert (cut.depth, cut.deepstack_visual_indexes, cut.deepstack_mergers) == (9, (8, 16, 24), 1)
