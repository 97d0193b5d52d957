"""benchmarks/gpu_check.py, the GPU check (issue 37), proved on CPU: its dry run packages lines'
cuda bundles, compares them with transformers and the cpu bundle, times them against the
builder and writes the table; its pieces (token comparison, install line, time budget,
table) each on their own."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_check  # noqa: E402
from _gpu_install import install_commands  # noqa: E402
from _gpu_lines import GQA, GQA_BIAS, LINES, TOLERANCE  # noqa: E402
from _gpu_run import (  # noqa: E402
    Run,
    captures,
    compare_tokens,
    cuda_caps,
    device_turn,
    relative_error,
)
from _gpu_table import markdown, verdict  # noqa: E402

from mobius_genai.ep import get_ep  # noqa: E402


def _dry_run(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    command = [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out)]
    command += ["--work", str(tmp_path / "work"), *options]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    document = json.loads((out / "gpu_check.json").read_text())
    return done, document


def test_dry_run_packages_compares_times_and_tabulates(tmp_path):
    """A text line, both vision fixtures and Whisper, every CPU step: cuda graphs hold what the
    lines check, logits (features) within the tolerance of transformers', the same greedy
    tokens as the cpu bundle, a decode ratio against the builder's cuda bundle, and the
    table."""
    lines = "dense-fp16,vision-fp16,gemma3-vision-fp16,whisper-fp16"
    done, document = _dry_run(tmp_path, "--lines", lines)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("install: ")  # the install line comes first
    dense, vision, gemma3, whisper = document["lines"]
    assert {line["status"] for line in document["lines"]} == {"pass"}
    steps = dense["steps"]
    assert steps["graph"]["ok"] and steps["tokens-off"]["ok"]
    assert 0 < steps["logits-off"]["value"] <= TOLERANCE["fp16"]
    assert steps["logits-on"]["ok"] is None  # no graph capture on CPU
    assert steps["decode"]["ok"] and steps["decode"]["value"] > 0
    assert vision["steps"]["graph"]["note"].endswith("PackedMultiHeadAttention")
    assert 0 < vision["steps"]["features"]["value"] <= TOLERANCE["fp16"]
    assert vision["steps"]["tokens-off"]["ok"]
    # Gemma 3: the decoder's GQA takes the image-block bias; SigLIP's features and tokens
    assert gemma3["steps"]["graph"]["note"] == f"holds {GQA_BIAS}"
    assert 0 < gemma3["steps"]["features"]["value"] <= TOLERANCE["fp16"]
    assert gemma3["steps"]["tokens-off"]["ok"]
    # Whisper: og's logits from its own audio processor's features against transformers'
    assert whisper["steps"]["graph"]["ok"]
    assert 0 < whisper["steps"]["logits-off"]["value"] <= TOLERANCE["fp16"]
    assert whisper["steps"]["tokens-off"]["ok"]
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| dense-fp16 |" in table and "| vision-fp16 |" in table


@pytest.mark.slow
def test_dry_run_of_the_newer_kinds_side_by_side(tmp_path):
    """Llama 4's chunked and NoPE layers, Gemma 3n's shared caches, and the Qwen3-VL, Mistral 3
    and LFM2-VL towers, two lines at a time: every CPU step passes; Llama 4's chunk bias keeps
    graph capture off on a GPU, as Gemma 3's image blocks do."""
    names = ["llama4-fp16", "gemma3n-fp16", "qwen3-vl-fp16", "mistral3-fp16", "lfm2-vl-fp16"]
    done, document = _dry_run(tmp_path, "--lines", ",".join(names), "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    results = {result["line"]: result for result in document["lines"]}
    assert list(results) == names and {r["status"] for r in results.values()} == {"pass"}
    llama4, gemma3n = results["llama4-fp16"]["steps"], results["gemma3n-fp16"]["steps"]
    assert llama4["graph"]["note"] == f"holds {GQA_BIAS}, {GQA}"
    assert gemma3n["graph"]["windows"] == [5]
    for steps in (llama4, gemma3n):
        assert 0 < steps["logits-off"]["value"] <= TOLERANCE["fp16"] and steps["tokens-off"]["ok"]
    for name in names[2:]:
        steps = results[name]["steps"]
        assert 0 < steps["features"]["value"] <= TOLERANCE["fp16"] and steps["tokens-off"]["ok"]
    assert LINES["llama4-fp16"].no_capture == LINES["gemma3-vision-fp16"].no_capture


#: What the full dry run finds on onnxruntime 1.32's CPU provider (benchmarks/README.md, "The
#: dry run"): gpt-oss's fp16 graph with GQA's head_sink and the MoE node kept is 9.9e-2 off.
CPU_FINDINGS = {("gpt-oss-fp16", "logits-off")}


@pytest.mark.slow
def test_full_dry_run_runs_every_step_of_every_line(tmp_path):
    """Every line, every step a CPU runs, none raising; the comparisons pass but for the
    finding above."""
    done, document = _dry_run(tmp_path, "--budget-s", "3000", "--line-s", "300")
    results = document["lines"]
    assert [result["line"] for result in results] == list(LINES)
    raised = {
        (result["line"], name): step["note"]
        for result in results
        for name, step in result.get("steps", {"-": {"trace": 1, "note": result}}).items()
        if "trace" in step
    }
    assert not raised
    failed = {
        (result["line"], name)
        for result in results
        for name, step in result["steps"].items()
        if step["ok"] is False
    }
    assert failed == CPU_FINDINGS, done.stdout


def _gqa_graph(folder: Path, causal: int, bias: str) -> Path:
    import onnx
    from onnx import helper

    inputs = ["q", "", "", "", "", "seqlens_k", "total", "", "", "", bias]
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["y"], domain="com.microsoft", causal=causal
    )
    graph = helper.make_graph([node], "g", [], [])
    folder.mkdir()
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    return folder


