"""recipes/: complete Olive workflows; `olive run` on the tiny model, alone and in a chain."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime_genai as og
import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

from olive.hardware.accelerator import AcceleratorSpec
from olive.workflows.run.config import RunConfig

from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.validate import check_graph_against_config, validate_bundle
from mobius_genai.errors import BundleError
from mobius_genai.olive import MobiusExport, mobius_ep_for
from mobius_genai.runtime.generate import greedy_tokens
from tests.olive.conftest import (
    RECIPE_NAMES,
    RECIPES,
    load_recipe,
    local_recipe,
)

PROMPT = "The capital of France is"

#: The chain: MobiusExport, an Olive built-in ONNX pass, then MobiusFinalize.
CHAIN = {"peephole": {"type": "OnnxPeepholeOptimizer"}, "finalize": {"type": "MobiusFinalize"}}


def _tokens(folder: Path, new_tokens: int = 16) -> list[int]:
    model = og.Model(str(folder))
    prompt = [int(token) for token in og.Tokenizer(model).encode(PROMPT)]
    return greedy_tokens(model, prompt, len(prompt) + new_tokens)


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_each_recipe_is_a_complete_local_workflow_without_evaluator(name):
    recipe = load_recipe(name)
    run_config = RunConfig.parse_file_or_obj(RECIPES / f"{name}.json")
    assert recipe["input_model"]["type"] == "HfModel" and recipe["input_model"]["model_path"]
    assert run_config.engine.host.type == run_config.engine.target.type == "LocalSystem"
    assert run_config.engine.evaluator is None and not run_config.engine.search_strategy
    (accelerator,) = run_config.engine.host.config.accelerators
    (olive_ep,) = accelerator.execution_providers
    ((_, (export,)), *_) = run_config.passes.items()
    assert export.type == "mobiusexport"
    spec = AcceleratorSpec(accelerator_type=accelerator.device, execution_provider=olive_ep)
    config = MobiusExport.generate_config(spec, export.config, disable_search=True)
    ep, precision = name.split("-")
    assert (mobius_ep_for(olive_ep), config.precision) == (ep, precision)
    assert recipe["output_dir"].endswith(name)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_each_recipe_builds_a_valid_bundle_for_its_ep_here(olive_workflow, tmp_path, name):
    """cuda and webgpu bundles too: built on this CPU host, smoke-tested on CPU by the pass."""
    report = validate_bundle(olive_workflow(local_recipe(name, tmp_path)))
    build = report.manifest["build"]
    assert f"{build['execution_provider']}-{build['precision']}" == name


def test_the_cpu_int4_recipe_runs_offline_and_genai_generates(olive_run, tmp_path, tiny_int4):
    out = olive_run(local_recipe("cpu-int4", tmp_path))
    report = validate_bundle(out)
    assert report.manifest["build"]["precision"] == "int4"
    assert "com.microsoft::MatMulNBits" in report.graph.ops
    tokens = _tokens(out)
    assert len(tokens) == 16
    assert tokens == _tokens(tiny_int4)  # the same bundle made without Olive, by package()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
def test_a_chain_with_an_olive_pass_still_yields_a_valid_bundle(olive_workflow, tmp_path, packaged):
    recipe = local_recipe("cpu-fp32", tmp_path)
    recipe["passes"].update(CHAIN)
    out = olive_workflow(recipe)
    # The peephole optimizer really rewrote the graph: Olive stamps its version and, below
    # 2 GB, puts the weights inline.
    metadata = {
        prop.key for prop in onnx.load(out / "model.onnx", load_external_data=False).metadata_props
    }
    assert "olive_version" in metadata
    assert not (out / "model.onnx.data").exists()
    report = validate_bundle(out)  # schema, genai_config against the graph, every checksum
    decoder = report.genai_config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx"
    assert decoder["num_hidden_layers"] == 2
    assert {f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")} <= set(
        report.graph.outputs
    )
    assert _tokens(out) == _tokens(packaged("cpu"))  # the same bundle made by package()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
def test_without_mobius_finalize_genai_config_fits_but_the_manifest_is_stale(
    olive_workflow, tmp_path
):
    """Why chains end with MobiusFinalize: Olive carries the sidecars over unchanged."""
    recipe = local_recipe("cpu-fp32", tmp_path)
    recipe["passes"]["peephole"] = CHAIN["peephole"]
    recipe["passes"]["export"]["smoke_test"] = False
    out = olive_workflow(recipe)
    config = json.loads((out / "genai_config.json").read_text())
    assert check_graph_against_config(config, GraphInfo.from_file(out / "model.onnx")) == []
    with pytest.raises(BundleError, match="model.onnx.data: listed in mobius_manifest.json"):
        validate_bundle(out)
