"""Smoke test of a written bundle: onnxruntime-genai loads it and generates a few tokens.

The test runs in a process of its own (`_smoke_child`, which says what it checks): a native
crash in onnxruntime-genai or onnxruntime ends that process, and here it becomes a BundleError
naming the signal and what the process was doing, so `package` still removes its staging
folder. Ctrl-C or SIGTERM here kills the process before the error travels on.

The test checks the bundle, not onnxruntime's kernels, and is kept cheap: for graphs without
MatMulNBits both sessions run with ORT's weight prepacking off (``session.disable_prepacking``):
the weights are then read from the mapped external data file as they are used instead of being
copied into packed buffers first, which for a float model takes longer than generating the
tokens. MatMulNBits keeps prepacking: its unpacked fallback dequantizes every weight on every
call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mobius_genai._child_process import PHASE_PREFIX, ask_child, said_by, signal_words
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.runnable import cpu_refusal
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import HOST_EP, EpCapabilities, get_ep
from mobius_genai.errors import BundleError

#: Ops whose CPU kernels need prepacked weights to run at a usable speed.
_NEEDS_PREPACKING = frozenset({"com.microsoft::MatMulNBits"})
_NO_PREPACKING = {"session.disable_prepacking": "1"}

_CHILD = "mobius_genai.runtime._smoke_child"
#: Lines of the process's stderr a crash message quotes, at most.
_QUOTED_LINES = 3


@dataclasses.dataclass(frozen=True)
class SmokeResult:
    """Whether the smoke test ran, the tokens generated and a one-line note for the user."""

    ran: bool
    note: str
    tokens: tuple[int, ...] = ()
    mtp: dict[str, Any] | None = None
    """og.MtpGenerator's run on the same prompt (`runtime.mtp.smoke_mtp`), for a bundle with
    an MTP head."""


def smoke_test(
    folder: str | Path,
    ep: EpCapabilities,
    *,
    max_new_tokens: int = 8,
    on_step: Callable[[str], None] | None = None,
) -> SmokeResult:
    """Load the bundle in `folder` with onnxruntime-genai and generate `max_new_tokens` greedily,
    in a process of its own.

    On CPU the tokens must equal a plain onnxruntime loop's, and every step's logits must be
    finite. A bundle for an EP missing here runs its graph on CPU instead (genai's providers
    cleared), where the graph's ops allow; otherwise the test is skipped with a note, as it is
    for a graph whose dtype onnxruntime's CPU provider has no kernels for (`cpu_refusal`).
    `on_step` is told each step the process takes as it takes it ("generating").
    """
    folder = Path(folder)
    config = read_genai_config(folder)
    graph = _graph(folder, config)
    refusal = None if graph is None else cpu_refusal(graph)
    if refusal is not None and ep.runtime.genai_provider is None:  # it would run on CPU
        return SmokeResult(False, f"smoke test skipped: {refusal}")
    request = {
        "folder": str(folder),
        "ep": ep.name,
        "genai_provider": ep.runtime.genai_provider,
        "cpu_provider": get_ep(HOST_EP).runtime.ort_provider,
        "session_options": session_options(folder, config),
        "cpu_refusal": refusal,
        "max_new_tokens": max_new_tokens,
        "parent": os.getpid(),
    }
    answer = _run_child(request, folder, on_step)
    if "error" in answer:
        raise BundleError(answer["error"])
    return SmokeResult(
        answer["ran"], answer["note"], tuple(answer.get("tokens", ())), answer.get("mtp")
    )


def session_options(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """ORT config entries for the smoke test's sessions: prepacking off unless an op needs it.

    An unreadable graph gets the defaults: loading it then fails with onnxruntime-genai's error.
    """
    graph = _graph(folder, config)
    if graph is None:
        return {}
    return {} if graph.ops & _NEEDS_PREPACKING else dict(_NO_PREPACKING)


def _graph(folder: Path, config: Mapping[str, Any]) -> GraphInfo | None:
    try:
        return GraphInfo.from_file(folder / config["model"]["decoder"]["filename"])
    except BundleError:
        return None


def _run_child(
    request: Mapping[str, Any], folder: Path, on_step: Callable[[str], None] | None
) -> dict[str, Any]:
    """The child's answer to `request`; a child that crashes or dies is a BundleError. Its
    stderr is read as it comes, so `on_step` hears of each step when it starts."""

    def on_line(line: str) -> None:
        if on_step is not None and line.startswith(PHASE_PREFIX):
            on_step(line.removeprefix(PHASE_PREFIX).strip())

    returncode, stdout, stderr = ask_child(_CHILD, request, on_line)
    try:
        return json.loads(stdout)
    except ValueError:
        failure = _failure(folder, returncode, stderr.decode(errors="replace"))
        raise BundleError(failure) from None


def _failure(folder: Path, returncode: int, stderr: str) -> str:
    """What to tell the user about a smoke test process that gave no answer."""
    phases, said = said_by(stderr)
    said = said[-_QUOTED_LINES:]
    doing = f" while {phases[-1]}" if phases else ""
    if returncode < 0:
        what = f"the smoke test crashed onnxruntime-genai ({signal_words(returncode)}){doing}"
        if -returncode == signal.SIGKILL:
            what += "; the system kills a process this way when memory runs out"
    else:
        what = f"the smoke test's process failed (exit code {returncode}){doing}"
    output = f"; its last output: {' | '.join(said)}" if said else "; it printed nothing"
    return f"{folder}: {what}{output}"
