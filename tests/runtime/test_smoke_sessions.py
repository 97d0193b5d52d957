"""The smoke test's sessions: weight prepacking off for float graphs, on for MatMulNBits."""

from __future__ import annotations

from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import get_ep
from mobius_genai.runtime.smoke import session_options, smoke_test


def test_float_bundle_is_smoke_tested_without_prepacking(packaged):
    folder = packaged("cpu")
    assert session_options(folder, read_genai_config(folder)) == {"session.disable_prepacking": "1"}


def test_int4_bundle_keeps_prepacking_and_still_matches_onnxruntime(tiny_int4):
    folder = tiny_int4
    assert session_options(folder, read_genai_config(folder)) == {}
    result = smoke_test(folder, get_ep("cpu"))
    assert "same as a plain onnxruntime loop" in result.note
