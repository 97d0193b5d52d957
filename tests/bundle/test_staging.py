"""Replacing OUT with --force is safe at every step; killed runs' leftovers are cleaned up by
the next run for the same OUT; staging names fit NAME_MAX whatever OUT's name."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mobius_genai.bundle import output_folder as staged_module
from mobius_genai.bundle.output_folder import staged_output
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from tests.conftest import TINY_QWEN2

REPO = Path(__file__).resolve().parents[2]


def _leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir())


def _old_bundle(out: Path) -> Path:
    out.mkdir()
    (out / "old.txt").write_text("old")
    return out


def _notes(error: BaseException) -> str:
    return "; ".join(getattr(error, "__notes__", []))


class _Interrupt:
    """os.replace / shutil.rmtree that raise KeyboardInterrupt before or after call `at`."""

    def __init__(self, real, at: int, after: bool) -> None:
        self.real, self.at, self.after, self.calls = real, at, after, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at and not self.after:
            raise KeyboardInterrupt
        result = self.real(*args, **kwargs)
        if self.calls == self.at and self.after:
            raise KeyboardInterrupt
        return result


#: Interruption points of a --force swap → what OUT must hold afterwards.
STEPS = {
    "before moving the old bundle aside": ("replace", 1, False, "old"),
    "after moving the old bundle aside": ("replace", 1, True, "old"),
    "before renaming the new bundle into place": ("replace", 2, False, "old"),
    "after renaming the new bundle into place": ("replace", 2, True, "new"),
    "while removing the old bundle": ("rmtree", 1, False, "new"),
    "after removing the old bundle": ("rmtree", 1, True, "new"),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_an_interrupted_swap_leaves_the_old_or_the_new_bundle_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
):
    function, at, after, holds = STEPS[step]
    out = _old_bundle(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt) as caught, staged_output(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
        if function == "replace":
            monkeypatch.setattr(staged_module.os, "replace", _Interrupt(os.replace, at, after))
        else:
            monkeypatch.setattr(
                staged_module.shutil, "rmtree", _Interrupt(shutil.rmtree, at, after)
            )
    monkeypatch.undo()
    assert _leftovers(out) == [f"{holds}.txt"]
    if holds == "new":
        assert _notes(caught.value) == f"output {out}: the new bundle is complete and in place"
    else:
        assert _notes(caught.value) == (
            f"output {out}: nothing was written; the folder there is unchanged"
        )
    assert _leftovers(tmp_path) == ["out"]


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_the_renames_waits_until_the_new_bundle_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, number: int
):
    """Ctrl-C or SIGTERM (which the CLI turns into SystemExit) right after the old bundle was
    moved aside is delivered once the new one is in place."""

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    # Python's Ctrl-C handler, as a terminal gives it: a job started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    real_replace, calls = os.replace, []

    def signalled(*args, **kwargs):
        real_replace(*args, **kwargs)
        calls.append(args)
        if len(calls) == 1:
            signal.raise_signal(number)  # this thread: handled before the next line, not whenever

    out = _old_bundle(tmp_path / "out")
    expected = KeyboardInterrupt if number == signal.SIGINT else SystemExit
    try:
        with pytest.raises(expected) as caught, staged_output(out, force=True) as staging:
            (staging / "new.txt").write_text("new")
            monkeypatch.setattr(staged_module.os, "replace", signalled)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert len(calls) == 2  # the second rename ran although the signal came after the first
    assert _leftovers(out) == ["new.txt"]
    assert _notes(caught.value) == f"output {out}: the new bundle is complete and in place"
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_the_cli_says_the_new_bundle_is_in_place_when_interrupted_after_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
):
    out = _old_bundle(tmp_path / "out")
    real_rmtree = shutil.rmtree

    def interrupted(path, *args, **kwargs):  # the first removal after the swap: the old bundle
        monkeypatch.setattr(staged_module.shutil, "rmtree", real_rmtree)
        if how == "ctrl-c":
            raise KeyboardInterrupt
        signal.raise_signal(signal.SIGTERM)

    real_swap = staged_module._staging.swap

    def swap(*args):
        real_swap(*args)
        monkeypatch.setattr(staged_module.shutil, "rmtree", interrupted)

    monkeypatch.setattr(staged_module._staging, "swap", swap)
    argv = ["package", str(TINY_QWEN2), "-o", str(out), "--force", "--quiet", "--no-smoke-test"]
    assert main(argv) == 128 + (signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
    word = "interrupted" if how == "ctrl-c" else "terminated"
    assert capsys.readouterr().err == (
        f"mobius-genai: {word}; output {out}: the new bundle is complete and in place\n"
    )
    assert (out / "genai_config.json").is_file()
    assert _leftovers(tmp_path) == ["out"]


def _run_and_kill(out: Path, body: str, *, force: bool = False) -> subprocess.Popen[str]:
    """A process that stages `out` and runs `body` inside the block (with `staging` and `os`)."""
    script = textwrap.dedent(
        f"""
        import os, shutil, signal, sys, time
        from pathlib import Path
        from mobius_genai.bundle import _staging
        from mobius_genai.bundle.output_folder import staged_output
        with staged_output(Path({str(out)!r}), force={force}) as staging:
            (staging / "new.txt").write_text("new")
        """
    )
    script += textwrap.indent(textwrap.dedent(body), "    ")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )


def test_leftovers_of_killed_runs_are_removed_and_live_ones_kept(tmp_path: Path):
    out = tmp_path / "out"
    running = _run_and_kill(out, "print('staged', flush=True); time.sleep(60)")
    try:
        assert running.stdout.readline() == "staged\n"
        killed = _run_and_kill(out, "os.kill(os.getpid(), signal.SIGKILL)")
        assert killed.wait(60) == -signal.SIGKILL
        other = _run_and_kill(tmp_path / "other", "os.kill(os.getpid(), signal.SIGKILL)")
        assert other.wait(60) == -signal.SIGKILL
        left = [name for name in _leftovers(tmp_path) if name.endswith(".partial")]
        assert len(left) == 3
        with staged_output(out) as staging:
            (staging / "mine.txt").write_text("mine")
        remaining = [name for name in _leftovers(tmp_path) if name.endswith(".partial")]
        assert len(remaining) == 2  # the running process's, and the other OUT's
        assert all(f".{running.pid}." in n or n.startswith(".other.") for n in remaining)
    finally:
        running.kill()
        running.wait(60)
    with staged_output(out, force=True) as staging:
        (staging / "again.txt").write_text("again")
    assert [n for n in _leftovers(tmp_path) if n.startswith(".out.")] == []
    assert _leftovers(out) == ["again.txt"]


_KILLED_BETWEEN_THE_RENAMES = """
real = os.replace
def replace(source, target):
    real(source, target)
    os.kill(os.getpid(), signal.SIGKILL)
