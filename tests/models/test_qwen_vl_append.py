"""og.Generator continuing a Qwen-VL prompt with an image (set_inputs): text appended later, in
one call or token by token, gets transformers' logits over the whole sequence, og's 3-D mrope
positions continuing from the image's rope delta. An append after generate_next_token does not:
og 0.18 never runs the generated token (bundle/og_support.py), for these bundles as for every
other; rewinding over it and appending it again does. A second image set on a continued
generator is read as text; a new og.Generator over the whole conversation sees both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mobius_genai
from mobius_genai.runtime.smoke_image import png_bytes
from tests._qwen_vl import patches, tiny_qwen2_vl, token_types, write_qwen2_5_vl_checkpoint
from tests.models.test_qwen2_5_vl_bundle import PLACEHOLDER

og = pytest.importorskip("onnxruntime_genai")

TEXT = [11, 12, 13, 14]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    folder = tmp_path_factory.mktemp("qwen2_vl-append")
    model = write_qwen2_5_vl_checkpoint(folder / "checkpoint", tiny_qwen2_vl)
    return model, mobius_genai.package(folder / "checkpoint", "cpu", folder / "bundle", quiet=True)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def family(request) -> tuple[torch.nn.Module, og.Model, og.NamedTensors, dict]:
    """(transformers' model, og's model, og's processor inputs for an image prompt, transformers'
    image inputs) for each Qwen-VL family."""
    if request.param == "qwen2_vl":
        model, bundle = request.getfixturevalue("qwen2_vl")
    else:
        model = request.getfixturevalue(f"{request.param}_checkpoint")[0]
        bundle = request.getfixturevalue(f"{request.param}_bundle")
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    og_model = og.Model(str(bundle))
    inputs = og_model.create_multimodal_processor()(
        f"{PLACEHOLDER} Describe.", images=og.Images.open_bytes(png_bytes(pixels))
    )
    values, grid = (torch.from_numpy(array) for array in patches(pixels))
    return model, og_model, inputs, {"pixel_values": values, "image_grid_thw": grid}


def _prompt(inputs: og.NamedTensors) -> list[int]:
    return inputs["input_ids"].as_numpy()[0].tolist()


def _generator(
    og_model: og.Model, inputs: og.NamedTensors, room: int = 2 * len(TEXT)
) -> og.Generator:
    """A greedy og.Generator with `inputs` set, `room` tokens left after them."""
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=len(_prompt(inputs)) + room)
    generator = og.Generator(og_model, params)
    generator.set_inputs(inputs)
    return generator


def _expected(model: torch.nn.Module, sequence: list[int], image: dict) -> np.ndarray:
    """transformers' last logits over `sequence` with the image: its own mrope positions."""
    ids = torch.tensor([sequence])
    types = token_types(ids, model.config.image_token_id)
    with torch.no_grad():
        return model(input_ids=ids, mm_token_type_ids=types, **image).logits[0, -1].numpy()


def _last_logits(generator: og.Generator) -> np.ndarray:
    return generator.get_logits()[0, -1]


def test_text_appended_after_an_image_prompt_gets_transformers_logits(family):
    """(a) the text in one append_tokens call; (b) token by token."""
    model, og_model, inputs, image = family
    at_once = _generator(og_model, inputs)
    at_once.append_tokens(np.asarray([TEXT], np.int32))
    expected = _expected(model, _prompt(inputs) + TEXT, image)
    np.testing.assert_allclose(_last_logits(at_once), expected, atol=TOLERANCE, rtol=0)
    one_by_one, sequence = _generator(og_model, inputs), _prompt(inputs)
    for token in TEXT:
        one_by_one.append_tokens(np.asarray([[token]], np.int32))
        sequence.append(token)
        expected = _expected(model, sequence, image)
        np.testing.assert_allclose(_last_logits(one_by_one), expected, atol=TOLERANCE, rtol=0)


def test_append_after_generating_leaves_the_generated_token_out(family):
    """(c) og 0.18's generate_next_token adds its token to the sequence and runs it at the next
    generate_next_token; append_tokens runs only the appended tokens. The positions count the
    generated token, but its slot of the shared KV buffer is never written: og's logits are
    transformers' with zero keys and values there, not those of the whole sequence."""
    model, og_model, inputs, image = family
    generator = _generator(og_model, inputs)
    generator.generate_next_token()
    generated = int(generator.get_next_tokens()[0])
    generator.append_tokens(np.asarray([TEXT], np.int32))
    prompt = _prompt(inputs)
    whole = _expected(model, [*prompt, generated, *TEXT], image)
    assert np.abs(_last_logits(generator) - whole).max() > 0.1
    unwritten = _with_an_unwritten_slot(model, prompt, image)
    np.testing.assert_allclose(_last_logits(generator), unwritten, atol=TOLERANCE, rtol=0)


