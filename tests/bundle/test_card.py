"""The bundle card: values from genai_config and the build record, per-provider run notes."""

from __future__ import annotations

from mobius_genai.bundle.card import HUGE_PAGES_TIP, render_card

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


def test_gpu_card_names_its_provider_and_not_the_cpu_tip():
    card = _card([{"cuda": {"enable_cuda_graph": "0"}}], "cuda")
    assert "the CPU-only wheel cannot load it" in card and "`cuda`" in card
    assert HUGE_PAGES_TIP not in card
