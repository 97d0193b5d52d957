"""The gguf package is imported for a GGUF argument only: a safetensors package or build
does not pay its import (`checkpoint/opening.py`)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TINY_QWEN2


def test_opening_a_safetensors_checkpoint_imports_no_gguf():
    code = (
        "import sys; from mobius_genai.checkpoint.opening import open_checkpoint, stored_bits; "
        f"stored_bits({str(TINY_QWEN2)!r}); open_checkpoint({str(TINY_QWEN2)!r}); "
        "import mobius_genai.packager, mobius_genai.cli._package; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'gguf' or '.gguf' in m))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
