"""Fixtures for `mobius-genai serve`: bundles of the tiny checkpoint and a live server
in a process of its own (`python -I`, 127.0.0.1, a free port), stopped within the test."""

from __future__ import annotations

import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from mobius_genai import packager
from tests._hf import edit_config
from tests.conftest import TINY_QWEN2

#: Seconds a server may take to load its bundle and listen (the machine may be loaded).
START_TIMEOUT = 120
#: The tool-call tokens of the tool fixture: the last two merged tokens, turned into added ones.
TOOL_TOKENS = {379: "<tool_call>", 380: "</tool_call>"}
#: A chat template that offers tools and shows earlier calls (Qwen's idea, cut down).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|im_start|>tool\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message.get('tool_calls') %}<|im_start|>assistant\n{% for call in "
    "message['tool_calls'] %}<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


@pytest.fixture(scope="session")
def chat_bundle(packaged: Callable[..., Path]) -> Path:
    """The tiny checkpoint as a cpu bundle (context 128, the Qwen chat template, every
    position's logits, which og.Engine needs)."""
    return packaged("cpu")


@pytest.fixture(scope="session")
def pruned_bundle(pruned_head: Path) -> Path:
    """The tiny checkpoint as a bundle whose graph computes the last position's logits only."""
    return pruned_head


@pytest.fixture(scope="session")
def long_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a context of 8192: replies long enough to be caught in flight."""
    checkpoint = tmp_path_factory.mktemp("serve") / "tiny-8192"
    shutil.copytree(TINY_QWEN2, checkpoint)
    edit_config(checkpoint, max_position_embeddings=8192)
    out = checkpoint.parent / "bundle"
    return packager.package(checkpoint, "cpu", out, smoke_test=False, quiet=True)


@pytest.fixture(scope="session")
def tool_bundle(long_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of `long_bundle` whose tokenizer has tool-call tokens, named in genai_config.json
    (model.bot_token_id / eot_token_id, the keys onnxruntime-genai reads), and whose chat
    template offers tools."""
    folder = tmp_path_factory.mktemp("serve") / "tools"
    shutil.copytree(long_bundle, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    by_id = {index: token for token, index in tokenizer["model"]["vocab"].items()}
    for index, token in TOOL_TOKENS.items():
        del tokenizer["model"]["vocab"][by_id[index]]
        tokenizer["added_tokens"].append(_added(index, token))
    tokenizer["model"]["merges"] = tokenizer["model"]["merges"][: -len(TOOL_TOKENS)]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for index, token in TOOL_TOKENS.items():
        entry = _added(index, token)
        del entry["id"]
        config["added_tokens_decoder"][str(index)] = entry
    config["chat_template"] = TOOL_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    genai = json.loads((folder / "genai_config.json").read_text())
    genai["model"]["bot_token_id"], genai["model"]["eot_token_id"] = sorted(TOOL_TOKENS)
    (folder / "genai_config.json").write_text(json.dumps(genai))
    return folder


def _added(index: int, token: str) -> dict[str, object]:
    flags = ("single_word", "lstrip", "rstrip", "normalized", "special")
    return {"id": index, "content": token, **dict.fromkeys(flags, False)}


class Server:
    """`mobius-genai serve FOLDER --port 0 OPTIONS` in a process of its own; its stderr lines
    are collected as they come."""

    def __init__(self, folder: Path, *options: str) -> None:
        command = [
            sys.executable,
            "-I",
            "-c",
            "import sys; from mobius_genai.cli import main; sys.exit(main())",
            "serve",
            str(folder),
            "--port",
            "0",
            *options,
        ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            first = self.wait_for(r"serving .* at http://\S+/v1", START_TIMEOUT)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        self.url = re.search(r"at (http://\S+/v1)", first).group(1)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            self._new.put(self.lines[-1])
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The first line from now on that matches `pattern`; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"the server ended: {self.lines}")
            if re.search(pattern, line):
                return line
        pytest.fail(f"no line matching {pattern!r} within {timeout} s: {self.lines}")

    def client(self, **options: object) -> openai.OpenAI:
        options = {"api_key": "not-needed", "max_retries": 0, "timeout": 60, **options}
        return openai.OpenAI(base_url=self.url, **options)

    def stop(self, signum: int = signal.SIGINT, timeout: float = 60) -> int:
        """Send `signum` and wait for the process to end; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="module")
def server(chat_bundle: Path) -> Iterator[Server]:
    """A server over `chat_bundle` shared by a test module."""
    with Server(chat_bundle) as running:
        yield running
