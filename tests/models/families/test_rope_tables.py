"""The cos/sin tables of float16 and bfloat16 graphs: computed in float and stored in the
graph's dtype, as transformers computes them in float32 and casts them to the model's dtype
(Cohere2RotaryEmbedding as LlamaRotaryEmbedding). cohere2's interleaved tables hold one
column per channel pair, transformers' repeat_interleave'd cos and sin every other column.
Within one rounding step of the stored dtype (float64 angles here, float32 there).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from transformers.models.cohere2.modeling_cohere2 import Cohere2RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from mobius_genai.build import build
from tests._hf import tiny_config, write_tiny_checkpoint

_ROTARY = {"llama": LlamaRotaryEmbedding, "cohere2": Cohere2RotaryEmbedding}
_DTYPES = {
    "fp16": (ir.DataType.FLOAT16, torch.float16),
    "bf16": (ir.DataType.BFLOAT16, torch.bfloat16),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("rope")
    return {family: write_tiny_checkpoint(tmp / family, family) for family in _ROTARY}


def _transformers_tables(family: str, length: int, dtype: torch.dtype) -> tuple[np.ndarray, ...]:
    """transformers' cos and sin of positions 0..length-1 in `dtype`, one column per pair."""
    rotary = _ROTARY[family](tiny_config(family))
    positions = torch.arange(length)[None]
    cos, sin = rotary(torch.zeros(1, dtype=dtype), positions)
    # llama's tables repeat the pairs' half (cat), cohere2's interleave them
    columns = slice(0, cos.shape[-1] // 2) if family == "llama" else slice(0, None, 2)
    return tuple(t[0, :, columns].float().numpy() for t in (cos, sin))


@pytest.mark.parametrize("family", sorted(_ROTARY))
@pytest.mark.parametrize(("ep", "dtype"), [("cpu", "fp16"), ("cuda", "bf16")])
def test_tables_are_transformers_float32_tables_cast(checkpoints, family, ep, dtype):
    stored, torch_dtype = _DTYPES[dtype]
    model = build(checkpoints[family], ep, dtype, load_weights=False, progress=False)
    graph = model.models["model"].graph
    tables = [graph.initializers[f"model.rotary_emb.{name}_cache"] for name in ("cos", "sin")]
    assert [table.dtype for table in tables] == [stored, stored]
    length = tables[0].shape[0]
    reference = _transformers_tables(family, length, torch_dtype)
    step = float(torch.finfo(torch_dtype).eps) / 2  # one rounding step of values below 1
    for table, expected in zip(tables, reference, strict=True):
        ours = table.const_value.numpy().astype(np.float32)
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours, expected, rtol=0, atol=step)
