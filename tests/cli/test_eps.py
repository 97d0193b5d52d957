"""`mobius-genai eps`: the registry as a table on stdout."""

from __future__ import annotations

import re
from pathlib import Path

from mobius_genai.cli import main
from mobius_genai.cli._eps import format_ep_table
from mobius_genai.ep import BUILTIN_EPS


def test_eps_prints_the_registry_table(capsys):
    assert main(["eps"]) == 0
    captured = capsys.readouterr()
    assert captured.out == format_ep_table() + "\n"
    assert captured.err == ""
    rows = {line.split()[0] for line in captured.out.splitlines()[2:] if line.strip()}
    assert {caps.name for caps in BUILTIN_EPS} <= rows


def test_eps_fits_100_columns_and_wide_shows_every_column(capsys):
    assert main(["eps"]) == 0
    narrow = capsys.readouterr().out
    assert max(map(len, narrow.splitlines())) <= 100
    assert "int4" in narrow.splitlines()[0] and "skip-norm" not in narrow.splitlines()[0]
    assert "`mobius-genai eps --wide` adds: fused rope, skip-norm" in narrow
    assert main(["eps", "--wide"]) == 0
    assert capsys.readouterr().out == format_ep_table(wide=True) + "\n"


def test_eps_rows_show_the_capabilities_that_steer_the_pipeline(capsys):
    main(["eps", "--wide"])
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split("  ")
    assert "GQA dtypes" in lines[0] and "skip-norm" in lines[0]
    (trt,) = [line for line in lines if line.startswith("trt-rtx ")]
    (standard,) = [line for line in lines if line.startswith("onnx-standard ")]
    assert "fp16, bf16" in trt and " on" in trt  # GQA dtypes, graph capture on
    assert re.split(r"\s{2,}", standard)[2] == "-"  # no GQA dtypes
    assert header[0].strip() == "name"


def test_the_readme_shows_the_table_the_command_prints():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "```\n" + format_ep_table(wide=True) + "\n```" in readme


def test_eps_families_lists_every_model_type_with_its_og_type_and_blocks(capsys):
    """Every row of the decoder family table, the hybrid and MoE ones saying which blocks
    they build (read from the rows' data)."""
    from mobius_genai.models import FAMILIES

    assert main(["eps", "--families"]) == 0
    rows = {
        cells[0]: cells[1:]
        for cells in (re.split(r"\s{2,}", line) for line in capsys.readouterr().out.splitlines())
    }
    assert set(FAMILIES) <= set(rows)
    assert rows["granitemoehybrid"] == ["decoder", "mamba2, MoE"]
    assert rows["deepseek_v2"] == rows["deepseek_v3"] == ["decoder", "latent attention, MoE"]
    assert rows["deepseek_v32"] == ["decoder", "latent attention with a top-k indexer, MoE"]
    assert rows["nemotron_h"] == ["decoder", "mamba2, one block per layer, MoE"]
    assert rows["falcon_h1"] == ["decoder", "mamba2 beside attention"]
    assert rows["mamba"] == rows["falcon_mamba"] == ["decoder", "mamba, one block per layer"]
    assert rows["jamba"] == ["decoder", "mamba, MoE"]
    assert rows["bloom"] == rows["mpt"] == ["decoder", "ALiBi"]
    assert rows["diffllama"] == ["decoder", "differential attention"]
    assert rows["jetmoe"] == ["decoder", "mixture of attention heads, MoE"]
    assert rows["doge"] == ["decoder", "dynamic mask attention"]
    assert rows["llama"] == ["llama", "-"]
    assert rows["bitnet"] == ["decoder", "BitLinear (sub-norms, int8 activations)"]
