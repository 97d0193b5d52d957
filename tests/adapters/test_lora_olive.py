"""MobiusExport with LoRA adapters: the pass's `adapters` and an input model's own adapter_path
ship as .onnx_adapter files of the bundle, and og greedy with each active is PEFT's."""

from __future__ import annotations

import onnxruntime_genai as og
import pytest

from mobius_genai.errors import ConfigError
from tests.adapters.conftest import NEW_TOKENS, PROMPT, peft_greedy
from tests.adapters.test_lora_bundle import _greedy
from tests.olive.conftest import export_tiny, local_recipe, olive_workflow, package_config

__all__ = ["olive_workflow", "package_config"]  # fixtures used here


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
def test_the_workflow_ships_the_pass_and_the_input_models_adapters(
    olive_workflow, qwen2_lora, tmp_path
):
    recipe = local_recipe("cpu-fp32", tmp_path / "olive", model=qwen2_lora.checkpoint)
    recipe["input_model"]["adapter_path"] = str(qwen2_lora.adapters["r8"])
    recipe["passes"]["export"].update(
        smoke_test=False, adapters={"r4": str(qwen2_lora.adapters["r4"])}
    )
    out = olive_workflow(recipe)
    shipped = {path.name for path in (out / "adapters").iterdir()}
    assert shipped == {"r4.onnx_adapter", "default.onnx_adapter"}
    model = og.Model(str(out))
    adapters = og.Adapters(model)
    for name in ("r4", "default"):
        adapters.load(str(out / "adapters" / f"{name}.onnx_adapter"), name)
    for name, source in (("r4", "r4"), ("default", "r8")):
        expected = peft_greedy(
            qwen2_lora.checkpoint, qwen2_lora.adapters[source], PROMPT, NEW_TOKENS
        )
        assert _greedy(model, adapters, name) == expected, name


def test_an_adapter_named_like_the_input_models_is_refused(qwen2_lora, tmp_path):
    with pytest.raises(ConfigError, match="names 'default', the name the input model's own"):
        export_tiny(
            tmp_path,
            {"adapters": {"default": str(qwen2_lora.adapters["r4"])}},
            adapter_path=str(qwen2_lora.adapters["r8"]),
        )
    assert not list(tmp_path.rglob("genai_config.json"))  # refused before anything is written


@pytest.mark.parametrize("value", [{"r4": 3}, {"": "dir"}, {"r4": ""}])
def test_adapters_other_than_names_to_folders_are_refused(value, tmp_path):
    with pytest.raises(ValueError, match="adapters .*accepted: a mapping of adapter names"):
        export_tiny(tmp_path, {"adapters": value})
