"""`mobius-genai chat` and the sampling options it shares with `run`.

The chat is driven through `main` with stdin replaced; the templated prompts it must feed are
rendered by transformers' tokenizer from the bundle's files, then fed to `run --raw`.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mobius_genai.cli import main
from mobius_genai.runtime.chat import Conversation
from mobius_genai.runtime.generate import greedy_tokens
from tests._writes import Writes

ROOT = Path(__file__).resolve().parents[2]


def _chat(monkeypatch, capsys, folder, lines: str, *options: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code = main(["chat", str(folder), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _run(capsys, folder, prompt: str, *options: str) -> str:
    assert main(["run", str(folder), "--prompt", prompt, *options]) == 0
    return capsys.readouterr().out


def _templated(folder, messages: list[dict[str, str]]) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_second_turn_sees_the_first(packaged, monkeypatch, capsys):
    folder = packaged("cpu")
    code, out, err = _chat(monkeypatch, capsys, folder, "Hi\nAgain\n", "--max-new-tokens", "6")
    assert code == 0  # end of input ends the chat
    first = _run(capsys, folder, "Hi", "--max-new-tokens", "6")  # greedy, the chat template
    assert out.startswith(first)
    second = out[len(first) :]
    conversation = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": first.removesuffix("\n")},
        {"role": "user", "content": "Again"},
    ]
    prompt = _templated(folder, conversation)
    assert second == _run(capsys, folder, prompt, "--raw", "--max-new-tokens", "6")
    assert second != _run(capsys, folder, "Again", "--max-new-tokens", "6")  # history matters
    assert err.count("tokens/s") == 2  # a speed line per reply


def test_exit_command_ends_the_chat(packaged, monkeypatch, capsys):
    folder = packaged("cpu")
    code, out, err = _chat(
        monkeypatch, capsys, folder, "Hi\n/exit\nAgain\n", "--max-new-tokens", "4", "--quiet"
    )
    assert code == 0
    assert out == _run(capsys, folder, "Hi", "--max-new-tokens", "4")
    assert err == "[… reply cut at 4 tokens; raise --max-new-tokens]\n"


def test_seed_makes_sampling_reproducible(packaged, monkeypatch, capsys):
    folder = packaged("cpu")
    options = ("--max-new-tokens", "12", "--temperature", "1.5", "--quiet")
    replies = [
        _chat(monkeypatch, capsys, folder, "Hi\n", *options, "--seed", seed)[1]
        for seed in ("1", "1", "2")
    ]
    assert replies[0] == replies[1]
    assert replies[0] != replies[2]
    greedy = _run(capsys, folder, "Hi", "--max-new-tokens", "12")
    assert replies[0] != greedy
    sampled = _run(capsys, folder, "Hi", *options, "--seed", "1")
    assert sampled == replies[0]  # run and chat sample the same way
    assert _run(capsys, folder, "Hi", *options, "--seed", "2") == replies[2]


def test_oldest_turns_are_dropped_to_fit_the_context(packaged, monkeypatch, capsys):
    folder = packaged("cpu")  # context 128 tokens; the template takes ~30 of them
    code, _, err = _chat(
        monkeypatch, capsys, folder, "Hi\nAgain\nOnce more\n", "--max-new-tokens", "40"
    )
    assert code == 0
    assert "dropped the oldest turn to fit the context (128 tokens)" in err
    assert err.count("tokens/s") == 3  # every message got its reply


def test_conversation_keeps_the_prompt_within_the_context(packaged):
    notes = []
    conversation = Conversation(packaged("cpu"), max_new_tokens=40, note=notes.append)
    for message in ("Hi", "Again", "Once more", "And again"):
        "".join(conversation.reply(message))
        assert len(conversation.prompt_ids) + 40 <= conversation.context == 128
    assert notes and len(conversation.turns) < 4
    kept = [
        {"role": role, "content": text}
        for turn in conversation.turns[:-1]
        for role, text in zip(("user", "assistant"), turn, strict=True)
    ]
    expected = _templated(conversation.folder, [*kept, {"role": "user", "content": "And again"}])
    tokenizer = AutoTokenizer.from_pretrained(conversation.folder)
    assert conversation.prompt_ids == tokenizer(expected, add_special_tokens=False).input_ids


def test_a_message_too_long_for_the_context_is_skipped(packaged, monkeypatch, capsys):
    folder = packaged("cpu")
    code, out, err = _chat(
        monkeypatch, capsys, folder, "x" * 200 + "\nHi\n", "--max-new-tokens", "4"
    )
    assert code == 0
    lines = err.splitlines()
    assert (
        "the bundle's context holds 128 (search.max_length); accepted: a shorter message"
        in lines[0]
    )
    assert out == _run(capsys, folder, "Hi", "--max-new-tokens", "4")


@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--temperature", "-1"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--top-k", "0"),
        ("--seed", "-2"),
    ],
)
def test_bad_sampling_values_are_one_line_errors(
    packaged, monkeypatch, capsys, command, option, value
):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    argv = [command, str(packaged("cpu")), option, value]
    assert main(argv + (["--prompt", "Hi"] if command == "run" else [])) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"mobius-genai: error: {option} ") and "accepted:" in line


def test_chat_without_a_template_says_so(bundle_copy, monkeypatch, capsys):
    folder = bundle_copy()
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"chat_template"', '"unused_template"'))
    code, _, err = _chat(monkeypatch, capsys, folder, "Hi\n")
    assert code == 1
    assert "no chat template" in err and "run --raw" in err


def chat_process(
    folder, *options: str, setup: str = "pass", stdin: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """`mobius-genai chat FOLDER OPTIONS` in a process of its own, SIGINT as Ctrl-C delivers
    it, after the Python statements `setup`; its stdout and stderr are pipes, its stdin
    `stdin` (a pipe unless said)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    script = f"import sys; from mobius_genai.cli import main; {setup}; sys.exit(main())"
    return subprocess.Popen(
        [sys.executable, "-c", script, "chat", str(folder), *options],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_ctrl_c_while_the_chat_reads_a_pipe_ends_it_with_one_line(packaged):
    process = chat_process(packaged("cpu"), "--max-new-tokens", "4")
    process.stdin.write("Hi\n")
    process.stdin.flush()
    process.stdout.readline()  # the reply: the chat now waits for the next message
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    lines = [line for line in err.splitlines() if "tokens/s" not in line and "[…" not in line]
    assert lines == ["mobius-genai: interrupted; chat ended"]


def test_each_line_on_stderr_is_one_write(packaged, monkeypatch):
    # A Ctrl-C handled between a line's text and its newline (print writes them apart) glued
    # "interrupted; chat ended" onto the speed line.
    stderr = Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n/reset\n/nothing\n"))
    assert main(["chat", str(packaged("cpu")), "--max-new-tokens", "4"]) == 0
    assert len(stderr.writes) >= 4  # the cut marker, the speed line, reset, unknown command
    assert all(text.endswith("\n") for text in stderr.writes), stderr.writes


def test_ep_cpu_chats_with_a_gpu_bundle_here(packaged, monkeypatch, capsys):
    folder = packaged("cuda")
    code, _, err = _chat(monkeypatch, capsys, folder, "Hi\n")
    assert code == 1 and f"`mobius-genai chat {folder} --ep cpu`" in err
    code, out, _ = _chat(
        monkeypatch, capsys, folder, "Hi\n", "--ep", "cpu", "--max-new-tokens", "4"
    )
    assert code == 0 and out.endswith("\n")
    code, _, err = _chat(monkeypatch, capsys, folder, "Hi\n", "--ep", "dml")
    assert code == 1
    assert err.splitlines() == [
        "mobius-genai: error: --ep dml: not accepted here; accepted: cpu (the bundle's graph on "
        "the CPU provider, whatever its provider_options say)"
    ]


def test_a_reply_stops_at_the_models_eos_tokens(bundle_copy):
    folder = bundle_copy()
    conversation = Conversation(folder, max_new_tokens=8)
    free = "".join(conversation.reply("Hi"))
    prompt = conversation.prompt_ids
    tokens = greedy_tokens(conversation.model, prompt, len(prompt) + 8)
    assert _streamed(conversation, tokens) == free
    # a token that ends the reply once it is an EOS token: one with text, not seen before it
    stop = next(
        i
        for i in range(len(tokens))
        if tokens[i] not in tokens[:i]
        and _streamed(conversation, tokens[: i + 1]) != _streamed(conversation, tokens[:i])
    )
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = [*config["model"]["eos_token_id"], tokens[stop]]
    (folder / "genai_config.json").write_text(json.dumps(config))
    stopped = Conversation(folder, max_new_tokens=8)
    expected = _streamed(stopped, tokens[:stop])
    assert "".join(stopped.reply("Hi")) == expected != free
    assert stopped.turns == [("Hi", expected)]


def _streamed(conversation: Conversation, tokens: list[int]) -> str:
    stream = conversation.tokenizer.create_stream()
    return "".join(stream.decode(token) for token in tokens)


def test_run_prints_its_speed_unless_quiet(packaged, capsys):
    folder = str(packaged("cpu"))
    assert main(["run", folder, "--prompt", "Hi", "--max-tokens", "5"]) == 0
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("mobius-genai: 5 tokens, decode ") and line.endswith(" tokens/s")
    assert main(["run", folder, "--prompt", "Hi", "--max-tokens", "5", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
