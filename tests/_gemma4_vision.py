"""Tiny random Gemma 4 checkpoints written by transformers (no download), the vision and
embedding graphs built from them, and transformers' side of the comparisons: image features of
images already at a size the image processor keeps (whole 3 x 3 blocks of patches)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import onnxruntime_genai as og
import torch
from safetensors.numpy import load_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

from mobius_genai.checkpoint.reader import TRANSPOSED_FROM_CHECKPOINT
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.context import build_context
from mobius_genai.models.vision_embedding import EmbeddingModel
from mobius_genai.models.vision_language import VISION_LANGUAGE
from mobius_genai.optimize import optimize_model
from mobius_genai.runtime.smoke_image import png_bytes
from mobius_genai.target import resolve_target
from mobius_genai.tasks.vision_language import EmbeddingTask, VisionTask
from tests._hf import randomize_weights
from tests._ort import package_sessions, run_declared

TEXT_HIDDEN = 64
PATCH, POOL = 4, 3  # 4-pixel patches, 3 x 3 of them one image token
IMAGE_TOKEN = 290

TEXT = {
    "vocab_size": 300,
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "global_head_dim": 32,
    "hidden_size_per_layer_input": 32,  # whole int4 blocks of the per-layer table
    "vocab_size_per_layer_input": 300,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 16,
    "max_position_embeddings": 256,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "patch_size": PATCH,
    "position_embedding_size": 64,
    "use_clipped_linears": True,
    "standardize": True,
}
TOP = {
    "image_token_id": IMAGE_TOKEN,
    "boi_token_id": 291,
    "eoi_token_id": 292,
    "video_token_id": 293,
    "audio_token_id": 294,
    "boa_token_id": 295,
    "eoa_token_index": 296,
}
#: Clamp bounds of the clipped linears: tight enough that some values are clamped.
_CLIP = 1.5


def tiny_gemma4(**vision: object) -> Gemma4ForConditionalGeneration:
    """A seeded random Gemma4ForConditionalGeneration (float32, eval mode, no audio tower);
    `vision` overrides vision_config keys. The clipped linears' bounds and the
    standardization's bias and scale are seeded too (transformers leaves them inf or empty)."""
    return _tiny({}, TOP, vision)


def _tiny(
    text: dict, top: dict, vision: dict | None = None, audio: dict | None = None
) -> Gemma4ForConditionalGeneration:
    config = Gemma4Config(
        text_config={**TEXT, **text},
        vision_config={**VISION, **(vision or {})},
        audio_config=audio,
        **top,
    )
    model = Gemma4ForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            leaf = name.rsplit(".", 1)[-1]
            noise = torch.rand(buffer.shape, generator=gen)
            if leaf.endswith("_min"):
                buffer.copy_(-_CLIP * (1 + noise))
            elif leaf.endswith("_max"):
                buffer.copy_(_CLIP * (1 + noise))
            elif leaf == "std_bias":
                buffer.copy_(0.2 * torch.randn(buffer.shape, generator=gen))
            elif leaf == "std_scale":
                buffer.copy_(1 + 0.1 * torch.randn(buffer.shape, generator=gen))
    return model


