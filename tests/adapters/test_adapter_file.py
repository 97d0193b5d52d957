"""The .onnx_adapter file holds A and B in the graph's float dtype (fp16 for a GPU bundle)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from mobius_genai.bundle.adapters import write_adapter
from mobius_genai.checkpoint.peft import read_peft_adapter


@pytest.mark.parametrize(("elem_type", "dtype"), [(1, np.float32), (10, np.float16)])
def test_adapter_written_in_the_graph_dtype(qwen2_lora, tmp_path, elem_type, dtype):
    adapter = read_peft_adapter(qwen2_lora.adapters["r4"])
    inputs = {}
    for module, pair in adapter.pairs.items():
        inputs[f"{module}.lora_A"] = (elem_type, [pair.a.shape[0], "lora_rank"])
        inputs[f"{module}.lora_B"] = (elem_type, ["lora_rank", pair.b.shape[1]])
    out = tmp_path / "a.onnx_adapter"
    entry = write_adapter(adapter, inputs, lambda module: module, out)
    assert entry == {"rank": 4, "targets": adapter.targets, "modules": len(adapter.pairs)}
    stored = ort.AdapterFormat.read_adapter(str(out))
    params = {name: value.numpy().copy() for name, value in stored.get_parameters().items()}
    assert sorted(params) == sorted(inputs)
    module = "model.layers.0.self_attn.k_proj"
    assert params[f"{module}.lora_B"].dtype == dtype
    np.testing.assert_allclose(
        params[f"{module}.lora_B"], adapter.pairs[module].b.astype(dtype), rtol=0
    )
