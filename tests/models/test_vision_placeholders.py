"""A placeholder token with no features behind it (generated at a decode step, or written in a
prompt without an image or clip) is embedded as transformers embeds it without pixel values:
every vision-language row's embedding graph against the inputs_embeds transformers hands its
language model (fp32, 1e-6: one table row, scaled). With features, placeholders and rows must
match in number, as transformers requires."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

from mobius_genai.ep.context import build_context
from mobius_genai.models.vision_embedding import EmbeddingModel
from mobius_genai.models.vision_language import VISION_LANGUAGE
from mobius_genai.optimize import optimize_model
from mobius_genai.target import resolve_target
from mobius_genai.tasks.vision_language import EmbeddingTask
from tests._gemma4_audio import tiny_gemma4_audio
from tests._lfm2_vl import tiny_lfm2_vl
from tests._mistral3 import tiny_mistral3
from tests._qwen3_vl import tiny_qwen3_vl
from tests._qwen_vl import patches, tiny_qwen2_5_vl, tiny_qwen2_vl, token_types
from tests._vlm import tiny_gemma3

#: A tiny transformers model of every row (Gemma 4's with its audio tower: three placeholders).
TINY = {
    "gemma3": tiny_gemma3,
    "qwen2_5_vl": tiny_qwen2_5_vl,
    "qwen2_vl": tiny_qwen2_vl,
    "mistral3": tiny_mistral3,
    "qwen3_vl": tiny_qwen3_vl,
    "qwen3_vl_moe": functools.partial(tiny_qwen3_vl, moe=True),
    "lfm2_vl": tiny_lfm2_vl,
    "gemma4": tiny_gemma4_audio,
}
_TEXT = (3, 4, 5)


def test_every_vision_language_row_is_checked():
    assert set(TINY) == set(VISION_LANGUAGE)


def _embedding_session(model_type: str, model) -> tuple[ort.InferenceSession, list[int]]:
    """The row's embedding graph (optimized for cpu) with the model's token table (its one
    weight), and the media tokens of its config (placeholders; video tokens, which the graph
    takes as text)."""
    family = VISION_LANGUAGE[model_type]
    config = family.parse_config(model.config.to_dict())
    target = resolve_target("cpu", dtype="fp32")
    with build_context(target.ep, target.dtype):
        graph = EmbeddingTask().build(EmbeddingModel(config), config.embedding_width)
    (table,) = [v for v in graph.graph.initializers.values() if v.const_value is None]
    table.const_value = ir.tensor(model.get_input_embeddings().weight.detach().numpy())
    optimize_model(graph, ep=target.ep, dtype=target.dtype, model_role="embedding")
    session = ort.InferenceSession(
        ir.serde.serialize_model(graph).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    media = (config.image_token_id, config.video_token_id, config.audio_token_id)
    return session, [token for token in media if token is not None]


def _transformers_embeds(model, input_ids: torch.Tensor, **inputs) -> np.ndarray:
    """The inputs_embeds transformers' multimodal model hands its language model."""
    seen = {}

    def keep(_module, _args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"]

    hook = model.model.language_model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=input_ids, **inputs)
    finally:
        hook.remove()
    return seen["embeds"].numpy()


def _run(session: ort.InferenceSession, input_ids: np.ndarray, rows: int = 0, seed: int = 0):
    """The graph's inputs_embeds with `rows` random rows of each feature input."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": input_ids}
    for value in session.get_inputs()[1:]:
        feeds[value.name] = rng.normal(size=(rows, value.shape[1])).astype(np.float32)
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_a_placeholder_without_features_is_embedded_as_transformers_embeds_it(model_type):
    """Each media token alone (a decode step's input) and all of them in a prompt without
    media: transformers' text embedding of the token (its own row, token 0's for Gemma 3's
    outside the vocabulary, the pad token's for Gemma 4's), zeros in DeepStack's columns."""
    model = TINY[model_type]()
    session, media = _embedding_session(model_type, model)
    hidden = model.config.get_text_config().hidden_size
    prompts = [[token] for token in media] + [[_TEXT[0], *media, *_TEXT[1:]]]
    for prompt in prompts:
        input_ids = torch.tensor([prompt])
        embeds = _run(session, input_ids.numpy())
        expected = _transformers_embeds(model, input_ids)
        np.testing.assert_allclose(embeds[..., :hidden], expected, atol=1e-6, rtol=0)
        assert not embeds[..., hidden:].any()


def test_image_tokens_and_features_must_match_in_number_as_transformers_requires():
    """A prompt with one image's features and one image token more: transformers raises, and
    onnxruntime refuses the embedding graph's run rather than guess."""
    model = tiny_qwen2_vl()
    session, _ = _embedding_session("qwen2_vl", model)
    pixel_values, grid = patches(np.zeros((8, 8, 3), np.uint8))  # one merged token
    image = model.config.image_token_id
    input_ids = torch.tensor([[_TEXT[0], image, image, _TEXT[1]]])
    with pytest.raises(ValueError, match="do not match"):
        _transformers_embeds(
            model,
            input_ids,
            pixel_values=torch.from_numpy(pixel_values),
            image_grid_thw=torch.from_numpy(grid),
            mm_token_type_ids=token_types(input_ids, image),
        )
    with pytest.raises(Exception, match="out of"):
        _run(session, input_ids.numpy(), rows=1)
    matched = torch.tensor([[_TEXT[0], image, _TEXT[1]]])
    assert _run(session, matched.numpy(), rows=1).shape == (
        1,
        3,
        model.config.text_config.hidden_size,
    )
