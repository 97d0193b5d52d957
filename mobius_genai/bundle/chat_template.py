"""A bundle's chat template: read it, bound its size, and have onnxruntime-genai render it in a
process of its own before anything renders it here.

onnxruntime-genai 0.18 renders templates with a template engine of its own, in the process that
asks: a template that recurses forever overflows its stack (SIGSEGV, when `run` renders it), a
long Jinja comment crashes it when the tokenizer is created, and its time grows with the square
of a template's statements (`size_limits.CHAT_TEMPLATE_BYTES` says how much). So a template
above that bound is refused, wherever it is read (the checkpoint's when `package` copies it, a
bundle's for `validate`, `run` and `chat`), and `check_chat_template` renders the template with
og's own tokenizer in a child process (`_template_child`): a crash or a hang there is one
BundleError, reported by `validate` (and so by `package`) and raised by `run` and `chat`
before their own process renders it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mobius_genai._child_process import ask_child, said_by, signal_words
from mobius_genai._json import read_json
from mobius_genai.config.limits import check_chat_template_size
from mobius_genai.errors import BundleError, MobiusError

#: Where a chat template may be, in the order `run` and `chat` look.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
#: Seconds the child may take: onnxruntime-genai loads and renders a template at the size
#: bound in ~10 s on one loaded core; a template that loops (`range(10**8)`) stalls for good.
RENDER_SECONDS = 60

_CHILD = "mobius_genai.bundle._template_child"


def chat_template(folder: str | Path, error: type[MobiusError] = BundleError) -> str | None:
    """The chat template `run` and `chat` render: the first of CHAT_TEMPLATE_FILES in `folder`
    that holds one (of a list of named ones, "default"), None when none does. Every template
    of those files must be within CHAT_TEMPLATE_BYTES, else `error` names the file and the bound,
    as it does a file that cannot be read."""
    found = None
    for name in CHAT_TEMPLATE_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        default, every = _file_templates(path, error)
        for template in every:
            check_chat_template_size(template, str(path), error)
        if found is None and (default or name.endswith(".jinja")):
            found = default
    return found


def check_template_file(path: Path, label: str, error: type[MobiusError]) -> None:
    """Every chat template of the file `path` (one of CHAT_TEMPLATE_FILES, named `label` in the
    error) within CHAT_TEMPLATE_BYTES; a file that cannot be read is the tokenizer checks' to
    report (`validate.check_tokenizer`)."""
    try:
        _, every = _file_templates(path, BundleError)
    except BundleError:
        return
    for template in every:
        check_chat_template_size(template, label, error)


def _file_templates(path: Path, error: type[MobiusError]) -> tuple[str | None, list[str]]:
    """The template `run` renders of one of CHAT_TEMPLATE_FILES, and every template it holds;
    `error` when it cannot be read."""
    if path.suffix == ".jinja":
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as cause:
            raise error(f"{path}: not readable as UTF-8 text ({cause})") from cause
        return text, [text]
    document = read_json(path, error, str(path))
    template = document.get("chat_template") if isinstance(document, dict) else None
    if isinstance(template, str):
        return template, [template]
    if not isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        return None, []
    named = {
        entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)
    }
    default = named.get("default")
    every = [text for text in named.values() if isinstance(text, str)]
    return (default if isinstance(default, str) else None), every


def check_chat_template(folder: str | Path) -> str | None:
    """`chat_template(folder)`, first rendered by onnxruntime-genai's tokenizer in a process of
    its own, as `run` (one user message) and `chat` (turns after a system message) render it in
    theirs; a BundleError when that crashes or hangs (or the template is above
    CHAT_TEMPLATE_BYTES). onnxruntime-genai's own errors are `run`'s and `chat`'s to say."""
    template = chat_template(folder)
    if template:
        _render_elsewhere(Path(folder), template)
    return template


def _render_elsewhere(folder: Path, template: str) -> None:
    request = {"folder": str(folder), "template": template, "parent": os.getpid()}
    try:
        returncode, stdout, stderr = ask_child(_CHILD, request, timeout=RENDER_SECONDS)
    except TimeoutError:
        raise BundleError(
            f"{folder}: onnxruntime-genai did not finish rendering the chat template within "
            f"{RENDER_SECONDS} s; accepted: a template it renders in seconds"
        ) from None
    try:
        if json.loads(stdout)["rendered"] is True:
            return
    except (ValueError, KeyError, TypeError):
        pass
    phases, said = said_by(stderr.decode(errors="replace"))
    doing = f" while {phases[-1]}" if phases else ""
    last = f"; its last output: {said[-1]}" if said else ""
    if returncode >= 0:
        raise BundleError(
            f"{folder}: the process rendering the chat template failed (exit code "
            f"{returncode}){doing}{last}"
        )
    raise BundleError(
        f"{folder}: the chat template crashed onnxruntime-genai's template engine "
        f"({signal_words(returncode)}){doing}{last}; accepted: a template onnxruntime-genai "
        "renders"
    )
