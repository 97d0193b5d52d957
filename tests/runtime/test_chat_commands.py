"""`mobius-genai chat` as chat users expect it: /help, /reset, /exit and /quit (never sent to
the model), Ctrl-C stops a reply and the chat goes on, a reply cut at the token limit or the
context says so, --system. Replies are checked against og.Generator's greedy tokens for the
prompt transformers' tokenizer renders from the bundle's chat template."""

from __future__ import annotations

import io
import os
import pty
import signal
import time
from pathlib import Path

import onnxruntime_genai as og
import pytest
from transformers import AutoTokenizer

from mobius_genai.cli import main
from mobius_genai.runtime.generate import greedy_tokens
from tests.runtime.test_chat import chat_process

KINDS = ["full_logits", "pruned"]  # og's Engine runs the first, og.Generator the second


@pytest.fixture(params=KINDS)
def folder(request, packaged) -> Path:
    return packaged("cpu") if request.param == KINDS[0] else request.getfixturevalue("pruned_head")


def _chat(monkeypatch, capsys, folder, lines: str, *options: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code = main(["chat", str(folder), *options])
    captured = capsys.readouterr()
    return code, captured.out, _without_generator_note(captured.err)


def _without_generator_note(err: str) -> str:
    """stderr without the line saying og.Generator runs a bundle og's Engine does not."""
    return "".join(line for line in err.splitlines(keepends=True) if "og.Generator" not in line)


def _reply(folder, messages: list[dict[str, str]], new_tokens: int) -> str:
    """og.Generator's greedy reply to `messages` rendered by transformers' tokenizer, without
    the EOS token (the chat does not print it)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    model = og.Model(str(folder))
    tokens = greedy_tokens(model, ids, len(ids) + new_tokens)
    stream = og.Tokenizer(model).create_stream()
    return "".join(stream.decode(t) for t in tokens if t not in tokenizer.all_special_ids)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_commands_are_never_sent_to_the_model(folder, monkeypatch, capsys):
    code, out, err = _chat(
        monkeypatch, capsys, folder, "/help\n/nope\nHi\n/quit\nAgain\n", "--max-new-tokens", "5"
    )
    assert code == 0
    assert out == _reply(folder, [_user("Hi")], 5) + "\n"  # one reply: /quit ended the chat
    lines = err.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["/help", "/reset", "/exit", "/quit"]
    assert lines[4] == "mobius-genai: unknown command /nope; /help lists the commands"


def test_reset_starts_the_conversation_again(folder, monkeypatch, capsys):
    code, out, err = _chat(
        monkeypatch, capsys, folder, "Hi\n/reset\nHi\n", "--max-new-tokens", "5", "--quiet"
    )
    first = _reply(folder, [_user("Hi")], 5)
    assert code == 0 and out == f"{first}\n{first}\n"
    assert "[conversation reset]" in err.splitlines()


def test_system_message_leads_the_conversation(folder, monkeypatch, capsys):
    options = ("--max-new-tokens", "6", "--quiet", "--system", "You answer in French.")
    code, out, _ = _chat(monkeypatch, capsys, folder, "Hi\n", *options)
    system = {"role": "system", "content": "You answer in French."}
    assert code == 0 and out == _reply(folder, [system, _user("Hi")], 6) + "\n"
    assert out != _reply(folder, [_user("Hi")], 6) + "\n"


def test_a_reply_cut_by_the_context_says_so(folder, monkeypatch, capsys):
    options = ("--max-new-tokens", "100", "--max-length", "60", "--quiet")  # "Hi" takes 49
    code, _, err = _chat(monkeypatch, capsys, folder, "Hi\n", *options)
    assert code == 0
    assert err.splitlines() == [
        "[… reply cut: the conversation fills the context (60 tokens); /reset starts again]"
    ]


class _CtrlCAtPiece(io.StringIO):
    """stdout whose `at`-th write of the first reply raises KeyboardInterrupt, as Ctrl-C does
    wherever the program is."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.left = at

    def write(self, text: str) -> int:
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(folder, monkeypatch, capsys):
    stdout = _CtrlCAtPiece(at=3)
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nAgain\n"))
    assert main(["chat", str(folder), "--max-new-tokens", "6", "--quiet"]) == 0
    partial, second = stdout.getvalue().split("\n")[:2]
    first = _reply(folder, [_user("Hi")], 6)
    assert first.startswith(partial) and len(partial) < len(first)
    # the turn after the stopped one sees the text so far
    conversation = [_user("Hi"), {"role": "assistant", "content": partial}, _user("Again")]
    assert second == _reply(folder, conversation, 6)
    err = _without_generator_note(capsys.readouterr().err).splitlines()
    assert err[0] == "[reply stopped]"
    assert all("interrupted" not in line and "nothing was written" not in line for line in err)


def test_a_real_ctrl_c_during_a_reply_stops_it_only(packaged):
    # the child writes each piece slowly, so the signal lands while the Engine's turn runs
    slow = "import time; write = sys.stdout.write; "
    slow += "sys.stdout.write = lambda text: (time.sleep(0.1), write(text))[1]"
    process = chat_process(packaged("cpu"), "--max-new-tokens", "20", setup=slow)
    process.stdin.write("Hi\n")
    process.stdin.flush()
    process.stdout.read(1)  # the reply has begun
    process.send_signal(signal.SIGINT)
    out, err = process.communicate("Again\n", timeout=120)
    assert process.returncode == 0, err
    lines = err.splitlines()
    assert lines[0] == "[reply stopped]" and "Traceback" not in err
    assert sum(line.startswith("mobius-genai: ") and "tokens/s" in line for line in lines) == 1
    assert out.count("\n") == 2  # the stopped reply, then the next one


def test_ctrl_c_at_a_terminals_prompt_keeps_the_chat(packaged):
    controller, terminal = pty.openpty()  # the chat reads a terminal, as a user's does
    process = chat_process(packaged("cpu"), "--max-new-tokens", "4", stdin=terminal)
    os.close(terminal)
    try:
        assert process.stdout.read(2) == "> "  # the prompt: it waits for a message
        time.sleep(1)  # in its read of the terminal (a signal just before it waits for Enter)
        process.send_signal(signal.SIGINT)
        assert process.stdout.read(2) == "> "  # a new prompt, the chat goes on
        os.write(controller, b"/exit\n")
        _, err = process.communicate(timeout=60)
    finally:
        os.close(controller)
    assert process.returncode == 0
    assert "(/exit or Ctrl-D ends the chat)" in err.splitlines()
