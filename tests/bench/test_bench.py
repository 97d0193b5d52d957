"""`mobius-genai bench`: one row per (prompt length, batch size), as a table or JSON; bad
values are one-line errors. Timings are never asserted, only that they are real figures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mobius_genai.bench.speed import load, time_generation
from mobius_genai.cli import main

FAST = ("--new-tokens", "4", "--rounds", "1")


def test_json_has_a_row_per_configuration(packaged, capsys):
    argv = ["bench", str(packaged("cpu")), "--prompt-lengths", "24,8", "--batch-sizes", "1,3"]
    assert main([*argv, *FAST, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] == 4 and report["rounds"] == 1
    rows = report["rows"]
    assert [(row["prompt_length"], row["batch_size"]) for row in rows] == [
        (24, 1),
        (24, 3),
        (8, 1),
        (8, 3),
    ]
    for row in rows:
        for key in ("ttft_ms", "prefill_tps", "decode_tps", "peak_rss_mib", "load_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)


def test_table_prints_a_line_per_configuration(packaged, capsys):
    assert main(["bench", str(packaged("cpu")), "--prompt-lengths", "8,16", *FAST]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "prompt",
        "batch",
        "TTFT",
        "ms",
        "prefill",
        "tok/s",
        "decode",
        "tok/s",
        "peak",
        "RSS",
        "MiB",
    ]
    assert [line.split()[:2] for line in lines[2:4]] == [["8", "1"], ["16", "1"]]
    assert "medians of 1 runs" in lines[-2] and lines[-1].startswith("Peak RSS")


def test_ep_cpu_runs_a_gpu_bundle_here(packaged, capsys):
    folder = packaged("cuda")
    assert main(["bench", str(folder), "--prompt-lengths", "8", *FAST, "--json"]) == 1
    assert f"`mobius-genai bench {folder} --ep cpu`" in capsys.readouterr().err
    assert (
        main(["bench", str(folder), "--prompt-lengths", "8", *FAST, "--json", "--ep", "cpu"]) == 0
    )
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["decode_tps"] > 0


def test_a_batch_generation_gives_positive_figures(packaged):
    model = load(packaged("cpu"), cpu=True, threads=1)
    prompt = np.arange(2 * 10, dtype=np.int32).reshape(2, 10)
    figures = time_generation(model, prompt, 5)
    assert set(figures) == {"prefill", "decode", "prefill_cpu", "decode_cpu", "ttft_s"}
    assert all(math.isfinite(value) and value > 0 for value in figures.values())
    with pytest.raises(ValueError):  # 1 new token: no decode step to time
        time_generation(model, prompt, 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--prompt-lengths", "16,0"], "--prompt-lengths 16,0: '0' is not a positive integer"),
        (["--prompt-lengths", "a"], "--prompt-lengths a: 'a' is not a positive integer"),
        (["--batch-sizes", "-1"], "--batch-sizes -1: '-1' is not a positive integer"),
        (["--prompt-lengths", "100"], "prompt length 100: with 32 new tokens it needs 132"),
        (["--new-tokens", "1"], "new tokens 1: too few; accepted: 2 or more"),
        (["--ep", "cuda"], "--ep cuda: not accepted here; accepted: cpu"),
    ],
)
def test_bad_values_are_one_line_errors(packaged, capsys, options, message):
    assert main(["bench", str(packaged("cpu")), *options]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("mobius-genai: error: ") and message in line


def test_bench_on_a_missing_bundle_fails(tmp_path, capsys):
    assert main(["bench", str(tmp_path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "genai_config.json is missing" in line
