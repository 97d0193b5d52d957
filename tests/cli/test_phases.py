"""`package` says what it is doing in every phase: without a terminal, one line per phase with
its time once it ends; on a terminal, a line as each starts; nothing at all with --quiet."""

from __future__ import annotations

import io
import re
import sys

import numpy as np

import mobius_genai
from mobius_genai import progress
from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.progress import Progress
from mobius_genai.quantize.calibrate import Calibration, activation_importance
from mobius_genai.quantize.layout import quantize_matmul_nbits_columns
from mobius_genai.quantize.weight_uses import find_weights
from tests.conftest import TINY_QWEN2

PHASES = (
    "reading the checkpoint",
    "building the graph",
    "optimizing the graph for cpu",
    "saving model.onnx",
    "checksums",
    "validating the bundle",
    "smoke test",
)


def _timed_lines(err: str) -> list[str]:
    """The phases of the lines saying how long a phase took (a counted one says its count too:
    "saving model.onnx: 17 of 17 tensors, 0.1 s")."""
    timed = (
        re.fullmatch(r"mobius-genai: ([^:]+): (.+, )?\d+\.\d s", line) for line in err.splitlines()
    )
    return [match.group(1) for match in timed if match]


def test_every_phase_has_a_line_with_its_time(tmp_path, capsys):
    """int4 weights are quantized as they are written: the saving phase says so, and the phase
    before it says what it does (the calibration run of the default recipe)."""
    args = ["package", str(TINY_QWEN2), "-o", str(tmp_path / "b"), "--ep", "cpu"]
    assert main([*args, "--precision", "int4"]) == 0
    timed = _timed_lines(capsys.readouterr().err)
    int4 = (
        "calibrating int4 (activations of random token ids)",
        "quantizing and saving model.onnx",
    )
    for phase in (*(p for p in PHASES if p != "saving model.onnx"), *int4):
        assert sum(line.startswith(phase) for line in timed) == 1, (phase, timed)
    assert not any(line.startswith("saving") for line in timed), timed
    assert main([*args, "--precision", "int4", "--int4-quality", "builder", "--force"]) == 0
    timed = _timed_lines(capsys.readouterr().err)
    assert "planning int4" in timed and "quantizing and saving model.onnx" in timed, timed


def test_the_bar_moves_while_a_weight_is_quantized(monkeypatch):
    """A weight quantized chunk by chunk as it is saved moves the bar within its tensor (a
    large weight's search used to leave the bar still until the weight was written)."""
    monkeypatch.setattr(sys, "stderr", _Terminal())
    weight = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    seen = []
    with Progress("quantizing and saving model.onnx", total=2) as bar:

        def read(start: int, stop: int, dtype: np.dtype) -> np.ndarray:
            seen.append(bar.position)
            return np.ascontiguousarray(weight[:, start:stop], dtype)

        for search in (True, False):
            quantize_matmul_nbits_columns(
                read, 64, 96, weight.dtype, 32, False, search=search, chunk_elements=64 * 16
            )
            bar.advance()
        assert bar.position == 2
    assert seen == [done + part / 6 for done in (0, 1) for part in range(6)]


def test_quiet_says_nothing(tmp_path, capsys):
    args = ["package", str(TINY_QWEN2), "-o", str(tmp_path / "b"), "--ep", "cpu", "--quiet"]
    assert main(args) == 0
    assert capsys.readouterr().err == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_phase_says_when_it_starts(tmp_path, capsys, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["package", str(TINY_QWEN2), "-o", str(tmp_path / "b"), "--ep", "cpu"]) == 0
    said = terminal.getvalue()
    for phase in PHASES:
        assert f"mobius-genai: {phase}" in said, phase
    assert not _timed_lines(said)
    # the smoke test, the longest phase, says its steps as its process takes them
    for step in ("loading the bundle", "generating", "running the onnxruntime reference loop"):
        assert f"mobius-genai: smoke test: {step}…" in said, step


def test_the_calibration_phase_has_a_bar_that_moves(monkeypatch):
    """The calibration run (an uncounted phase, tens of seconds on a 0.5B model) moves a bar
    on a terminal chunk by chunk of the float graph it runs, up to 100%."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    model = mobius_genai.build(TINY_QWEN2, get_ep("cpu"), "f32", progress=False)["model"]
    groups, _ = find_weights(model.graph)
    inputs = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    with progress.phase("calibrating int4"):
        activation_importance(model, inputs, Calibration(tokens=8), chunk_bytes=1 << 14)
    shown = [int(p) for p in re.findall(r"calibrating int4: +(\d+)%", terminal.getvalue())]
    assert len(set(shown)) > 3 and shown == sorted(shown) and shown[-1] == 100, shown
