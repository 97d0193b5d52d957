"""README.md's og.Engine example runs as written on a packaged bundle, and each request gets
the tokens og.Generator gives its prompt alone."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from tests.runtime._og import alone

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    section = README.read_text().split("### Serving with og.Engine", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_engine_example(dense):
    code = _example()
    assert 'og.Model("out/qwen-cpu")' in code
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace("out/qwen-cpu", str(dense.bundle)), namespace)
    model = og.Model(str(dense.bundle))
    tokenizer = og.Tokenizer(model)
    for prompt, reply in zip(namespace["prompts"], namespace["replies"], strict=True):
        ids = [int(t) for t in tokenizer.encode(prompt)]
        assert reply == alone(model, ids, 16)
        text = tokenizer.decode(np.asarray(reply, dtype=np.int32))
        assert f"{prompt} {text}" in printed.getvalue()
