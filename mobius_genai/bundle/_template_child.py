"""The chat template check's own process: onnxruntime-genai's tokenizer renders a template as
`run` and `chat` would (`chat_template.check_chat_template` starts it and reads its answer).

Only onnxruntime-genai is imported here. A crash of its template engine (an endless recursion
overflows its stack) ends this process, not the one that asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import onnxruntime_genai as og

from mobius_genai._child_process import PHASE_PREFIX, exit_with_parent

#: The conversations rendered: `run`'s (one user message) and `chat`'s (turns after a system
#: message), each with the generation prompt.
CONVERSATIONS = (
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a story."},
    ],
)


def render(folder: str, template: str) -> None:
    """Render `template` with onnxruntime-genai's tokenizer of the bundle in `folder`, for each
    of CONVERSATIONS. onnxruntime-genai's errors (a tokenizer it cannot load, a template it
    cannot render or that raises for a system message) are left for `run` and `chat` to say."""
    _phase("creating the tokenizer")
    try:
        tokenizer = og.Tokenizer(folder)
    except RuntimeError:
        return
    _phase("rendering the chat template")
    for messages in CONVERSATIONS:
        with contextlib.suppress(RuntimeError):
            tokenizer.apply_chat_template(
                json.dumps(messages), template_str=template, add_generation_prompt=True
            )


def _phase(text: str) -> None:
    print(f"{PHASE_PREFIX}{text}", file=sys.stderr, flush=True)


def main() -> None:
    """Answer one request read from stdin on stdout: {"rendered": true} once rendered."""
    request = json.loads(sys.stdin.read())
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # native output must not mix in
    exit_with_parent(request["parent"])
    render(request["folder"], request["template"])
    with answers:
        json.dump({"rendered": True}, answers)


if __name__ == "__main__":
    main()
