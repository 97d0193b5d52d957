"""Smoke test: onnxruntime-genai generates, and agrees with a plain onnxruntime loop."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og
import pytest

from mobius_genai import packager
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError
from mobius_genai.kinds import text as text_kind
from mobius_genai.runtime import _smoke_child
from mobius_genai.runtime._smoke_child import ort_greedy_tokens, run_smoke
from mobius_genai.runtime.generate import greedy_tokens
from mobius_genai.runtime.smoke import smoke_test
from tests.conftest import TINY_QWEN2

CPU = get_ep("cpu").runtime.ort_provider

GPU_EPS = ["cuda", "dml", "webgpu", "trt-rtx", "mlx"]
#: How a note names each: onnxruntime-genai's provider name only where it is another word.
EP_WORDS = {
    "cuda": "the cuda EP",
    "dml": "the dml EP",
    "webgpu": "the webgpu EP",
    "trt-rtx": "the trt-rtx EP (NvTensorRtRtx)",
    "mlx": "the mlx EP (MLXExecutionProvider)",
}


def _run_on_cpu(folder: Path) -> None:
    """DESIGN.md: an EP bundle's graph runs on CPU once provider_options is []."""
    path = folder / "genai_config.json"
    document = json.loads(path.read_text())
    document["model"]["decoder"]["session_options"]["provider_options"] = []
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("ep", ["cpu", "default", "onnx-standard"])
def test_smoke_test_runs_and_matches_plain_onnxruntime(packaged, ep: str):
    result = smoke_test(packaged(ep), get_ep(ep))
    assert result.ran and len(result.tokens) == 8
    assert result.note.endswith("same as a plain onnxruntime loop")


@pytest.mark.parametrize("ep", GPU_EPS)
def test_ep_not_available_here_runs_its_graph_on_cpu(packaged, ep: str):
    result = smoke_test(packaged(ep), get_ep(ep))
    assert result.ran and len(result.tokens) == 8
    assert result.note.startswith(f"smoke test on CPU (the {ep} EP")
    assert result.note.endswith("same as a plain onnxruntime loop")


@pytest.mark.parametrize("ep", GPU_EPS)
def test_ep_not_available_and_graph_not_loadable_on_cpu_is_skipped_with_the_cause(
    packaged, ep: str, monkeypatch: pytest.MonkeyPatch
):
    real_load = _smoke_child.load_model

    def no_cpu_kernels(folder, *, cpu=False, session_options=None):
        if not cpu:
            return real_load(folder, cpu=cpu, session_options=session_options)
        try:
            raise RuntimeError("Could not find an implementation for GroupQueryAttention(1)")
        except RuntimeError as error:
            raise BundleError(f"{folder}: cannot load the bundle on CPU: {error}") from error

    monkeypatch.setattr(_smoke_child, "load_model", no_cpu_kernels)
    result = run_smoke(packaged(ep), ep, get_ep(ep).runtime.genai_provider, {}, cpu_provider=CPU)
    assert not result["ran"]
    assert result["note"] == (
        f"smoke test skipped: {EP_WORDS[ep]} is not available here, "
        "and on CPU: Could not find an implementation for GroupQueryAttention(1)"
    )


def test_a_gpu_bundle_that_loads_on_cpu_but_fails_to_generate_is_an_error(
    packaged, monkeypatch: pytest.MonkeyPatch
):
    def broken(*args, **kwargs):
        raise BundleError("onnxruntime-genai failed after 2 generated tokens: bad shape")

    monkeypatch.setattr(_smoke_child, "greedy_tokens", broken)
    with pytest.raises(BundleError, match="failed after 2 generated tokens"):
        run_smoke(
            packaged("cuda"), "cuda", get_ep("cuda").runtime.genai_provider, {}, cpu_provider=CPU
        )


@pytest.mark.parametrize("ep", GPU_EPS)
def test_ep_bundle_runs_on_cpu_with_cpu_provider_options(bundle_copy, ep: str):
    folder = bundle_copy(ep)
    _run_on_cpu(folder)
    model = og.Model(str(folder))
    prompt = [int(token) for token in og.Tokenizer(model).encode("Hello")]
    tokens = greedy_tokens(model, prompt, len(prompt) + 6)
    assert tokens == ort_greedy_tokens(folder / "model.onnx", prompt, 6, provider=CPU)


def test_config_that_loads_but_miswires_the_graph_fails(bundle_copy):
    """Swapped key/value names load fine in genai; only the reference loop notices."""
    folder = bundle_copy("cpu")
    path = folder / "genai_config.json"
    document = json.loads(path.read_text())
    inputs = document["model"]["decoder"]["inputs"]
    inputs["past_key_names"], inputs["past_value_names"] = (
        inputs["past_value_names"],
        inputs["past_key_names"],
    )
    path.write_text(json.dumps(document))
    with pytest.raises(BundleError, match="plain onnxruntime loop over the same graph generated"):
        smoke_test(folder, get_ep("cpu"))


def test_unloadable_cpu_bundle_is_an_error(bundle_copy):
    folder = bundle_copy("cpu")
    (folder / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(BundleError, match="onnxruntime-genai cannot load the bundle"):
        smoke_test(folder, get_ep("cpu"))


def test_package_smoke_note_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    packager.package(TINY_QWEN2, "cpu", tmp_path / "a")
    err = capsys.readouterr().err
    assert "smoke test: generated 8 tokens" in err
    packager.package(TINY_QWEN2, "cuda", tmp_path / "b")
    assert "smoke test on CPU (the cuda EP is not available here)" in capsys.readouterr().err
    packager.package(TINY_QWEN2, "cpu", tmp_path / "c", quiet=True)
    assert capsys.readouterr().err == ""


def test_failing_smoke_test_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = text_kind.make_genai_config

    def miswired(*args, **kwargs):
        document = real(*args, **kwargs)
        inputs = document["model"]["decoder"]["inputs"]
        inputs["past_key_names"], inputs["past_value_names"] = (
            inputs["past_value_names"],
            inputs["past_key_names"],
        )
        return document

    monkeypatch.setattr(text_kind, "make_genai_config", miswired)
    with pytest.raises(BundleError, match="smoke test") as caught:
        packager.package(TINY_QWEN2, "cpu", tmp_path / "out", quiet=True)
    assert list(tmp_path.iterdir()) == []
    assert ".partial" not in str(caught.value)


def test_a_bundle_that_fails_validation_is_named_as_asked(tmp_path: Path, monkeypatch):
    real = text_kind.make_genai_config

    def wrong_vocab(*args, **kwargs):
        document = real(*args, **kwargs)
        document["model"]["vocab_size"] = 100
        return document

    monkeypatch.setattr(text_kind, "make_genai_config", wrong_vocab)
    with pytest.raises(BundleError, match=rf"^bundle {tmp_path / 'out'}: model.vocab_size: 100"):
        packager.package(TINY_QWEN2, "cpu", tmp_path / "out", quiet=True)
    assert list(tmp_path.iterdir()) == []
