"""Commands that need neither the graph-building stack nor Olive's own import start fast:
`olive-config` reads Olive's registry file without importing olive (which imports torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

_HEAVY = ("olive", "torch", "onnx", "onnx_ir", "onnxruntime", "onnxscript")


def test_olive_config_imports_neither_olive_nor_torch(tmp_path):
    path = tmp_path / "mobius-olive.json"
    code = (
        "import sys; from mobius_genai.cli import main; "
        f"code = main(['olive-config', '-o', {str(path)!r}]); "
        f"print([name for name in {_HEAVY!r} if name in sys.modules]); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
    assert "MobiusExport" in json.loads(path.read_text())["passes"]