@pytest.mark.parametrize(("causal", "bias", "found"), [(0, "bias", True), (1, "bias", False)])
def test_the_image_bias_counts_only_on_gqa_with_causal_0_and_a_bias(tmp_path, causal, bias, found):
    from _gpu_run import _graph_ops

    ops = _graph_ops(_gqa_graph(tmp_path / "bundle", causal, bias))
    assert GQA in ops and (GQA_BIAS in ops) is found
    assert GQA_BIAS not in _graph_ops(_gqa_graph(tmp_path / "no-bias", 0, ""))


def test_graph_capture_is_not_applicable_where_the_line_says_why(tmp_path):
    """Gemma 3's image-block bias reads og's attention_mask, which graph capture makes static."""
    (tmp_path / "genai_config.json").write_text(
        json.dumps({"search": {"past_present_share_buffer": True}})
    )
    gemma3, dense = LINES["gemma3-vision-fp16"], LINES["dense-fp16"]
    assert gemma3.no_capture
    assert captures(Run(gemma3, tmp_path, False, 4), tmp_path) == {
        "off": None,
        "on": gemma3.no_capture,
    }
    assert captures(Run(dense, tmp_path, False, 4), tmp_path) == {"off": None, "on": None}


def test_a_line_past_its_time_is_killed_and_the_budget_skips_the_rest(tmp_path):
    done, document = _dry_run(
        tmp_path, "--lines", "dense-fp16,moe-fp16", "--line-s", "1", "--budget-s", "15.5"
    )
    assert done.returncode == 1
    first, second = document["lines"]
    assert (first["status"], first["error"]) == ("error", "no result within 1 s")
    assert second["status"] == "skipped"


def test_jobs_start_lines_side_by_side_within_the_budget(tmp_path):
    """Two lines start at once (one after the other, the second would no longer fit), each is
    killed past its time, and the third no longer fits."""
    lines = "dense-fp16,moe-fp16,int4"
    options = ("--lines", lines, "--jobs", "2", "--line-s", "1", "--budget-s", "15.5")
    done, document = _dry_run(tmp_path, *options)
    assert done.returncode == 1
    assert [(r["line"], r["status"]) for r in document["lines"]] == [
        ("dense-fp16", "error"),
        ("moe-fp16", "error"),
        ("int4", "skipped"),
    ]
    assert {r.get("error") for r in document["lines"][:2]} == {"no result within 1 s"}


def test_device_steps_take_turns(tmp_path):
    """A line's device steps wait while another line's run (the lock is the device's)."""
    first, second = (Run(LINES["dense-fp16"], tmp_path / name, True, 4) for name in "ab")
    entered = threading.Event()

    def hold() -> None:
        with device_turn(first):
            entered.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait()
    with device_turn(second):
        pass
    holder.join()
    assert (first.waited_s, second.waited_s >= 0.3) == (0.0, True)


