"""`run`, `chat` and `bench` decode with a bundle's MTP head (og.MtpGenerator) and without it
under `--no-mtp`: the same tokens, and the head's drafts counted (a head that copies the model:
every draft accepted)."""

from __future__ import annotations

import io

import pytest

from mobius_genai.bench.runner import bench
from mobius_genai.cli import main
from mobius_genai.runtime.decoding import Decoder
from mobius_genai.runtime.opening import open_bundle
from tests._bundles import PROMPT
from tests.models.mtp.test_mtp import _checkpoint


@pytest.fixture(scope="module")
def cli_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-cli")
    ckpt = _checkpoint(root / "ckpt", "qwen3_5_text", copy=True)
    out = root / "bundle"
    assert main(["package", str(ckpt), "--ep", "cpu", "-o", str(out), "--quiet"]) == 0
    return out


def _tokens(folder, mtp: bool) -> tuple[list[int], Decoder]:
    bundle = open_bundle(folder, command="run", mtp=mtp)
    assert (bundle.mtp is not None) is mtp
    decoder = Decoder(bundle)
    tokens = list(decoder.tokens(PROMPT, max_new_tokens=16, max_length=64))
    return tokens, decoder


def test_decoding_uses_the_head_unless_told_not_to(cli_bundle):
    drafted, with_head = _tokens(cli_bundle, True)
    plain, without = _tokens(cli_bundle, False)
    assert drafted == plain and len(drafted) == 16
    assert with_head.finish == without.finish == "length"
    assert with_head.mtp_stats.evaluated > 0
    assert with_head.mtp_stats.accepted == with_head.mtp_stats.evaluated
    assert without.mtp_stats.proposed == 0


def test_run_and_chat_take_no_mtp(cli_bundle, capsys, monkeypatch):
    argv = ["run", str(cli_bundle), "--prompt", "Hi", "--raw", "--temperature", "0", "--quiet"]
    argv += ["--max-new-tokens", "8"]
    assert main(argv) == 0
    drafted = capsys.readouterr().out
    assert main([*argv, "--no-mtp"]) == 0
    assert capsys.readouterr().out == drafted
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    chat = ["chat", str(cli_bundle), "--max-new-tokens", "4", "--temperature", "0"]
    assert main([*chat, "--no-mtp"]) == 0
    without = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert main(chat) == 0
    assert capsys.readouterr().out == without


def test_bench_measures_the_heads_acceptance(cli_bundle, capsys):
    rows = bench(cli_bundle, prompt_lengths=[8], batch_sizes=[1], new_tokens=12, rounds=1)
    assert rows[0].acceptance == 1.0 and rows[0].decode_tps > 0
    plain = bench(
        cli_bundle, prompt_lengths=[8], batch_sizes=[1], new_tokens=12, rounds=1, mtp=False
    )
    assert plain[0].acceptance is None
    argv = ["bench", str(cli_bundle), "--prompt-lengths", "8", "--batch-sizes", "1"]
    argv += ["--new-tokens", "4", "--rounds", "1"]
    assert main(argv) == 0
    assert "drafts accepted 100%" in capsys.readouterr().out
    assert main([*argv, "--no-mtp"]) == 0
    assert "MTP head" not in capsys.readouterr().out
