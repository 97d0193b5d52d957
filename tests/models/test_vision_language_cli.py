"""`mobius-genai run BUNDLE --image PATH --prompt ...` and the card of a vision-language bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mobius_genai.cli import main
from mobius_genai.runtime.smoke_image import png_bytes
from tests._vlm import SIZE, transformers_tokens

og = pytest.importorskip("onnxruntime_genai")


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, np.ndarray]:
    pixels = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(pixels))
    return path, pixels


def test_run_with_an_image_streams_what_transformers_generates(
    gemma3_checkpoint, gemma3_bundle, image, capsys
):
    """The prompt gets the image placeholder in front; greedy, so the text is transformers'."""
    model, _ = gemma3_checkpoint
    path, pixels = image
    command = ["run", str(gemma3_bundle), "--image", str(path), "--prompt", "Describe it."]
    assert main([*command, "--raw", "--max-new-tokens", "5"]) == 0
    text = capsys.readouterr().out

    og_model = og.Model(str(gemma3_bundle))
    processor = og_model.create_multimodal_processor()
    inputs = processor("<start_of_image> Describe it.", images=og.Images.open(str(path)))
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    expected = transformers_tokens(model, input_ids, pixels, 5)
    assert text == og.Tokenizer(og_model).decode(expected) + "\n"


def test_run_applies_the_chat_template_around_the_image_prompt(gemma3_bundle, image, capsys):
    command = ["run", str(gemma3_bundle), "--image", str(image[0]), "--prompt", "Describe it."]
    assert main([*command, "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_image_on_a_text_only_bundle_is_one_clear_error(packaged, image, capsys):
    command = ["run", str(packaged("cpu")), "--image", str(image[0]), "--prompt", "Hi"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "takes no images" in err and "model.type 'qwen2'" in err
    assert "Traceback" not in err


def test_a_missing_image_file_is_one_clear_error(gemma3_bundle, tmp_path, capsys):
    missing = tmp_path / "nope.png"
    command = ["run", str(gemma3_bundle), "--image", str(missing), "--prompt", "Hi"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"{missing}: not a file" in err and "Traceback" not in err


def test_a_file_that_is_not_png_or_jpeg_is_one_clear_error(gemma3_bundle, tmp_path, capsys):
    """onnxruntime-extensions' decoder ends the process on such a file: it must not get it."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"BM not an image")
    command = ["run", str(gemma3_bundle), "--image", str(broken), "--prompt", "Hi"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"{broken}: not a PNG or JPEG image (starts with b'BM n')" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("prompt", ["<image_soft_token> Hi", "<start_of_image><image_soft_token>"])
def test_the_image_token_beside_an_image_is_one_clear_error(gemma3_bundle, image, prompt, capsys):
    """A `<image_soft_token>` written out is one more than the image's 256 features: refused
    before og, whose session run failed on it ("Gather ... out of bounds")."""
    command = ["run", str(gemma3_bundle), "--image", str(image[0]), "--prompt", prompt]
    capsys.readouterr()
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Gather" not in err, err
    assert "holds <image_soft_token>, the token og fills with an image's features" in err


def test_the_card_lists_the_graphs_and_an_image_run(gemma3_bundle):
    card = (gemma3_bundle / "README.md").read_text()
    graphs = next(line for line in card.splitlines() if line.startswith("| Graphs |"))
    assert graphs == (
        "| Graphs | `vision.onnx` (vision: pixel_values → image_features), `embedding.onnx` "
        "(embedding: input_ids, image_features → inputs_embeds), `decoder.onnx` (decoder) |"
    )
    assert f"mobius-genai run {gemma3_bundle.name} --image photo.png --prompt" in card
    for name in ("vision.onnx", "vision.onnx.data", "processor_config.json"):
        row = next(line for line in card.splitlines() if line.startswith(f"| `{name}` |"))
        assert not row.endswith("|  |")  # each file says what it is


def test_a_text_bundle_card_lists_its_one_graph(packaged):
    card = (packaged("cpu") / "README.md").read_text()
    assert "| Graphs | `model.onnx` (decoder) |" in card
    assert "--image" not in card


def test_a_gpu_vision_language_bundle_loads_on_cpu_with_every_graph_moved(
    gemma3_bundle, image, tmp_path
):
    """`load_model(cpu=True)` clears the providers of the vision and embedding sessions too:
    og.Config.clear_providers changes the decoder's alone, and a cuda bundle's other graphs
    then asked this CPU-only wheel for CUDA."""
    from mobius_genai.runtime.generate import load_model

    folder = tmp_path / "cuda-bundle"
    shutil.copytree(gemma3_bundle, folder)
    config_path = folder / "genai_config.json"
    config = json.loads(config_path.read_text())
    sections = [
        s for s in config["model"].values() if isinstance(s, dict) and "session_options" in s
    ]
    assert len(sections) >= 2  # the decoder and at least the vision graph
    for section in sections:
        section["session_options"]["provider_options"] = [{"cuda": {}}]
    config_path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="(?i)cuda"):
        og.Model(str(folder))

    model = load_model(folder, cpu=True)
    processor = model.create_multimodal_processor()
    inputs = processor("<start_of_image> Describe it.", images=og.Images.open(str(image[0])))
    params = og.GeneratorParams(model)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    generator.generate_next_token()
    assert generator.get_next_tokens()[0] >= 0