def test_unknown_line_is_one_clear_line(capsys):
    assert gpu_check.main(["--dry-run", "--lines", "dense-fp16,nope"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "unknown line nope; accepted: dense-fp16," in error


def test_jobs_below_one_is_one_clear_line(capsys):
    assert gpu_check.main(["--dry-run", "--jobs", "0"]) == 2
    error = capsys.readouterr().err
    assert error == "gpu_check: --jobs is 0; accepted: 1 or more\n"


def test_tokens_pass_when_equal_or_parting_at_a_near_tie_only():
    expected = {"tokens": [5, 6, 7], "margins": [3.0, 0.05, 2.0], "scale": 10.0}
    assert compare_tokens([5, 6, 7], expected, 0.02) == (True, "3/3 equal")
    assert compare_tokens([5, 9, 1], expected, 0.02)[0]  # margin 0.05 <= 0.02 * 10
    assert not compare_tokens([5, 6, 1], expected, 0.02)[0]  # margin 2.0
    assert not compare_tokens([5, 6], expected, 0.02)[0]  # stopped early


def test_relative_error_is_over_the_largest_reference_value_and_nan_fails():
    reference = np.array([[1.0, -4.0]])
    assert relative_error(np.array([[1.2, -4.0]]), reference) == pytest.approx(0.05)
    assert relative_error(np.array([[np.nan, -4.0]]), reference) == float("inf")


def test_lines_flip_only_their_flags_and_leave_cuda_registered_as_it_is():
    caps = cuda_caps(LINES["qmoe-int4"])
    assert caps.supports_fused_moe and caps.supports_qmoe
    cuda = get_ep("cuda")
    assert not (cuda.supports_fused_moe or cuda.supports_qmoe)  # flip these once a run passes
    assert cuda_caps(LINES["dense-fp16"]) == cuda


def test_install_line_pins_the_versions_ci_tests_and_replaces_the_cpu_wheels():
    uninstall, install = install_commands(None, dry_run=True)
    assert uninstall[-2:] == ["onnxruntime", "onnxruntime-genai"]
    genai = metadata.version("onnxruntime-genai")
    assert f"onnxruntime-genai-cuda=={genai}" in install
    assert not [word for word in install if word.startswith(("onnxruntime>", "onnxruntime-genai>"))]
    assert "onnx-ir>=1.1.0,<1.2" in install and "transformers>=4.57" in install


def test_wheel_pieces_are_joined_in_order(tmp_path):
    first, second = tmp_path / "1", tmp_path / "2"
    first.mkdir(), second.mkdir()
    (first / "a-1.whl").write_bytes(b"A")
    (first / "b-1.whl.part-aa").write_bytes(b"head")
    (second / "b-1.whl.part-ab").write_bytes(b"tail")
    install = install_commands([str(first), str(second)], dry_run=False)[1]
    assert install[-2:] == [str(first / "a-1.whl"), str(first / "b-1.whl")]
    assert "--no-index" in install and (first / "b-1.whl").read_bytes() == b"headtail"


def test_table_marks_failures_and_lists_the_flags_passing_lines_back():
    steps = {"graph": {"ok": True, "note": "holds MoE"}, "logits-off": {"ok": True, "note": "1e-3"}}
    passing = {"line": "moe-fp16", "flags": {"supports_fused_moe": True}, "steps": steps}
    failing = {"line": "int4", "flags": {}, "steps": {"tokens-off": {"ok": False, "note": "x"}}}
    for result in (passing, failing):
        result["status"] = verdict(result)
    assert (passing["status"], failing["status"]) == ("pass", "fail")
    table = markdown({"gpu": "H100", "versions": {}}, [passing, failing])
    assert "| FAIL: x |" in table
    assert "- moe-fp16: cuda `supports_fused_moe=True`" in table
    assert "supports_fused_moe" not in markdown({"dry_run": True}, [passing])


def test_a_machine_not_ready_for_the_gpu_run_is_told_in_one_line(tmp_path, monkeypatch, capsys):
    """Without a GPU (or with an import failing there) the run stops before any line, and the
    environment it found still comes back in gpu_check.json."""
    found = {"cuda": True, "error": "ModuleNotFoundError: No module named 'onnxruntime_genai'"}
    monkeypatch.setattr(gpu_check, "_environment", lambda dry_run: found)
    assert gpu_check.main(["--lines", "dense-fp16", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not ready for the GPU run: ModuleNotFoundError" in error
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == {
        "environment": found,
        "lines": [],
    }


def test_downloaded_wheels_are_cut_into_folders_one_call_carries(tmp_path, monkeypatch):
    """A wheel bigger than a call carries goes in pieces; every folder stays within the limit,
    and the pieces join back into the same bytes."""
    import _gpu_install

    sizes = {"big-1.whl": 2500, "small-1.whl": 300, "other-1.whl": 700}

    def fake_pip(command, check):  # what `pip download -d FOLDER` leaves there
        folder = Path(command[command.index("-d") + 1])
        folder.mkdir(parents=True)
        for name, size in sizes.items():
            (folder / name).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(_gpu_install, "CARRY_BYTES", 1000)
    monkeypatch.setattr(_gpu_install.subprocess, "run", fake_pip)
    originals = {
        name: bytes(range(256)) * (n // 256) + b"x" * (n % 256) for name, n in sizes.items()
    }
    folders = _gpu_install.download_wheels(tmp_path / ".whl")
    assert [folder.name for folder in folders] == [f".whl-{i}" for i in range(1, 5)]  # 3500 B
    assert all(sum(f.stat().st_size for f in folder.iterdir()) <= 1000 for folder in folders)
    wheels = _gpu_install.join_parts(folders)
    assert {wheel.name: wheel.read_bytes() for wheel in wheels} == originals
