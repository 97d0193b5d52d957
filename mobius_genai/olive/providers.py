"""Olive's execution provider names (onnxruntime's) → mobius-genai EP names.

Kept free of Olive imports so the mapping can be read and tested without olive-ai installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mobius_genai.errors import ExecutionProviderError

#: onnxruntime EP name, as an Olive accelerator lists it → mobius-genai EP name.
OLIVE_TO_MOBIUS_EP: Mapping[str, str] = MappingProxyType(
    {
        "CPUExecutionProvider": "cpu",
        "CUDAExecutionProvider": "cuda",
        "DmlExecutionProvider": "dml",
        "WebGpuExecutionProvider": "webgpu",
        "NvTensorRTRTXExecutionProvider": "trt-rtx",
        "MLXExecutionProvider": "mlx",
    }
)

_BY_LOWER = {name.lower(): ours for name, ours in OLIVE_TO_MOBIUS_EP.items()}


def mobius_ep_for(olive_ep: str | None) -> str:
    """The mobius-genai EP for an Olive accelerator's EP; "cpu" when the accelerator names none.

    An EP without a counterpart (TensorRT, OpenVINO, QNN, ...) raises ExecutionProviderError (a
    ValueError): guessing would build a graph with ops that EP may not run.
    """
    if olive_ep is None or str(olive_ep) == "":
        return "cpu"
    ours = _BY_LOWER.get(str(olive_ep).lower())
    if ours is None:
        raise ExecutionProviderError(
            f"MobiusExport: the workflow's execution provider {str(olive_ep)!r} has no mobius-genai "
            f"counterpart; accepted: {', '.join(OLIVE_TO_MOBIUS_EP)}, or set the pass's `ep` "
            "option (see `mobius-genai eps`, e.g. 'default' for portable ONNX)"
        )
    return ours