def image_inputs(pixels: list[np.ndarray], length: int | None = None) -> dict[str, np.ndarray]:
    """transformers' Gemma4ImageProcessor on uint8 images [h, w, 3] already at their size:
    rescale to [0, 1], patches row by row ((py, px, channel) inside each) with their (column,
    row), padded to `length` (the longest image's count where None) with (-1, -1)."""
    length = length or max(h * w for h, w, _ in (p.shape for p in pixels)) // PATCH**2
    values, positions = [], []
    for image in pixels:
        height, width, _ = image.shape
        rows, cols = height // PATCH, width // PATCH
        scaled = (image / 255).astype(np.float32)
        grid = scaled.reshape(rows, PATCH, cols, PATCH, 3).transpose(0, 2, 1, 3, 4)
        flat = grid.reshape(rows * cols, PATCH * PATCH * 3)
        where = np.stack(np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy"), -1)
        padded = np.zeros((length, flat.shape[1]), np.float32)
        padded[: len(flat)] = flat
        place = np.full((length, 2), -1, np.int64)
        place[: len(flat)] = where.reshape(-1, 2)
        values.append(padded)
        positions.append(place)
    return {"pixel_values": np.stack(values), "pixel_position_ids": np.stack(positions)}


def random_pixels(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A random uint8 image [height, width, 3]."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def reference_inputs(model, ids: np.ndarray, pixels: list[np.ndarray], *, blocks: bool = True):
    """transformers' inputs: with `blocks`, the processor's mm_token_type_ids (1 on image
    tokens), which turn the image blocks on; without, every token attends causally."""
    inputs = image_inputs(pixels)
    reference = {
        "input_ids": torch.from_numpy(ids),
        "pixel_values": torch.from_numpy(inputs["pixel_values"]),
        "image_position_ids": torch.from_numpy(inputs["pixel_position_ids"]),
    }
    if blocks:
        reference["mm_token_type_ids"] = (
            reference["input_ids"] == model.config.image_token_id
        ).long()
    return reference


def image_tokens(image: np.ndarray) -> int:
    height, width, _ = image.shape
    return (height // PATCH // POOL) * (width // PATCH // POOL)


def reference_features(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' image features [tokens, text hidden] of every image in order."""
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(inputs["pixel_values"]),
            torch.from_numpy(inputs["pixel_position_ids"]),
        )
    return torch.cat(output.pooler_output).numpy()


def reference_embeddings(model, input_ids: np.ndarray, features: np.ndarray) -> np.ndarray:
    """transformers' inputs_embeds: image tokens looked up as pad, then the features scattered
    in (Gemma4Model.forward)."""
    ids = torch.from_numpy(input_ids)
    image = ids == model.config.image_token_id
    with torch.no_grad():
        llm_ids = torch.where(image, model.config.text_config.pad_token_id, ids)
        embeds = model.model.get_input_embeddings()(llm_ids)
        mask = image[..., None].expand_as(embeds)
        return embeds.masked_scatter(mask, torch.from_numpy(features)).numpy()


def _config(model) -> VisionLanguageConfig:
    """The VisionLanguageConfig of the checkpoint's config.json, read by the gemma4 row."""
    return VISION_LANGUAGE["gemma4"].parse_config(model.config.to_dict())


def _attach(model: ir.Model, tensors: dict[str, np.ndarray], dtype: ir.DataType) -> None:
    family = VISION_LANGUAGE["gemma4"]
    for name, value in model.graph.initializers.items():
        if value.const_value is not None:
            continue
        array = tensors[family.checkpoint_name(name)]
        if value.meta.get(TRANSPOSED_FROM_CHECKPOINT):
            array = array.T
        value.const_value = ir.tensor(array.astype(dtype.numpy()))


def vision_graphs(
    model, folder: Path, ep: str = "default", dtype: str | None = "fp32", **config_changes: object
) -> dict[str, ir.Model]:
    """The vision and embedding graphs of the checkpoint saved in `folder`, built and
    optimized for `ep` and `dtype` (None: the EP's), weights attached; `config_changes`
    replace fields of the vision config (a mutant's)."""
    config = _config(model)
    if config_changes:
        config = dataclasses.replace(
            config, vision=dataclasses.replace(config.vision, **config_changes)
        )
    target = resolve_target(ep, dtype=dtype)
    width = config.embedding_width
    with build_context(target.ep, target.dtype):
        graphs = {
            "vision": VisionTask().build(VISION_LANGUAGE["gemma4"].vision_model(config), width),
            "embedding": EmbeddingTask().build(EmbeddingModel(config), width),
        }
    tensors = load_file(folder / "model.safetensors")
    for role, graph in graphs.items():
        _attach(graph, tensors, target.dtype)
        optimize_model(graph, ep=target.ep, dtype=target.dtype, model_role=role)
    return graphs


def sessions(graphs: dict[str, ir.Model]) -> dict[str, ort.InferenceSession]:
    return {
        key: ort.InferenceSession(
            ir.serde.serialize_model(graph).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
        for key, graph in graphs.items()
    }


def prefill_logits(package, ids: np.ndarray, images: dict[str, np.ndarray]) -> np.ndarray:
    """The decoder's float32 logits of a prompt `ids` with its `images` (`image_inputs`), run
    through the package's three graphs in onnxruntime (one call, no cache; pixels and cache in
    the graphs' float dtype)."""
    graphs = package_sessions(package)
    dtype = np.float16 if "float16" in graphs["vision"].get_inputs()[0].type else np.float32
    images = {**images, "pixel_values": images["pixel_values"].astype(dtype)}
    (features,) = graphs["vision"].run(None, images)
    (embeds,) = graphs["embedding"].run(None, {"input_ids": ids, "image_features": features})
    feeds = {"inputs_embeds": embeds, "input_ids": ids, "attention_mask": np.ones_like(ids)}
    for value in graphs["decoder"].get_inputs():
        if value.name.startswith("past"):
            feeds[value.name] = np.zeros((1, value.shape[1], 0, value.shape[3]), dtype)
    return run_declared(graphs["decoder"], feeds)["logits"].astype(np.float32)


def og_image_inputs(bundle: Path, folder: Path, pixels: list[np.ndarray], text: str = "Describe."):
    """(og.Model, inputs): og's multimodal processor on `pixels` (written as PNG files in
    `folder`), one `<|image>` each in the prompt."""
    paths = []
    for i, image in enumerate(pixels):
        path = folder / f"image{i}.png"
        path.write_bytes(png_bytes(image))
        paths.append(str(path))
    model = og.Model(str(bundle))
    prompt = " ".join(["<|image>"] * len(pixels) + [text])
    return model, model.create_multimodal_processor()(prompt, images=og.Images.open(*paths))


def og_prefill_logits(og_model, inputs) -> np.ndarray:
    """og.Generator's logits of every prompt position, after the prefill of `inputs`."""
    length = inputs["input_ids"].as_numpy().shape[1]
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=length + 1)
    generator = og.Generator(og_model, params)
    generator.set_inputs(inputs)
    generator.generate_next_token()
    return generator.get_output("logits")


SPECIALS = ["<|image>", "<|image|>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"]
#: 70 soft tokens of 3 x 3 patches of 4 pixels: og's Gemma4ImageTransform and transformers'
#: processor resize to at most 630 patches; these sizes they keep (whole 12-pixel blocks
#: filling the budget).
MAX_SOFT_TOKENS = 70
KEPT_SIZES = ((72, 132), (96, 96), (108, 84))


def write_gemma4_checkpoint(
    folder: Path, *, audio_config: dict | None = None, **text_changes: object
) -> Gemma4ForConditionalGeneration:
    """A packageable tiny Gemma 4 checkpoint in `folder`: the model, tiny-qwen2's tokenizer
    with Gemma 4's image, video and audio tokens, and the image processor's settings;
    `text_changes` replace text_config keys; `audio_config` (None: no audio tower)."""
    from transformers import AutoTokenizer

    from tests.conftest import TINY_QWEN2

    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    boi, image, eoi, video, audio, boa, eoa = tokenizer.convert_tokens_to_ids(SPECIALS)
    vocab = len(tokenizer) + 4
    # three layers (sliding, full, full): the smoke test's twin keeps the first two
    text = {"vocab_size": vocab, "vocab_size_per_layer_input": vocab, "num_hidden_layers": 3}
    text["layer_types"] = ["sliding_attention", "full_attention", "full_attention"]
    text.update(text_changes)
    ids = dict(image_token_id=image, boi_token_id=boi, eoi_token_id=eoi, video_token_id=video)
    ids.update(audio_token_id=audio, boa_token_id=boa, eoa_token_index=eoa)
    model = _tiny(text, ids, audio=audio_config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    preprocessor = {  # Gemma4ImageProcessor's settings (saving it needs torchvision)
        "image_processor_type": "Gemma4ImageProcessor",
        "patch_size": PATCH,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOL,
        "do_normalize": False,
        "rescale_factor": 1 / 255,
    }
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def kept_size(height: int, width: int) -> tuple[int, int]:
    """transformers' Gemma4ImageProcessor's target (height, width) for an image, for this
    checkpoint's budget: its `get_aspect_ratio_preserving_size`, read from the module's source
    (the module imports torchvision, which tests do not install)."""
    module = importlib.util.find_spec("transformers.models.gemma4.image_processing_gemma4")
    tree = ast.parse(Path(module.origin).read_text())
    [function] = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "get_aspect_ratio_preserving_size"
    ]
    namespace: dict = {"math": math}
    exec(compile(ast.Module([function], []), module.origin, "exec"), namespace)
    return namespace["get_aspect_ratio_preserving_size"](
        height=height,
        width=width,
        patch_size=PATCH,
        max_patches=MAX_SOFT_TOKENS * POOL * POOL,
        pooling_kernel_size=POOL,
    )
