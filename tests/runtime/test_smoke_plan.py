"""Which smoke test `package` runs: the whole bundle where memory allows, else a twin with the
first layers of every kind, built the same way; the manifest and the card say which."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mobius_genai import packager
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from mobius_genai.runtime import smoke_plan
from mobius_genai.runtime.smoke_plan import (
    FULL_SHARE,
    TWIN_FOLDER,
    available_memory,
    memory_needed,
    model_bytes,
    plan_smoke_test,
)
from tests._hf import write_tiny_checkpoint
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.conftest import TINY_QWEN2

GIB = 1 << 30
#: Qwen2.5-7B's model files as packaged: float16 for CUDA, int4 for CPU (benchmarks/README.md).
SEVEN_B = {"fp16": 15_237 * 2**20, "int4": 4_557 * 2**20}


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_a_7b_bundle_runs_as_a_twin_on_a_24_gb_machine(precision):
    plan = plan_smoke_test(SEVEN_B[precision], precision, 28, 1, 23 * GIB)
    assert (plan.layers, plan.of, plan.whole) == (1, 28, False)
    assert "would need ~" in plan.reason and "23.0 GiB are available" in plan.reason


def test_a_small_bundle_runs_whole_and_unknown_memory_means_the_twin():
    assert plan_smoke_test(300 << 20, "int4", 24, 1, 23 * GIB).whole
    plan = plan_smoke_test(300 << 20, "int4", 24, 1, None)
    assert (plan.layers, plan.reason) == (1, "the memory available here is unknown")
    assert plan_smoke_test(300 << 20, "int4", 2, 2, None).whole  # no smaller twin exists


def test_the_whole_bundle_runs_exactly_up_to_the_share():
    needed = memory_needed(GIB, "fp32")
    assert plan_smoke_test(GIB, "fp32", 4, 1, int(needed / FULL_SHARE) + 1).whole
    assert not plan_smoke_test(GIB, "fp32", 4, 1, int(needed / FULL_SHARE) - 4).whole


def test_available_memory_from_meminfo_then_sysconf(tmp_path: Path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemAvailable:   20000000 kB\n")
    assert available_memory(meminfo) == 20_000_000 * 1024
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(smoke_plan.os, "sysconf", pages.__getitem__)
    assert available_memory(tmp_path / "missing") == 4_096_000

    def unknown(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(smoke_plan.os, "sysconf", unknown)
    assert available_memory(tmp_path / "missing") is None


def test_model_bytes_are_the_graph_and_its_external_data(packaged):
    folder = packaged("cpu")
    sizes = [(folder / name).stat().st_size for name in ("model.onnx", "model.onnx.data")]
    assert model_bytes(folder) == sum(sizes)


def _gemma3(tmp_path: Path, family: str = "gemma3_text", **overrides) -> Path:
    """Layers sliding, full, sliding: the twin needs two of three to hold both kinds (Gemma
    3n's and Gemma 4's six alternate so: their twin keeps the whole per-layer table and no
    sharing layer; Gemma 4's keeps a cache of each shape)."""
    ckpt = write_tiny_checkpoint(
        tmp_path / family, family, vocab_size=384, bos_token_id=381, eos_token_id=383, **overrides
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(TINY_QWEN2 / name, ckpt / name)
    return ckpt


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Memory for the twin only; records the genai_config and graph of each bundle run."""
    monkeypatch.setattr(smoke_plan, "available_memory", lambda: 400 << 20)
    runs: list[dict] = []
    real = smoke_plan.smoke_test

    def spy(folder, ep, **kwargs):
        graph = GraphInfo.from_file(folder / "model.onnx")
        config = json.loads((folder / "genai_config.json").read_text())
        runs.append({"folder": folder, "config": config, "ops": graph.ops})
        return real(folder, ep, **kwargs)

    monkeypatch.setattr(smoke_plan, "smoke_test", spy)
    return runs


@pytest.mark.parametrize(
    ("model", "ep", "precision", "twin", "of"),
    [
        ("gemma3", "cpu", None, 2, 3),
        ("gemma3n", "cpu", None, 2, 6),
        ("gemma4", "cpu", None, 2, 6),
        ("tiny-qwen2", "cuda", "int4", 1, 2),
        # the twin reads the GGUF file through the same reader (stored integers kept)
        ("gguf", "cpu", "int4", 1, 3),
    ],
)
def test_where_memory_is_short_a_twin_of_the_first_layers_runs_through_the_same_code(
    tmp_path, capsys, little_memory, model, ep, precision, twin, of
):
    ckpt = {
        "gemma3": lambda: _gemma3(tmp_path),
        "gemma3n": lambda: _gemma3(tmp_path, "gemma3n_text"),
        "gemma4": lambda: _gemma3(tmp_path, "gemma4_text", vocab_size_per_layer_input=384),
        "gguf": lambda: write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2"),
    }.get(model, lambda: TINY_QWEN2)()
    out = packager.package(ckpt, ep, tmp_path / "out", precision=precision)
    err = capsys.readouterr().err
    assert f"smoke test on a twin bundle of the first {twin} of {of} layers: the whole" in err
    assert f"(twin of the first {twin} of {of} layers)" in err
    [run] = little_memory
    assert run["folder"].name == TWIN_FOLDER
    whole = json.loads((out / "genai_config.json").read_text())
    assert run["config"]["model"]["decoder"].pop("num_hidden_layers") == twin
    assert whole["model"]["decoder"].pop("num_hidden_layers") == of
    assert run["config"] == whole  # same EP options, dtype, contract, search, tokens
    assert run["ops"] == GraphInfo.from_file(out / "model.onnx").ops  # same pipeline
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert (record["ran"], record["layers"], record["of"]) == (True, twin, of)
    assert record["reason"].startswith("the whole bundle would need ~")
    card = (out / "README.md").read_text()
    assert f"| Smoke test | passed on a twin of the bundle with its first {twin} of {of} " in card
    assert TWIN_FOLDER not in {p.name for p in out.iterdir()}
    assert main(["validate", str(out)]) == 0  # the card's new hash is in the manifest


def test_the_whole_bundle_is_recorded_too(tmp_path: Path):
    out = packager.package(TINY_QWEN2, "cpu", tmp_path / "out", quiet=True)
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert (record["ran"], record["layers"], record["of"]) == (True, 2, 2)
    assert record["note"].endswith("same as a plain onnxruntime loop")
    assert (
        "| Smoke test | passed: onnxruntime-genai generated from the whole bundle |"
        in (out / "README.md").read_text()
    )


def test_no_smoke_test_is_said_on_the_card(packaged):
    out = packaged("cpu")
    assert "smoke_test" not in json.loads((out / "mobius_manifest.json").read_text())["build"]
    assert "| Smoke test | not run |" in (out / "README.md").read_text()


def test_a_failing_twin_is_an_error_that_says_so_and_leaves_nothing(
    tmp_path, little_memory, monkeypatch
):
    def broken(folder, ep, **kwargs):
        raise BundleError(f"{folder}: onnxruntime-genai cannot load the bundle: boom")

    monkeypatch.setattr(smoke_plan, "smoke_test", broken)
    with pytest.raises(BundleError, match="^smoke test of the twin bundle of the first 1 of 2"):
        packager.package(TINY_QWEN2, "cpu", tmp_path / "out", quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_when_even_the_twin_does_not_fit_the_test_is_skipped_with_a_note(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(smoke_plan, "available_memory", lambda: 1 << 20)
    out = packager.package(TINY_QWEN2, "cpu", tmp_path / "out")
    assert "smoke test skipped: even the twin of the first 1 of 2 layers would need ~" in (
        capsys.readouterr().err
    )
    record = json.loads((out / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert record["ran"] is False
    assert "| Smoke test | smoke test skipped: even the twin" in (out / "README.md").read_text()
