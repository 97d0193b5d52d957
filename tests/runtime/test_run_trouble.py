"""`run`, `chat` and `bench` on a bundle they cannot run, and the options they share: the same
one line from all three (the wheel a GPU bundle needs, what is wrong with a damaged bundle and
`mobius-genai validate`), never onnxruntime's log lines or C++ internals; a positional prompt,
--threads and --max-length; a path that does not exist."""

from __future__ import annotations

import io
import json

import onnxruntime_genai as og
import pytest

from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.runtime import opening

COMMANDS = {
    "run": ["--prompt", "Hi", "--max-new-tokens", "4"],
    "chat": ["--max-new-tokens", "4"],
    "bench": ["--prompt-lengths", "4", "--new-tokens", "2", "--rounds", "1"],
}


def _main(monkeypatch, argv: list[str]) -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))  # chat's one message
    return main(argv)


def _one_line(command: str, folder, capfd, monkeypatch, code: int = 1) -> str:
    """The one stderr line (file descriptor 2: onnxruntime's own log lines included) of a
    failing `command` on `folder`, which exits with `code`."""
    assert _main(monkeypatch, [command, str(folder), *COMMANDS[command]]) == code
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mobius-genai: error: "), err
    return err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_gpu_bundle_gets_the_same_advice_from_every_command(
    command, packaged, capfd, monkeypatch
):
    folder = packaged("cuda")
    err = _one_line(command, folder, capfd, monkeypatch)
    assert get_ep("cuda").runtime.package in err
    assert f"`mobius-genai {command} {folder} --ep cpu`" in err
    assert "libonnxruntime" not in err and "Cuda interface" not in err


def _share_buffer_without_gqa(folder) -> None:
    """Damage that loads and fails in the first run: onnxruntime logs a red line for it."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["search"]["past_present_share_buffer"] = True
    path.write_text(json.dumps(config))


def _truncated_weights(folder) -> None:
    (folder / "model.onnx.data").write_bytes((folder / "model.onnx.data").read_bytes()[:1000])


DAMAGE = {
    "fails while generating": (_share_buffer_without_gqa, "search.past_present_share_buffer"),
    "fails while loading": (_truncated_weights, "model.onnx.data: 1000 bytes"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_bundle_is_one_line_naming_validate(
    command, damage, bundle_copy, capfd, monkeypatch
):
    folder = bundle_copy("default")  # the portable graph: Attention, no shared buffer
    breaks, finding = DAMAGE[damage]
    breaks(folder)
    goes_on = command == "chat" and damage == "fails while generating"  # to the next message
    err = _one_line(command, folder, capfd, monkeypatch, 0 if goes_on else 1)
    assert finding in err and f"`mobius-genai validate {folder}`" in err
    assert all(word not in err for word in ("onnxruntime::", ".cc:", ".h:", "[E:onnxruntime"))


def test_og_internals_are_left_out_where_validate_finds_nothing(bundle_copy, capfd, monkeypatch):
    folder = bundle_copy("cpu")
    (folder / "model.onnx.data").unlink()
    monkeypatch.setattr(opening, "_validation_finding", lambda folder: None)  # as if it found none
    err = _one_line("run", folder, capfd, monkeypatch)
    assert "External data path does not exist" in err
    assert "tensorprotoutils" not in err and "ValidateExternalDataPathFromDir" not in err
    assert f"`mobius-genai validate {folder}` checks the bundle" in err


def test_run_on_a_missing_path_says_it_does_not_exist(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope"), "Hi"]) == 1
    assert capsys.readouterr().err == (
        f"mobius-genai: error: {tmp_path / 'nope'}: no such file or folder; accepted: a bundle "
        "folder written by `mobius-genai package`\n"
    )


def test_run_takes_the_prompt_as_an_argument_or_an_option(packaged, capsys):
    folder = str(packaged("cpu"))
    assert main(["run", folder, "Hi", "--max-new-tokens", "6", "--quiet"]) == 0
    positional = capsys.readouterr().out
    assert main(["run", folder, "--prompt", "Hi", "--max-new-tokens", "6", "--quiet"]) == 0
    assert capsys.readouterr().out == positional
    for argv in (["run", folder], ["run", folder, "Hi", "--prompt", "Hi"]):
        assert main(argv) == 1
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("mobius-genai: error: the prompt is ") and "accepted:" in line


@pytest.mark.parametrize("command", ["run", "chat"])
def test_threads_reach_onnxruntimes_session_options(command, packaged, monkeypatch, capsys):
    loads = []
    real = opening.load_model

    def recorded(folder, **options):
        loads.append(options["session_options"])
        return real(folder, **options)

    monkeypatch.setattr(opening, "load_model", recorded)
    argv = [command, str(packaged("cpu")), *COMMANDS[command], "--quiet"]
    assert _main(monkeypatch, [*argv, "--threads", "1"]) == 0
    one_thread = capsys.readouterr().out
    assert _main(monkeypatch, argv) == 0
    assert capsys.readouterr().out == one_thread
    assert loads[0]["intra_op_num_threads"] == 1 and "intra_op_num_threads" not in loads[1]


@pytest.mark.parametrize("kind", ["full_logits", "pruned"])
def test_max_length_bounds_prompt_and_reply(kind, request, packaged, capsys):
    folder = packaged("cpu") if kind == "full_logits" else request.getfixturevalue("pruned_head")
    prompt = "Hello there, how are you"
    ids = og.Tokenizer(og.Model(str(folder))).encode(prompt)
    length = len(with_bos(ids, required_bos(folder)))
    argv = ["run", str(folder), prompt, "--raw", "--max-new-tokens", "100"]
    assert main([*argv, "--max-length", str(length + 5)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "og.Generator" not in line]
    assert err[0].startswith("mobius-genai: 5 tokens, decode ")
    assert main([*argv, "--max-length", "4096"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "og.Generator" not in line]
    assert err[0] == (
        f"mobius-genai: --max-length 4096: beyond {folder}'s context length (128 tokens, "
        "model.context_length); using 128"
    )
    assert err[1].startswith(f"mobius-genai: {min(100, 128 - length)} tokens, decode ")
