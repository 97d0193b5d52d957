"""Optimizing a model keeps no reference to it: the model and the checkpoint it maps can go.

A rule's pattern object kept at module level remembers the last graph it matched; such a
reference kept a packaged model alive, with the memory map of its checkpoint, after packaging.
"""

from __future__ import annotations

import gc
import weakref

import onnx_ir as ir
import pytest

from mobius_genai.optimize import optimize_model
from tests.optimize._graphs import tiny_config, tiny_decoder


@pytest.mark.parametrize("ep", ["cpu", "cuda", "webgpu", "default"])
def test_optimized_model_is_freed_once_dropped(ep: str):
    model, _ = tiny_decoder(tiny_config(num_hidden_layers=2))
    report = optimize_model(model, ep, ir.DataType.FLOAT16 if ep == "cuda" else ir.DataType.FLOAT)
    if ep in ("cpu", "cuda", "webgpu"):
        assert report.rules["GQAFusion"].matched == 2  # the mask pattern was matched
    graph = weakref.ref(model.graph)
    del model
    gc.collect()
    assert graph() is None
