"""`mobius-genai build MODEL -o OUT`: writes model.onnx + data, or fails cleanly leaving no OUT."""

from __future__ import annotations

import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mobius_genai import ModelPackage
from mobius_genai.cli import main
from tests.conftest import TINY_QWEN2


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_build_writes_the_graph_and_its_weights(tmp_path, capsys):
    out = tmp_path / "graph"
    assert main(["build", str(TINY_QWEN2), "-o", str(out), "--ep", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert "[EP Trace]" not in captured.err
    assert _leftovers(out) == ["model.onnx", "model.onnx.data"]
    assert _leftovers(tmp_path) == ["graph"]  # no staging folder left beside it
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([[1, 2, 3]]), "attention_mask": np.ones((1, 3), np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((1, 2, 0, 16), np.float32)
    (logits,) = session.run(["logits"], feeds)
    assert logits.shape == (1, 3, 384) and np.isfinite(logits).all()


def test_options_reach_the_build(tmp_path):
    out = tmp_path / "g"
    args = ["build", str(TINY_QWEN2), "-o", str(out), "--ep", "cuda", "--dtype", "f32"]
    assert main([*args, "--no-weights", "--context-length", "24"]) == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    # --no-weights: the graph is written without checkpoint tensors (only the rotary tables).
    assert {t.name for t in model.graph.initializer} == {
        "model.rotary_emb.cos_cache",
        "model.rotary_emb.sin_cache",
    }
    (cos,) = [t for t in model.graph.initializer if t.name.endswith("cos_cache")]
    assert cos.dims[0] == 24


def test_trace_goes_to_stderr(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["build", str(TINY_QWEN2), "-o", str(out), "--trace", "--no-weights"]) == 0
    err = capsys.readouterr().err
    assert (
        "INFO mobius_genai.optimize: [EP Trace] Target: default, dtype: FLOAT, role: decoder" in err
    )
    assert "[EP Trace] Summary:" in err
    assert "[EP Trace]   SkipNorm                  |       4 |" in err  # 2 layers


def _without_phases(err: str) -> str:
    """stderr less the lines of the phases that ended before the failure (`progress.phase`)."""
    return "".join(
        line
        for line in err.splitlines(keepends=True)
        if not re.fullmatch(r"mobius-genai: [^:]+: (.+, )?\d+\.\d s\n", line)
    )


def _fails(tmp_path, capsys, args: list[str], message: str) -> str:
    assert main(["build", *args]) == 1
    err = _without_phases(capsys.readouterr().err)
    assert err.count("\n") == 1 and err.startswith("mobius-genai: error: ")
    assert message in err
    return err


def test_unknown_ep_fails_with_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "g"
    _fails(
        tmp_path,
        capsys,
        [str(TINY_QWEN2), "-o", str(out), "--ep", "rocm"],
        "Unknown execution provider 'rocm'. Supported: [",
    )
    assert _leftovers(tmp_path) == []


def test_missing_checkpoint_fails_and_writes_nothing(tmp_path, capsys):
    _fails(tmp_path, capsys, [str(tmp_path / "nowhere"), "-o", str(tmp_path / "g")], "nowhere")
    assert _leftovers(tmp_path) == []


def test_a_failure_while_saving_leaves_no_output(tmp_path, capsys, monkeypatch):
    def broken_save(self, directory, progress=True):
        (Path(directory) / "model.onnx").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ModelPackage, "save", broken_save)
    out = tmp_path / "g"
    _fails(tmp_path, capsys, [str(TINY_QWEN2), "-o", str(out)], "No space left on device")
    assert _leftovers(tmp_path) == []


def test_an_unexpected_error_is_one_line_too(tmp_path, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    # mobius_genai.build is the function at package level; patch the module's name.
    monkeypatch.setattr(sys.modules["mobius_genai.build"], "optimize_model", boom)
    out = tmp_path / "g"
    _fails(tmp_path, capsys, [str(TINY_QWEN2), "-o", str(out)], "RuntimeError: boom")
    assert _leftovers(tmp_path) == []
    with pytest.raises(Exception, match="boom"):  # --debug shows the real error
        main(["build", str(TINY_QWEN2), "-o", str(out), "--debug"])


def test_an_existing_output_is_kept_unless_forced(tmp_path, capsys):
    out = tmp_path / "g"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    _fails(tmp_path, capsys, [str(TINY_QWEN2), "-o", str(out), "--no-weights"], "not empty")
    assert _leftovers(out) == ["mine.txt"]
    assert main(["build", str(TINY_QWEN2), "-o", str(out), "--no-weights", "--force"]) == 0
    assert _leftovers(out) == ["model.onnx", "model.onnx.data"]


@pytest.mark.parametrize("command", ["build", "package"])
@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_context_length_must_be_a_positive_integer(tmp_path, capsys, value, command):
    with pytest.raises(SystemExit) as caught:
        main([command, str(TINY_QWEN2), "-o", str(tmp_path / "g"), "--context-length", value])
    assert caught.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("target", ["checkpoint", "its parent", "cwd"])
def test_build_force_never_replaces_the_checkpoint_or_the_current_folder(
    tmp_path, monkeypatch, capsys, target
):
    checkpoint = tmp_path / "models" / "ckpt"
    shutil.copytree(TINY_QWEN2, checkpoint)
    before = _leftovers(checkpoint)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    out = {"checkpoint": checkpoint, "its parent": tmp_path / "models", "cwd": Path(".")}[target]
    assert main(["build", str(checkpoint), "-o", str(out), "--force"]) == 1
    assert "would replace" in capsys.readouterr().err
    assert _leftovers(checkpoint) == before


def test_sigterm_unwinds_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    def terminated_while_saving(self, directory, progress=True):
        (Path(directory) / "model.onnx").write_text("half")
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(ModelPackage, "save", terminated_while_saving)
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["build", str(TINY_QWEN2), "-o", str(tmp_path / "graph")]) == 128 + signal.SIGTERM
    err = _without_phases(capsys.readouterr().err)
    assert err.startswith("mobius-genai: terminated; ") and err.endswith("nothing was written\n")
    assert err.count("\n") == 1
    assert _leftovers(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is previous  # main restores the handler


def test_without_output_build_picks_a_name_like_package(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["build", str(TINY_QWEN2), "--ep", "cpu", "--no-weights"]) == 0
    out = tmp_path / "tiny-qwen2-cpu-fp32-graph"  # package's name, marked as a bare graph
    assert capsys.readouterr().out.strip() == str(out)
    assert _leftovers(out) == ["model.onnx", "model.onnx.data"]


def test_the_help_says_why_build_keeps_every_positions_logits(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "logits for every position" in help_text and "package" in help_text


def test_build_and_package_keep_every_positions_logits(tmp_path, capsys):
    """`package --prune-lm-head` alone keeps the last position's only."""
    graph, bundle, pruned = tmp_path / "graph", tmp_path / "bundle", tmp_path / "pruned"
    assert main(["build", str(TINY_QWEN2), "-o", str(graph), "--no-weights"]) == 0
    args = ["package", str(TINY_QWEN2), "--quiet", "--no-smoke-test"]
    assert main([*args, "-o", str(bundle)]) == 0
    assert main([*args, "-o", str(pruned), "--prune-lm-head"]) == 0
    for folder, positions in ((graph, "sequence_length"), (bundle, "sequence_length"), (pruned, 1)):
        model = onnx.load(folder / "model.onnx", load_external_data=False)
        (logits,) = [value for value in model.graph.output if value.name == "logits"]
        dim = logits.type.tensor_type.shape.dim[1]
        assert (dim.dim_param or dim.dim_value) == positions
