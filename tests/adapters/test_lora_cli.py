"""The command line: package --adapter, adapter (a further adapter for the bundle), run and
bench --adapter."""

from __future__ import annotations

import onnxruntime_genai as og
import pytest

from mobius_genai.bench.runner import bench
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from tests.adapters.conftest import NEW_TOKENS, PROMPT, peft_greedy


@pytest.fixture(scope="module")
def cli_bundle(qwen2_lora, tmp_path_factory):
    """The qwen2 base packaged by the CLI with adapter r4 only."""
    out = tmp_path_factory.mktemp("lora-cli") / "bundle"
    argv = ["package", str(qwen2_lora.checkpoint), "--ep", "cpu", "-o", str(out)]
    argv += ["--adapter", f"r4={qwen2_lora.adapters['r4']}", "--no-smoke-test", "--quiet"]
    assert main(argv) == 0
    return out


def test_adapter_command_converts_a_further_adapter(qwen2_lora, cli_bundle, tmp_path, capsys):
    assert sorted(p.name for p in (cli_bundle / "adapters").iterdir()) == ["r4.onnx_adapter"]
    out = tmp_path / "r8.onnx_adapter"
    argv = ["adapter", str(qwen2_lora.adapters["r8"]), "--bundle", str(cli_bundle), "-o", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out)
    model = og.Model(str(cli_bundle))
    adapters = og.Adapters(model)
    adapters.load(str(out), "r8")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.set_active_adapter(adapters, "r8")
    generator.append_tokens(PROMPT)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)[len(PROMPT) :]]
    assert tokens == peft_greedy(qwen2_lora.checkpoint, qwen2_lora.adapters["r8"], PROMPT, 12)
    assert main(argv) == 1  # the file exists now
    assert "exists; accepted: a new file, or --force" in capsys.readouterr().err


def test_run_with_an_adapter(cli_bundle, capsys):
    argv = ["run", str(cli_bundle), "--prompt", "Hi", "--raw", "--temperature", "0", "--quiet"]
    argv += ["--max-new-tokens", "8"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--adapter", "r4"]) == 0
    adapted = capsys.readouterr().out
    assert adapted != plain  # r4 changes the greedy tokens (test_lora_bundle checks which)
    assert main([*argv, "--adapter", "r4"]) == 0
    assert capsys.readouterr().out == adapted
    assert main([*argv, "--adapter", "nope"]) == 1
    err = capsys.readouterr().err
    assert "no adapter 'nope'; accepted: ['r4']" in err and len(err.strip().splitlines()) == 1


def test_bench_with_an_adapter(cli_bundle):
    rows = bench(
        cli_bundle, prompt_lengths=[4], batch_sizes=[1], new_tokens=3, rounds=1, adapter="r4"
    )
    assert len(rows) == 1 and rows[0].decode_tps > 0
    with pytest.raises(BundleError, match="no adapter 'nope'"):  # the child opens the adapter
        bench(cli_bundle, prompt_lengths=[4], batch_sizes=[1], new_tokens=3, adapter="nope")