def _with_an_unwritten_slot(model: torch.nn.Module, prompt: list[int], image: dict) -> np.ndarray:
    """transformers' last logits for TEXT after `prompt` (with the image) and one slot of zero
    keys and values, the positions going on after the slot as after a token."""
    ids = torch.tensor([prompt])
    types = token_types(ids, model.config.image_token_id)
    with torch.no_grad():
        _, delta = model.model.get_rope_index(ids, types, image_grid_thw=image["image_grid_thw"])
        cache = model(input_ids=ids, mm_token_type_ids=types, use_cache=True, **image).cache
        for layer in cache.layers:
            layer.keys = torch.cat([layer.keys, torch.zeros_like(layer.keys[:, :, :1])], 2)
            layer.values = torch.cat([layer.values, torch.zeros_like(layer.values[:, :, :1])], 2)
        start = len(prompt) + 1 + int(delta)
        positions = torch.arange(start, start + len(TEXT)).expand(3, 1, -1)
        logits = model(
            input_ids=torch.tensor([TEXT]),
            cache=cache,
            position_ids=positions,
            attention_mask=torch.ones(1, len(prompt) + 1 + len(TEXT), dtype=torch.long),
        ).logits
    return logits[0, -1].numpy()


def test_rewinding_over_the_generated_token_then_appending_it_gets_transformers_logits(family):
    """The way to continue after generating: rewind_to the tokens og has run, then append the
    generated token with the new text (og keeps the image's rope delta across the rewind)."""
    model, og_model, inputs, image = family
    generator = _generator(og_model, inputs)
    generator.generate_next_token()
    generated = int(generator.get_next_tokens()[0])
    generator.rewind_to(generator.token_count() - 1)
    generator.append_tokens(np.asarray([[generated, *TEXT]], np.int32))
    expected = _expected(model, [*_prompt(inputs), generated, *TEXT], image)
    np.testing.assert_allclose(_last_logits(generator), expected, atol=TOLERANCE, rtol=0)


def test_a_second_image_on_a_continued_generator_is_read_as_text(
    qwen2_5_vl_checkpoint, qwen2_5_vl_bundle
):
    """og 0.18 runs the vision model and computes mrope's 3-D positions only for a generator's
    first prompt: a second set_inputs with an image runs without a word, its image tokens
    embedded as text at text positions. A new og.Generator over the whole conversation, both
    images set at once (as `run` and `serve` do: a new generator for each prompt), gets
    transformers' logits."""
    model = qwen2_5_vl_checkpoint[0]
    og_model = og.Model(str(qwen2_5_vl_bundle))
    processor = og_model.create_multimodal_processor()
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, size, dtype=np.uint8) for size in ((40, 56, 3), (32, 32, 3))]
    pngs = [png_bytes(image) for image in pixels]
    texts = [f"{PLACEHOLDER} Describe.", f"{PLACEHOLDER} Again."]
    first, second = (
        processor(text, images=og.Images.open_bytes(png))
        for text, png in zip(texts, pngs, strict=True)
    )
    continued = _generator(og_model, first, len(_prompt(second)))
    continued.set_inputs(second)
    sequence = _prompt(first) + _prompt(second)
    (values, grids), (first_values, first_grid) = _image_inputs(pixels), _image_inputs(pixels[:1])
    both = {"pixel_values": values, "image_grid_thw": grids}
    assert np.abs(_last_logits(continued) - _expected(model, sequence, both)).max() > 0.1
    as_text = _first_image_only(model, sequence, len(_prompt(first)), first_values, first_grid)
    np.testing.assert_allclose(_last_logits(continued), as_text, atol=TOLERANCE, rtol=0)
    whole = processor("".join(texts), images=og.Images.open_bytes(*pngs))
    fresh = _generator(og_model, whole)
    expected = _expected(model, _prompt(whole), both)
    np.testing.assert_allclose(_last_logits(fresh), expected, atol=TOLERANCE, rtol=0)


def _image_inputs(pixels: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' pixel_values and image_grid_thw of `pixels`, in order."""
    values, grids = zip(*(patches(image) for image in pixels), strict=True)
    return torch.from_numpy(np.concatenate(values)), torch.from_numpy(np.concatenate(grids))


def _first_image_only(
    model: torch.nn.Module,
    sequence: list[int],
    first: int,
    values: torch.Tensor,
    grid: torch.Tensor,
) -> np.ndarray:
    """transformers' last logits over `sequence` with the image of its `first` tokens only: the
    later tokens embedded as text, their positions going on from the first image's rope delta."""
    ids = torch.tensor([sequence])
    head = ids[:, :first]
    image = model.config.image_token_id
    with torch.no_grad():
        positions, delta = model.model.get_rope_index(
            head, token_types(head, image), image_grid_thw=grid
        )
        start = first + int(delta)
        later = torch.arange(start, start + len(sequence) - first).expand(3, 1, -1)
        embeds = model.model.get_input_embeddings()(ids)
        features = model.model.get_image_features(values, grid).pooler_output
        embeds[0, :first][head[0] == image] = torch.cat(features)
        logits = model(
            inputs_embeds=embeds,
            position_ids=torch.cat([positions, later], 2),
            attention_mask=torch.ones_like(ids),
        ).logits
    return logits[0, -1].numpy()
