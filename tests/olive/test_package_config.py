"""`mobius-genai olive-config`: Olive's whole registry plus MobiusExport and MobiusFinalize."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

from olive.hardware.constants import ExecutionProvider
from olive.package_config import OlivePackageConfig

from mobius_genai.cli import main
from mobius_genai.olive import PASSES, MobiusExport, MobiusFinalize, olive_ep_mapping
from mobius_genai.olive.package_config import olive_package_config
from tests.olive.conftest import RECIPES, ROOT, TINY_QWEN2

README = ROOT / "README.md"


def _olive_registry() -> dict:
    return json.loads(open(OlivePackageConfig.get_default_config_path(), encoding="utf-8").read())


def test_the_config_is_olives_registry_plus_ours():
    ours = olive_package_config()
    olive = _olive_registry()
    assert {k: v for k, v in ours["passes"].items() if k not in PASSES} == olive["passes"]
    assert ours["extra_dependencies"] == olive["extra_dependencies"]
    assert ours["passes"]["MobiusExport"]["module_path"] == "mobius_genai.olive.MobiusExport"


def test_olive_finds_our_passes_and_its_own_through_the_written_file(tmp_path, capsys):
    path = tmp_path / "sub" / "mobius-olive.json"
    assert main(["olive-config", "-o", str(path)]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    config = OlivePackageConfig.parse_file_or_obj(str(path))
    assert config.import_pass_module("MobiusExport") is MobiusExport
    assert config.import_pass_module("mobiusfinalize") is MobiusFinalize
    peephole = config.import_pass_module("OnnxPeepholeOptimizer")
    assert peephole.__module__ == "olive.passes.onnx.peephole_optimizer"


def test_olive_config_without_output_prints_the_json(capsys):
    assert main(["olive-config"]) == 0
    assert json.loads(capsys.readouterr().out) == olive_package_config()


def test_mapped_ep_names_are_olives():
    olive_names = {str(ep) for ep in ExecutionProvider}
    # MLX is a plugin EP that Olive's enum does not list yet; every other name must be Olive's.
    assert set(olive_ep_mapping()) - {"MLXExecutionProvider"} <= olive_names


def test_without_the_package_config_olive_fails_as_the_readme_says(tmp_path, monkeypatch):
    """Olive's own error, before any mobius-genai code runs: the README quotes it."""
    from olive.workflows import run

    monkeypatch.chdir(tmp_path)  # Olive's cache folder
    config = json.loads((RECIPES / "cpu-fp32.json").read_text())
    config["input_model"]["model_path"] = str(TINY_QWEN2)
    config["output_dir"] = str(tmp_path / "out")
    with pytest.raises(ValueError) as raised:
        run(config)
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert f"ValueError: {raised.value}" in readme
