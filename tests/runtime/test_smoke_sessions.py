"""The smoke test's sessions: weight prepacking off for float graphs, on for MatMulNBits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import mobius_genai.runtime
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import HOST_EP, get_ep
from mobius_genai.runtime.ort_session import ort_session
from mobius_genai.runtime.smoke import session_options, smoke_test


def test_float_bundle_is_smoke_tested_without_prepacking(packaged):
    folder = packaged("cpu")
    assert session_options(folder, read_genai_config(folder)) == {"session.disable_prepacking": "1"}


def test_int4_bundle_keeps_prepacking_and_still_matches_onnxruntime(tiny_int4):
    folder = tiny_int4
    assert session_options(folder, read_genai_config(folder)) == {}
    result = smoke_test(folder, get_ep("cpu"))
    assert "same as a plain onnxruntime loop" in result.note


def test_the_reference_loops_open_their_sessions_in_one_place():
    """smoke_image, smoke_audio and _smoke_child open every graph through ort_session."""
    runtime = Path(mobius_genai.runtime.__file__).parent
    opening = sorted(
        path.name for path in runtime.rglob("*.py") if "InferenceSession(" in path.read_text()
    )
    assert opening == ["ort_session.py"]


def test_ort_session_lays_the_config_entries_over_the_session(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    entries = {"session.disable_prepacking": "1"}
    session = ort_session(path, entries, get_ep(HOST_EP).runtime.ort_provider)
    options = session.get_session_options()
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    assert session.run(None, {"x": np.ones(1, np.float32)})[0].tolist() == [1.0]
