"""The bundle card: values from genai_config and the build record, per-provider run notes."""

from __future__ import annotations

import pytest

from mobius_genai.bundle.card import HUGE_PAGES_TIP, render_card
from mobius_genai.ep import get_ep

BUILD = {"execution_provider": "cpu", "precision": "int4", "dtype": "f32", "model_type": "qwen2"}


def _config(providers: list) -> dict:
    decoder = {
        "session_options": {"provider_options": providers},
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_size": 16,
    }
    return {"model": {"type": "qwen2", "context_length": 64, "decoder": decoder}}


def _card(providers: list, execution_provider: str) -> str:
    return render_card(
        _config(providers),
        folder="b",
        model_id="org/model",
        revision=None,
        build={**BUILD, "execution_provider": execution_provider},
        tool_version="0",
        files=["model.onnx"],
    )


def test_cpu_card_tells_linux_users_about_huge_pages():
    card = _card([], "cpu")
    assert "Needs `pip install onnxruntime-genai`." in card
    assert HUGE_PAGES_TIP in card and "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in HUGE_PAGES_TIP


@pytest.mark.parametrize(
    ("ep", "needs"),
    [
        ("cuda", "Needs `pip install onnxruntime-genai-cuda`. It is the build for CUDA 12."),
        ("dml", "Needs `pip install onnxruntime-genai-directml`. It is the DirectML build"),
        ("webgpu", "Needs an onnxruntime-genai build with the `webgpu` execution provider."),
        ("trt-rtx", "build with the `NvTensorRtRtx` execution provider. That is NVIDIA's TensorRT"),
        ("mlx", 'og.register_execution_provider_library("MLXExecutionProvider"'),
    ],
)
def test_gpu_cards_say_what_runs_them(ep: str, needs: str):
    caps = get_ep(ep)
    card = _card([{caps.runtime.genai_provider: dict(caps.provider_options)}], ep)
    assert f"`{caps.runtime.genai_provider}`" in card and needs in card
    # MLX is a plugin that the stock wheel loads; every other GPU EP needs its own build.
    assert ("The CPU-only wheel cannot load this bundle." in card) == (ep != "mlx")
    assert HUGE_PAGES_TIP not in card
    if ep != "cuda":
        assert "onnxruntime-genai-cuda" not in card


@pytest.mark.parametrize("ep", ["default", "onnx-standard", "not-registered-here"])
def test_every_cpu_card_names_the_stock_wheel_and_the_tip(ep: str):
    card = _card([], ep)
    assert f"Needs `pip install onnxruntime-genai`. {HUGE_PAGES_TIP}" in card


def test_an_out_of_tree_provider_is_named_as_it_is():
    card = _card([{"MyAccelerator": {}}], "my-ep")
    assert "Needs an onnxruntime-genai build with the `MyAccelerator` execution provider." in card
