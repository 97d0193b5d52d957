"""The smoke test's own process: a crash, a signal or logits that are not finite are clear errors
and leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError
from mobius_genai.runtime._smoke_child import ort_greedy_tokens
from mobius_genai.runtime.generate import require_finite
from mobius_genai.runtime.smoke import smoke_test
from tests.conftest import TINY_QWEN2

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from mobius_genai.cli import main; sys.exit(main())",
        *args,
    ]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def test_a_crash_in_onnxruntime_genai_is_one_error_and_leaves_nothing(tmp_path: Path):
    out = tmp_path / "work" / "out"
    process = subprocess.Popen(
        _cli("package", str(TINY_QWEN2), "--ep", "cpu", "-o", str(out), "--quiet"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    child = _smoke_process_of(process.pid, time.monotonic() + 120)
    os.kill(child, signal.SIGSTOP)  # held, so that it crashes wherever it is (not done first)
    os.kill(child, signal.SIGSEGV)
    os.kill(child, signal.SIGCONT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert stderr.startswith("mobius-genai: error: ")
    assert stderr.count("\n") == 1
    assert "the smoke test crashed onnxruntime-genai (signal 11, SIGSEGV)" in stderr
    assert not (tmp_path / "work").exists() or list((tmp_path / "work").iterdir()) == []


def _poison(folder: Path, initializer: str) -> None:
    """Set every value of the (inline) float initializer `initializer` to NaN."""
    path = folder / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.name == initializer)
    tensor.ClearField("float_data")
    tensor.raw_data = np.full(tuple(tensor.dims), np.nan, np.float32).tobytes()
    onnx.save(model, str(path))


def test_logits_that_are_not_finite_are_an_error_naming_the_step(bundle_copy):
    folder = bundle_copy("cpu")
    _poison(folder, "model.norm.weight")
    with pytest.raises(
        BundleError,
        match=r"^onnxruntime-genai computed logits that are not finite for the prompt \(step 0\): "
        r"NaN in 384 of 384",
    ):
        smoke_test(folder, get_ep("cpu"))
    with pytest.raises(
        BundleError, match=r"^a plain onnxruntime loop computed logits that are not"
    ):
        ort_greedy_tokens(
            folder / "model.onnx", [1, 2, 3], 4, provider=get_ep("cpu").runtime.ort_provider
        )


def test_a_later_step_is_named():
    require_finite(np.zeros(4, np.float16), 2, "x")
    with pytest.raises(BundleError, match=r"for generated token 2 \(step 2\): infinity in 1 of 4"):
        require_finite(np.array([0, 1, np.inf, 2], np.float16), 2, "x")


def _smoke_process_of(parent: int, deadline: float) -> int:
    """The pid of the smoke test process `parent` starts, waiting for it until `deadline`."""
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            if ppid == parent and b"mobius_genai.runtime._smoke_child" in command:
                return int(entry.name)
        time.sleep(0.01)
    pytest.fail("package never started its smoke test process")


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds processes in /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_smoke_test_ends_its_process_and_cleans_up(tmp_path: Path, signum: int):
    out = tmp_path / "work" / "out"
    process = subprocess.Popen(
        _cli("package", str(TINY_QWEN2), "--ep", "cpu", "-o", str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child = _smoke_process_of(process.pid, time.monotonic() + 120)
    os.kill(child, signal.SIGSTOP)  # still running when `package` gets the signal
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    assert process.returncode == 128 + signum, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith(f"mobius-genai: {word}; ") and last.endswith("nothing was written")
    assert "Traceback" not in stderr
    assert not Path(f"/proc/{child}").exists()  # killed and reaped, not orphaned
    assert not (tmp_path / "work").exists() or list((tmp_path / "work").iterdir()) == []


def test_the_smoke_process_imports_no_graph_building_stack():
    """The smoke test's process holds a model of up to a quarter of the memory available; the
    graph-building stack (onnx, onnx-ir, onnxscript: ~85 MiB resident) has no job there."""
    code = (
        "import sys, mobius_genai.runtime._smoke_child; "
        "print(sorted(m for m in ('onnx', 'onnx_ir', 'onnxscript', 'jsonschema') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]", result.stdout
