"""Olive EP names → ours, and what works without olive-ai installed (no olive needed here)."""

from __future__ import annotations

import importlib
import sys

import pytest

import mobius_genai.olive
from mobius_genai.cli import main
from mobius_genai.ep import ep_registry
from mobius_genai.errors import ExecutionProviderError
from mobius_genai.olive import mobius_ep_for, olive_ep_mapping


@pytest.mark.parametrize(
    ("olive_ep", "ours"),
    [
        ("CPUExecutionProvider", "cpu"),
        ("CUDAExecutionProvider", "cuda"),
        ("DmlExecutionProvider", "dml"),
        ("WebGpuExecutionProvider", "webgpu"),
        ("NvTensorRTRTXExecutionProvider", "trt-rtx"),
        ("cudaexecutionprovider", "cuda"),
        (None, "cpu"),
        ("", "cpu"),
    ],
)
def test_olive_eps_map_to_ours(olive_ep, ours):
    assert mobius_ep_for(olive_ep) == ours


def test_the_mapping_is_each_registered_eps_onnxruntime_name():
    assert olive_ep_mapping() == {
        "CPUExecutionProvider": "cpu",
        "CUDAExecutionProvider": "cuda",
        "DmlExecutionProvider": "dml",
        "MLXExecutionProvider": "mlx",
        "NvTensorRTRTXExecutionProvider": "trt-rtx",
        "WebGpuExecutionProvider": "webgpu",
    }
    assert all(name in ep_registry for name in olive_ep_mapping().values())


def test_our_own_names_are_not_olive_execution_providers():
    with pytest.raises(ExecutionProviderError, match=r"'cuda' has no mobius-genai counterpart"):
        mobius_ep_for("cuda")


@pytest.mark.parametrize("olive_ep", ["TensorrtExecutionProvider", "QNNExecutionProvider"])
def test_an_ep_without_counterpart_is_refused_with_the_way_out(olive_ep):
    with pytest.raises(ExecutionProviderError, match=f"{olive_ep}.*set the pass's `ep`") as info:
        mobius_ep_for(olive_ep)
    assert isinstance(info.value, ValueError)  # Olive re-raises ValueErrors: `olive run` fails


@pytest.fixture
def without_olive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import olive` fail as if olive-ai were not installed."""
    for name in list(sys.modules):
        if name == "olive" or name.startswith("olive."):
            monkeypatch.delitem(sys.modules, name)
        if name in ("mobius_genai.olive.export", "mobius_genai.olive.finalize"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "olive", None)


@pytest.mark.usefixtures("without_olive")
def test_without_olive_the_passes_say_how_to_install_it():
    module = importlib.reload(mobius_genai.olive)
    assert module.mobius_ep_for("CUDAExecutionProvider") == "cuda"
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'mobius-genai\[olive\]'"):
        module.MobiusExport  # noqa: B018
    with pytest.raises(AttributeError):
        module.NoSuchPass  # noqa: B018


@pytest.mark.usefixtures("without_olive")
def test_without_olive_olive_config_is_a_one_line_error(tmp_path, capsys):
    assert main(["olive-config", "-o", str(tmp_path / "olive.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mobius-genai: error: olive-ai is not installed")
    assert "pip install 'mobius-genai[olive]'" in err
    assert not (tmp_path / "olive.json").exists()