_staging.os.replace = replace
"""


def test_a_run_killed_between_the_renames_is_finished_by_the_next(tmp_path: Path):
    out = _old_bundle(tmp_path / "out")
    killed = _run_and_kill(out, _KILLED_BETWEEN_THE_RENAMES, force=True)
    assert killed.wait(60) == -signal.SIGKILL
    assert not out.exists()  # the old bundle was moved aside, the new one not yet in place
    assert sorted(name.rsplit(".", 1)[1] for name in _leftovers(tmp_path)) == ["old", "partial"]
    said = []
    with pytest.raises(BundleError, match="not empty"), staged_output(out, say=said.append):
        pass
    assert said == [
        f"output {out}: a mobius-genai process (pid {killed.pid}) was killed while replacing it; "
        "finished the replacement: the new bundle it had made is in place"
    ]
    assert _leftovers(out) == ["new.txt"]
    assert _leftovers(tmp_path) == ["out"]


def _crashed_swap(tmp_path: Path, old: Path, new: Path) -> Path:
    """The folder `tmp_path/out` as a `package --force` SIGKILLed between the two renames of
    its swap leaves it: absent, `old` moved aside beside it and `new` complete beside it."""
    out = shutil.copytree(old, tmp_path / "out")
    (out / "old.txt").write_text("old")
    body = f"""
    shutil.copytree({str(new)!r}, staging, dirs_exist_ok=True)
    """ + textwrap.indent(_KILLED_BETWEEN_THE_RENAMES, "    ")
    killed = _run_and_kill(out, body, force=True)
    assert killed.wait(60) == -signal.SIGKILL
    assert not out.exists()
    assert sorted(name.rsplit(".", 1)[1] for name in _leftovers(tmp_path)) == ["old", "partial"]
    return out


#: Commands that take OUT after the crash → their arguments after it.
AFTER_THE_CRASH = {
    "validate": ["validate", "{out}"],
    "run": ["run", "{out}", "--prompt", "Hi", "--max-new-tokens", "2", "--quiet"],
    "chat": ["chat", "{out}"],
    "bench": ["bench", "{out}", "--prompt-lengths", "4", "--new-tokens", "2", "--rounds", "1"],
    "package": ["package", str(TINY_QWEN2), "-o", "{out}", "--no-smoke-test"],
    "build": ["build", str(TINY_QWEN2), "-o", "{out}"],
}


@pytest.mark.parametrize("command", list(AFTER_THE_CRASH))
def test_a_command_on_out_finishes_a_swap_a_killed_package_left_and_says_so(
    tmp_path: Path, packaged, monkeypatch: pytest.MonkeyPatch, capsys, command: str
):
    new = shutil.copytree(packaged("cpu"), tmp_path / "new")
    (new / "new.txt").write_text("new")
    out = _crashed_swap(tmp_path / "work", packaged("cpu"), new)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    argv = [word.format(out=out) for word in AFTER_THE_CRASH[command]]
    writes = command in ("package", "build")
    assert main(argv) == (1 if writes else 0)  # OUT is not empty: package and build stop there
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"mobius-genai: output {out}: a mobius-genai process (pid {_pid(err[0])}) was killed while "
        "replacing it; finished the replacement: the new bundle it had made is in place"
    )
    assert (out / "new.txt").is_file() and not (out / "old.txt").exists()
    assert _leftovers(tmp_path / "work") == ["out"]


def _pid(line: str) -> str:
    return line.split("(pid ", 1)[1].split(")", 1)[0]


def test_validate_puts_back_a_previous_bundle_left_without_its_successor(
    tmp_path: Path, packaged, capsys
):
    out = _crashed_swap(tmp_path, packaged("cpu"), packaged("cpu"))
    [partial] = [path for path in tmp_path.iterdir() if path.name.endswith(".partial")]
    shutil.rmtree(partial)
    [old] = [path.name for path in tmp_path.iterdir() if path.name.endswith(".old")]
    assert main(["validate", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.endswith(f"put back the previous bundle it had moved aside to {old}\n")
    assert (out / "old.txt").is_file()
    assert _leftovers(tmp_path) == ["out"]


@pytest.mark.parametrize("force", [False, True])
def test_a_240_character_output_name_is_staged_within_name_max(tmp_path: Path, force: bool):
    out = tmp_path / ("b" * 240)
    if force:
        _old_bundle(out)
    with staged_output(out, force=force) as staging:
        assert len(os.fsencode(staging.name)) <= 255
        (staging / "new.txt").write_text("new")
    assert _leftovers(out) == ["new.txt"]
    assert _leftovers(tmp_path) == [out.name]
