"""Bad adapters: one line each (what was wrong, what is accepted), and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mobius_genai import packager
from mobius_genai.bundle.adapters import convert_for_bundle
from mobius_genai.cli import main
from mobius_genai.errors import MobiusError

WEIGHTS = "adapter_model.safetensors"


def _copy(adapter: Path, dest: Path, config: dict | None = None, edit=None) -> Path:
    """A copy of `adapter` with `config` keys changed and its tensors passed through `edit`."""
    shutil.copytree(adapter, dest)
    path = dest / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **(config or {})}))
    if edit is not None:
        save_file(edit(load_file(str(dest / WEIGHTS))), str(dest / WEIGHTS))
    return dest


def _pickled(dest: Path) -> Path:
    (dest / WEIGHTS).unlink()
    (dest / "adapter_model.bin").write_bytes(b"not read")
    return dest


BAD_CONFIGS = {
    "dora": ({"use_dora": True}, "use_dora=True is not plain LoRA"),
    "ia3": ({"peft_type": "IA3"}, "peft_type 'IA3'; accepted: 'LORA'"),
    "rank 0": ({"r": 0}, "rank r=0; accepted: a positive integer"),
    "saved modules": ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    "lora bias": ({"bias": "all"}, "bias='all' is not plain LoRA"),
}


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "accepted" in text, text
    return text


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_adapter_config_refused_before_the_build(qwen2_lora, tmp_path, case):
    changes, said = BAD_CONFIGS[case]
    bad = _copy(qwen2_lora.adapters["r4"], tmp_path / "bad", changes)
    out = tmp_path / "bundle"
    with pytest.raises(MobiusError) as caught:
        packager.package(qwen2_lora.checkpoint, "cpu", out, adapters={"x": bad}, quiet=True)
    assert said in _one_line(caught.value)
    assert not out.exists()


def test_pickled_adapter_weights_are_not_read(qwen2_lora, tmp_path):
    bad = _pickled(_copy(qwen2_lora.adapters["r4"], tmp_path / "bad"))
    with pytest.raises(MobiusError) as caught:
        packager.package(
            qwen2_lora.checkpoint, "cpu", tmp_path / "b", adapters={"x": bad}, quiet=True
        )
    assert "pickled" in _one_line(caught.value)
    assert not (tmp_path / "b").exists()


def test_rank_zero_tensors_refused(qwen2_lora, tmp_path):
    def empty(tensors):
        return {
            name: np.zeros((0, t.shape[1]) if "lora_A" in name else (t.shape[0], 0), t.dtype)
            for name, t in tensors.items()
        }

    bad = _copy(qwen2_lora.adapters["r4"], tmp_path / "bad", edit=empty)
    with pytest.raises(MobiusError) as caught:
        packager.package(qwen2_lora.checkpoint, "cpu", tmp_path / "b", adapters={"x": bad})
    assert "rank 0" in _one_line(caught.value)
    assert not (tmp_path / "b").exists()


def test_name_clash_refused(qwen2_lora, tmp_path, capsys):
    adapter = qwen2_lora.adapters["r4"]
    with pytest.raises(MobiusError) as caught:
        packager.package(
            qwen2_lora.checkpoint, "cpu", tmp_path / "b", adapters={"a": adapter, "A": adapter}
        )
    assert "given twice" in _one_line(caught.value)
    argv = ["package", str(qwen2_lora.checkpoint), "--ep", "cpu", "-o", str(tmp_path / "c")]
    argv += ["--adapter", f"a={adapter}", "--adapter", f"a={adapter}", "--quiet"]
    assert main(argv) == 1
    assert "--adapter name 'a' given twice" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def _narrow_q(tensors):
    """lora_A of q_proj as if the base had 32 hidden features."""
    return {
        name: t[:, :32] if name.endswith("q_proj.lora_A.weight") else t
        for name, t in tensors.items()
    }


def _other_module(tensors):
    """Every pair moved to a module the base does not have (mlp.fc1)."""
    return {name.replace("mlp.up_proj", "mlp.fc1"): t for name, t in tensors.items()}


def test_other_base_shapes_refused_by_package(qwen2_lora, tmp_path):
    bad = _copy(qwen2_lora.adapters["r4"], tmp_path / "bad", edit=_narrow_q)
    with pytest.raises(MobiusError) as caught:
        packager.package(qwen2_lora.checkpoint, "cpu", tmp_path / "b", adapters={"x": bad})
    text = _one_line(caught.value)
    assert "q_proj maps 32 → 64 features, the bundle's 64 → 64" in text
    assert not (tmp_path / "b").exists()


def test_targets_the_base_lacks_refused_by_package(qwen2_lora, tmp_path):
    bad = _copy(qwen2_lora.adapters["r4"], tmp_path / "bad", {"target_modules": ["fc1"]})
    bad = _copy(bad, tmp_path / "bad2", edit=_other_module)
    with pytest.raises(MobiusError) as caught:
        packager.package(qwen2_lora.checkpoint, "cpu", tmp_path / "b", adapters={"x": bad})
    assert "LoRA target modules ['fc1'] are not projections" in _one_line(caught.value)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_narrow_q, "q_proj maps 32 → 64 features"),
        (_other_module, "without LoRA inputs in the bundle"),
    ],
)
def test_adapter_command_refuses_what_the_bundle_cannot_take(lora_bundles, tmp_path, edit, said):
    base, bundle = lora_bundles("qwen2")
    bad = _copy(base.adapters["r4"], tmp_path / "bad", edit=edit)
    out = tmp_path / "x.onnx_adapter"
    with pytest.raises(MobiusError) as caught:
        convert_for_bundle(bad, bundle, out)
    assert said in _one_line(caught.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "bad"]  # no file, no partial file


def test_adapter_command_needs_a_bundle_with_lora_inputs(qwen2_lora, tmp_path, capsys):
    plain = packager.package(
        qwen2_lora.checkpoint, "cpu", tmp_path / "plain", quiet=True, smoke_test=False
    )
    out = tmp_path / "x.onnx_adapter"
    argv = ["adapter", str(qwen2_lora.adapters["r4"]), "--bundle", str(plain), "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "its graph takes no LoRA inputs; accepted: a bundle packaged with" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
