"""Bundles this machine cannot run as they are: a bf16 graph (onnxruntime's CPU provider has no
bf16 kernels) and a bundle for an EP that is not installed here. `package` succeeds and says
why its smoke test did not run, `validate` says what runs the bundle, `run` says so in one line
instead of onnxruntime-genai's raw error, and `run --ep cpu` runs a GPU bundle on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest

from mobius_genai.cli import main
from mobius_genai.ep import ep_registry, get_ep
from tests.conftest import TINY_QWEN2


def _bf16_runners() -> list[str]:
    """The EPs with bf16 kernels that onnxruntime-genai runs (from the table, not by name)."""
    return [
        caps.name
        for caps in ep_registry.entries()
        if ir.DataType.BFLOAT16 in caps.model_dtypes and caps.runtime.genai_provider is not None
    ]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mobius-genai: error: "), err
    return err


@pytest.fixture(scope="module")
def cuda_bundle(packaged) -> Path:
    return packaged("cuda")


@pytest.mark.parametrize("ep", ["default", "onnx-standard"])
def test_bf16_for_a_cpu_provider_packages_and_says_what_runs_it(ep, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["package", str(TINY_QWEN2), "--ep", ep, "--dtype", "bf16", "-o", str(out)]) == 0
    capsys.readouterr()
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert record["ran"] is False
    assert "no bf16 kernels" in record["note"] and "Could not find" not in record["note"]
    assert all(name in record["note"] for name in _bf16_runners()) and _bf16_runners()
    assert "smoke test skipped: onnxruntime's CPU provider" in (out / "README.md").read_text()

    assert main(["validate", str(out)]) == 0
    said = capsys.readouterr().out
    assert "valid" in said and "no bf16 kernels" in said

    err = _one_line_error(["run", str(out), "--prompt", "hi"], capsys)
    assert "no bf16 kernels" in err and "--ep" in err and "Could not find" not in err


def test_the_card_of_a_bf16_cpu_provider_bundle_says_what_runs_it(tmp_path, capsys):
    out = tmp_path / "b"
    args = ["package", str(TINY_QWEN2), "--dtype", "bf16", "-o", str(out), "--no-smoke-test"]
    assert main([*args, "--quiet"]) == 0
    card = (out / "README.md").read_text()
    needs = card[card.index("Needs ") :].split("\n")[0]
    assert "no bf16 kernels" in needs and all(name in needs for name in _bf16_runners())
    assert "GLIBC_TUNABLES" not in needs  # the CPU tip does not apply


def test_run_names_the_package_that_runs_a_gpu_bundle(cuda_bundle, capsys):
    err = _one_line_error(["run", str(cuda_bundle), "--prompt", "hi"], capsys)
    assert get_ep("cuda").runtime.package in err
    assert "--ep cpu" in err and "libonnxruntime" not in err


def test_run_ep_cpu_runs_a_gpu_bundle_without_changing_it(cuda_bundle, capsys):
    before = {path.name: path.read_bytes() for path in cuda_bundle.iterdir()}
    args = ["run", str(cuda_bundle), "--ep", "cpu", "--prompt", "hi", "--max-new-tokens", "4"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip()
    assert {path.name: path.read_bytes() for path in cuda_bundle.iterdir()} == before


def test_run_names_the_package_of_a_dml_bundle(tmp_path, capsys):
    out = tmp_path / "dml"
    args = ["package", str(TINY_QWEN2), "--ep", "dml", "-o", str(out), "--quiet"]
    assert main([*args, "--no-smoke-test"]) == 0
    err = _one_line_error(["run", str(out), "--prompt", "hi"], capsys)
    assert get_ep("dml").runtime.package in err and "--ep cpu" in err


def test_run_ep_takes_only_known_eps(cuda_bundle, capsys):
    err = _one_line_error(["run", str(cuda_bundle), "--ep", "nope", "--prompt", "hi"], capsys)
    assert "nope" in err and "cpu" in err
