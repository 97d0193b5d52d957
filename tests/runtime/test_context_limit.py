"""Past the end of the cos/sin tables: a clear error from the runtime, never a crash."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import onnxruntime_genai as og
import pytest

import mobius_genai
from tests.conftest import TINY_QWEN2

CONTEXT = 24


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    return {
        ep: mobius_genai.package(TINY_QWEN2, ep, root / ep, context_length=CONTEXT, quiet=True)
        for ep in ("default", "cpu")
    }


@pytest.mark.parametrize("ep", ["default", "cpu"])
def test_onnxruntime_rejects_positions_past_the_table(bundles, ep):
    session = ort.InferenceSession(
        str(bundles[ep] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    total = CONTEXT + 8
    feeds = {
        "input_ids": np.ones((1, total), np.int64),
        "attention_mask": np.ones((1, total), np.int64),
    }
    for info in session.get_inputs():
        if info.name == "position_ids":
            feeds[info.name] = np.arange(total, dtype=np.int64)[None]
        elif info.name.startswith("past_key_values."):
            feeds[info.name] = np.zeros((1, info.shape[1], 0, info.shape[3]), np.float32)
    with pytest.raises(Exception, match=r"(?i)cos_cache|indices|out of (range|bounds)|invalid"):
        session.run(None, feeds)
    # the same session still serves requests inside the window afterwards
    inside = {k: (v[:, :CONTEXT] if v.ndim == 2 else v) for k, v in feeds.items()}
    logits = session.run(["logits"], inside)[0]
    assert np.isfinite(logits).all()


def test_genai_generates_to_the_last_position_and_refuses_more(bundles):
    model = og.Model(str(bundles["cpu"]))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT)
    generator = og.Generator(model, params)
    generator.append_tokens([[5, 6, 7]])
    while not generator.is_done():
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) == CONTEXT
    too_long = og.GeneratorParams(model)
    with pytest.raises(Exception, match="context_length"):
        too_long.set_search_options(max_length=CONTEXT + 1)
        og.Generator(model, too_long)
