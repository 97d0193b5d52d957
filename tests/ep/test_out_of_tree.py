"""Adding an EP is one entry: an out-of-tree EP registered at runtime gets its bundle's provider
options, card note, Olive mapping, `mobius-genai eps` row and CLI name from that entry alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx_ir as ir
import pytest

from mobius_genai import EpCapabilities, RuntimeInfo, build, get_ep, package, register_ep
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.ep import ep_registry
from mobius_genai.olive import mobius_ep_for, olive_ep_mapping
from mobius_genai.runtime.smoke import smoke_test
from tests.conftest import TINY_QWEN2

#: Only what an EP needs: its graph capabilities and how the runtimes name and ship it.
MY_EP = EpCapabilities(
    name="my-ep",
    gqa_dtypes=frozenset({ir.DataType.FLOAT}),
    provider_options={"device_id": "0"},
    runtime=RuntimeInfo(
        ort_provider="MyAccelExecutionProvider",
        genai_provider="MyAccel",
        package="onnxruntime-genai-myaccel",
        card_note="MyAccel needs its driver 2.0.",
    ),
)


@pytest.fixture
def my_ep(monkeypatch: pytest.MonkeyPatch) -> EpCapabilities:
    """MY_EP in the global registry for one test (the registry's table is restored after it)."""
    monkeypatch.setattr(ep_registry, "_entries", dict(ep_registry._entries))
    register_ep(MY_EP)
    return MY_EP


def _eps_row(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, str]:
    assert main(["eps", "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    (row,) = [line for line in lines if line.startswith(f"{name} ")]
    return dict(zip(header, re.split(r"\s{2,}", row.rstrip()), strict=True))


@pytest.mark.usefixtures("my_ep")
def test_a_bundle_for_an_out_of_tree_ep_comes_from_its_entry(tmp_path: Path):
    folder = package(TINY_QWEN2, "My-EP", tmp_path / "bundle", quiet=True)  # smoke test on CPU
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["provider_options"] == [
        {"MyAccel": {"device_id": "0"}}
    ]
    card = (folder / "README.md").read_text()
    assert "onnxruntime-genai provider `MyAccel`" in card
    assert "Needs `pip install onnxruntime-genai-myaccel`. MyAccel needs its driver 2.0." in card
    report = validate_bundle(folder)
    assert report.manifest["build"]["execution_provider"] == "my-ep"
    result = smoke_test(folder, get_ep("my-ep"))
    assert result.ran and len(result.tokens) == 8  # MyAccel is missing here: its graph ran on CPU


@pytest.mark.usefixtures("my_ep")
def test_the_olive_accelerator_it_declares_maps_to_it():
    assert mobius_ep_for("MyAccelExecutionProvider") == "my-ep"
    assert mobius_ep_for("myaccelexecutionprovider") == "my-ep"
    assert olive_ep_mapping()["MyAccelExecutionProvider"] == "my-ep"


def test_without_the_entry_nothing_knows_it(capsys: pytest.CaptureFixture[str]):
    assert "MyAccelExecutionProvider" not in olive_ep_mapping()
    assert "my-ep" not in ep_registry
    assert main(["eps"]) == 0
    assert "my-ep" not in capsys.readouterr().out


@pytest.mark.usefixtures("my_ep")
def test_its_eps_row_comes_from_the_entry(capsys: pytest.CaptureFixture[str]):
    row = _eps_row(capsys, "my-ep")
    assert row["GQA dtypes"] == "fp32"
    assert row["provider options"] == "device_id=0"
    assert row["onnxruntime EP"] == "MyAccelExecutionProvider"


@pytest.mark.usefixtures("my_ep")
def test_the_cli_takes_its_onnxruntime_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "bundle"
    args = ["package", str(TINY_QWEN2), "--ep", "MyAccelExecutionProvider", "-o", str(out)]
    assert main([*args, "--no-smoke-test", "--quiet"]) == 0
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    assert manifest["build"]["execution_provider"] == "my-ep"


@pytest.mark.parametrize("name", ["CUDA", "CUDAExecutionProvider", "cudaexecutionprovider"])
def test_build_takes_any_case_and_onnxruntime_names(name: str):
    built = build(TINY_QWEN2, execution_provider=name, dtype=None, load_weights=False)
    ops = {node.op_type for node in built["model"].graph}
    assert "GroupQueryAttention" in ops  # cuda's capabilities, f16 by default
    assert built["model"].graph.outputs[0].dtype == ir.DataType.FLOAT16


def test_the_cli_help_lists_the_registered_eps(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no wrapping inside a name
    with pytest.raises(SystemExit):
        main(["package", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(ep_registry) in help_text
