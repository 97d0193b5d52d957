"""Gemma 3's vision, embedding and decoder graphs against transformers (fp32, 1e-4)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx_ir as ir
import pytest
import torch
from safetensors.numpy import load_file, save_file

from mobius_genai.build import build
from mobius_genai.errors import WeightsError
from tests._ort import (
    assert_only_the_decoder_fuses_gqa,
    decode_like_transformers,
    model_ops,
    package_sessions,
    run_declared,
)
from tests._vlm import IMAGE_TOKEN, TEXT_HIDDEN, image_prompt, tiny_gemma3

TOLERANCE = 1e-4
F16_TOLERANCE = 5e-2
LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 16


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    model = tiny_gemma3()
    folder = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(folder)
    return model, folder


def _empty_past() -> dict[str, np.ndarray]:
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    return {
        f"past_key_values.{i}.{kind}": empty for i in range(LAYERS) for kind in ("key", "value")
    }


def _image_block_gqa(model: ir.Model) -> list[ir.Node]:
    """The decoder's GroupQueryAttention nodes that take the image-block bias (causal=0)."""
    return [
        node
        for node in model.graph.all_nodes()
        if node.op_type == "GroupQueryAttention"
        and node.attributes.get_int("causal", 1) == 0
        and len(node.inputs) > 10
        and node.inputs[10] is not None
    ]


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_graphs_match_transformers_over_prefill_and_decode(gemma3, ep):
    """On cpu the decoder's attention is GroupQueryAttention(causal=0) with the image-block bias
    (the kernel onnxruntime-genai runs); onnx-standard keeps ONNX Attention with it."""
    model, folder = gemma3
    package = build(folder, ep, "fp32", progress=False)
    assert sorted(package) == ["decoder", "embedding", "vision"]
    assert len(_image_block_gqa(package["decoder"])) == (LAYERS if ep == "cpu" else 0)
    sessions = package_sessions(package)
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ids = image_prompt()
    with torch.no_grad():
        features_ref = model.model.get_image_features(pixels).pooler_output.reshape(-1, TEXT_HIDDEN)
        embeds_ref = model.model.get_input_embeddings()(torch.where(ids == IMAGE_TOKEN, 0, ids))
        embeds_ref = embeds_ref.masked_scatter((ids == IMAGE_TOKEN)[..., None], features_ref)
        reference = model(
            input_ids=ids,
            pixel_values=pixels,
            token_type_ids=(ids == IMAGE_TOKEN).long(),
            use_cache=True,
        )
    (features,) = sessions["vision"].run(None, {"pixel_values": pixels.numpy()})
    np.testing.assert_allclose(features, features_ref.numpy(), atol=TOLERANCE, rtol=0)
    (embeds,) = sessions["embedding"].run(
        None, {"input_ids": ids.numpy(), "image_features": features}
    )
    np.testing.assert_allclose(embeds, embeds_ref.numpy(), atol=TOLERANCE, rtol=0)
    seq = ids.shape[1]
    feeds = {
        "inputs_embeds": embeds,
        "input_ids": ids.numpy(),
        "attention_mask": np.ones((1, seq), np.int64),
        "position_ids": np.arange(seq)[None],
        **_empty_past(),
    }
    outputs = run_declared(sessions["decoder"], feeds)
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    decode_like_transformers(model, sessions, outputs, reference)


@pytest.mark.parametrize(
    ("ep", "image_gqa"), [("cpu", True), ("cuda", True), ("dml", False), ("onnx-standard", False)]
)
def test_graph_ops_per_ep(gemma3, ep, image_gqa, recwarn):
    """GroupQueryAttention(causal=0) with the image-block bias in every decoder layer where the
    EP's kernel takes attention_bias; elsewhere ONNX Attention keeps the bias."""
    _, folder = gemma3
    package = build(folder, ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(package, ep)
    decoder = package["decoder"]
    fused = _image_block_gqa(decoder)
    assert len(fused) == (LAYERS if image_gqa else 0)
    assert (("", "Attention") in model_ops(decoder)) != image_gqa
    for node in fused:  # the window lives in the bias: GQA's own must stay off
        assert node.attributes.get_int("local_window_size", -1) == -1
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


def test_the_cuda_decoder_runs_on_the_cpu_kernel_like_transformers(gemma3):
    """cuda's float16 decoder graph (GroupQueryAttention with the bias) on onnxruntime's CPU
    kernel: the prefill logits of an image prompt against transformers' (float32; float16
    tolerance: logits up to 11 in size)."""
    model, folder = gemma3
    package = build(folder, "cuda", progress=False)
    assert len(_image_block_gqa(package["decoder"])) == LAYERS
    sessions = package_sessions(package)
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ids = image_prompt()
    with torch.no_grad():
        reference, causal = (
            model(input_ids=ids, pixel_values=pixels, token_type_ids=types).logits.numpy()
            for types in ((ids == IMAGE_TOKEN).long(), torch.zeros_like(ids))
        )
    (features,) = sessions["vision"].run(None, {"pixel_values": pixels.numpy().astype(np.float16)})
    (embeds,) = sessions["embedding"].run(
        None, {"input_ids": ids.numpy(), "image_features": features}
    )
    seq = ids.shape[1]
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float16)
    feeds = {
        "inputs_embeds": embeds,
        "input_ids": ids.numpy(),
        "attention_mask": np.ones((1, seq), np.int64),
        **{
            f"past_key_values.{i}.{kind}": empty for i in range(LAYERS) for kind in ("key", "value")
        },
    }
    logits = run_declared(sessions["decoder"], feeds)["logits"].astype(np.float32)
    np.testing.assert_allclose(logits, reference, atol=F16_TOLERANCE, rtol=0)
    assert np.abs(logits - causal).max() > 20 * F16_TOLERANCE  # the image blocks matter


def test_trace_says_why_gqa_declined(gemma3):
    _, folder = gemma3
    package = build(folder, "dml", load_weights=False, progress=False)
    decoder = package.reports["decoder"]
    reasons = [decline.reason for decline in decoder.rules["GQAFusion"].declines]
    assert reasons and all("cannot see later keys" in r for r in reasons), reasons
    assert "attention_bias" in decoder.skipped["GQAImageBlockFusion"]
    assert package.reports["vision"].skipped["GQAFusion"] == "role 'vision' (GQA is for decoders)"
    assert package.reports["embedding"].skipped["GQAFusion"].startswith("role 'embedding'")


def test_text_only_checkpoint_keeps_one_model(tmp_path):
    from tests._hf import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path, "gemma3_text")
    package = build(tmp_path, "cpu", "fp32", load_weights=False, progress=False)
    assert list(package) == ["model"] and package.kind_config is None


def test_a_tensor_no_graph_reads_is_named(gemma3, tmp_path):
    """The three graphs are checked together: a stray tensor is an error, the SigLIP head is not."""
    _, folder = gemma3
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    tensors = load_file(copy / "model.safetensors")
    tensors["vision_tower.vision_model.head.probe"] = np.zeros(4, np.float32)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert set(build(copy, "cpu")) == {"vision", "embedding", "decoder"}
    tensors["multi_modal_projector.stray.weight"] = np.zeros(4, np.float32)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match="multi_modal_projector.stray.weight"):
        build(copy, "cpu")
