"""Chat templates onnxruntime-genai cannot survive: one that recurses forever (its template
engine overflows its stack), one that loops for good, one of hundreds of kilobytes (its time
grows with the square of the statements). `package` refuses them, `validate` reports them, and
`run` and `chat` refuse them in one line instead of crashing or hanging."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mobius_genai import packager
from mobius_genai.bundle import chat_template as template_module
from mobius_genai.bundle.chat_template import chat_template, check_chat_template
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.config.limits import CHAT_TEMPLATE_BYTES
from mobius_genai.errors import BundleError, ConfigError
from tests.conftest import TINY_QWEN2

ROOT = Path(__file__).resolve().parents[2]
RECURSIVE = "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"
ENDLESS = "{% for i in range(100000000) %}{{ i }}{% endfor %}"
CRASHED = (
    "the chat template crashed onnxruntime-genai's template engine (signal 11, SIGSEGV) while "
    "rendering the chat template; accepted: a template onnxruntime-genai renders"
)


def _set_template(folder: Path, template: object) -> None:
    path = folder / "tokenizer_config.json"
    document = json.loads(path.read_text())
    document["chat_template"] = template
    path.write_text(json.dumps(document))


def _oversized() -> str:
    return "x" * (CHAT_TEMPLATE_BYTES + 1)


_MAIN = "import sys; from mobius_genai.cli import main; sys.exit(main())"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own: a crash there cannot end the test run."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", _MAIN, *args],
        capture_output=True,
        text=True,
        input="Hi\n",
        env={**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=300,
    )


def test_package_refuses_a_recursive_template_without_the_smoke_test(tmp_path: Path):
    ckpt = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    _set_template(ckpt, RECURSIVE)
    with pytest.raises(BundleError, match=CRASHED.replace("(", r"\(").replace(")", r"\)")):
        packager.package(ckpt, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]


def test_validate_reports_a_recursive_template(bundle_copy, capsys):
    folder = bundle_copy()
    _set_template(folder, RECURSIVE)
    with pytest.raises(BundleError, match="crashed onnxruntime-genai's template engine"):
        validate_bundle(folder, check_hashes=False)
    assert main(["validate", str(folder), "--skip-hashes"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and CRASHED in err


@pytest.mark.parametrize("command", ["run", "run --raw", "chat"])
def test_run_and_chat_refuse_a_recursive_template_in_one_line(bundle_copy, command: str):
    folder = bundle_copy()
    _set_template(folder, RECURSIVE)
    args = {"run": ["--prompt", "Hi"], "run --raw": ["--prompt", "Hi", "--raw"], "chat": []}
    result = _cli(command.split()[0], str(folder), *args[command], "--max-new-tokens", "2")
    assert result.returncode == 1, result.stderr  # not -11: this process did not render it
    assert result.stderr.count("\n") == 1 and CRASHED in result.stderr
    assert result.stderr.startswith(f"mobius-genai: error: {folder}: ")


@pytest.fixture
def eight_mib_stack() -> Iterator[None]:
    """Processes started here get an 8 MiB stack, the usual default (onnxruntime-genai's
    crash on a long comment depends on it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if hard != resource.RLIM_INFINITY and hard < 8 << 20:
        pytest.skip(f"the stack is limited to {hard} bytes")
    resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, hard))
    yield
    resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))


@pytest.mark.parametrize("command", ["validate", "run --raw", "chat"])
def test_a_long_comment_crashing_the_tokenizer_is_refused(
    bundle_copy, eight_mib_stack, command: str
):
    """onnxruntime-genai 0.18 overflows an 8 MiB stack parsing a Jinja comment of ~47,500
    characters or more (47,528 passed, 47,616 crashed) when it creates the tokenizer, before
    any rendering: `run --raw` too is refused before its own tokenizer is made."""
    folder = bundle_copy()
    _set_template(folder, "{# " + "x" * 60_000 + " #}" + chat_template(TINY_QWEN2))
    args = {"validate": [], "run --raw": ["--prompt", "Hi", "--raw"], "chat": []}[command]
    result = _cli(command.split()[0], str(folder), *args)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1
    assert (
        "the chat template crashed onnxruntime-genai's template engine (signal 11, SIGSEGV) "
        "while creating the tokenizer; accepted: " in result.stderr
    )


def test_a_template_that_loops_for_good_is_refused_after_the_time_bound(
    bundle_copy, monkeypatch: pytest.MonkeyPatch
):
    folder = bundle_copy()
    _set_template(folder, ENDLESS)
    monkeypatch.setattr(template_module, "RENDER_SECONDS", 2)
    with pytest.raises(BundleError, match=r"did not finish rendering the chat template within 2 s"):
        check_chat_template(folder)


def test_the_runtime_renders_the_bundles_own_template(packaged: Callable[[str], Path]):
    assert check_chat_template(packaged("cpu")) == chat_template(TINY_QWEN2)


@pytest.mark.parametrize("where", ["tokenizer_config.json", "a named template", "jinja"])
def test_package_refuses_an_oversized_template_before_saving_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    ckpt = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    if where == "tokenizer_config.json":
        _set_template(ckpt, _oversized())
        name = "tokenizer_config.json"
    elif where == "a named template":
        _set_template(
            ckpt,
            [{"name": "default", "template": "x"}, {"name": "tool_use", "template": _oversized()}],
        )
        name = "tokenizer_config.json"
    else:
        (ckpt / "chat_template.jinja").write_text(_oversized())
        name = "chat_template.jinja"
    monkeypatch.setattr(packager, "save_with_digest", lambda *a, **k: pytest.fail("saved"))
    with pytest.raises(ConfigError) as caught:
        packager.package(ckpt, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    assert str(caught.value) == (
        f"{ckpt / name}: the chat template is {CHAT_TEMPLATE_BYTES + 1} bytes, above "
        f"{CHAT_TEMPLATE_BYTES}, more than any released model's; accepted: up to "
        f"{CHAT_TEMPLATE_BYTES} bytes"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]


def test_validate_and_run_refuse_an_oversized_template(bundle_copy, capsys):
    folder = bundle_copy()
    _set_template(folder, _oversized())
    bound = f"the chat template is {CHAT_TEMPLATE_BYTES + 1} bytes, above {CHAT_TEMPLATE_BYTES}"
    with pytest.raises(BundleError, match=bound):
        validate_bundle(folder, check_hashes=False)
    for command in (["run", str(folder), "--prompt", "Hi"], ["validate", str(folder)]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and bound in err, err


def test_the_template_read_is_the_default_one(tmp_path: Path):
    assert chat_template(tmp_path) is None
    _tokenizer_config = tmp_path / "tokenizer_config.json"
    _tokenizer_config.write_text(json.dumps({"chat_template": ["not an object", {"name": "x"}]}))
    assert chat_template(tmp_path) is None
    _tokenizer_config.write_text(
        json.dumps({"chat_template": [{"name": "default", "template": "{{ x }}"}]})
    )
    assert chat_template(tmp_path) == "{{ x }}"
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe")
    with pytest.raises(BundleError, match="chat_template.jinja: not readable as UTF-8 text"):
        chat_template(tmp_path)
