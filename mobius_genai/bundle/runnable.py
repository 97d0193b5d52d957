"""Where a bundle can run, from the EP table: what onnxruntime's CPU provider computes (the `cpu`
entry's `model_dtypes`), and which EPs and wheels run what it cannot.

`package` skips its smoke test with this reason instead of failing, `validate` adds it to its
verdict, and `run` says it instead of onnxruntime's "Could not find an implementation".
"""

from __future__ import annotations

import onnx_ir as ir

from mobius_genai.bundle.graph import GraphInfo, layer_names
from mobius_genai.ep import HOST_EP, EpCapabilities, RuntimeInfo, ep_registry, get_ep
from mobius_genai.ep.capabilities import ALL_MODEL_DTYPES
from mobius_genai.target import precision_of


def graph_dtype(graph: GraphInfo) -> ir.DataType | None:
    """The model dtype of a decoder graph: its KV cache's (else its logits'), None if unknown."""
    past = layer_names(graph.inputs, "key")
    spec = graph.inputs.get(past.pattern % past.indices[0]) if past else None
    spec = spec or graph.outputs.get("logits")
    try:
        return None if spec is None else ir.DataType(spec.elem_type)
    except ValueError:
        return None


def cpu_refusal(graph: GraphInfo) -> str | None:
    """Why onnxruntime's CPU provider cannot run `graph` and what can, or None when it can."""
    return dtype_refusal(graph_dtype(graph))


def dtype_refusal(dtype: ir.DataType | None) -> str | None:
    """Why onnxruntime's CPU provider cannot run a bundle of `dtype` and what can, or None."""
    cpu = get_ep(HOST_EP)
    if dtype is None or dtype in cpu.model_dtypes or dtype not in ALL_MODEL_DTYPES:
        return None
    name = precision_of(dtype)
    runners = [caps for caps in ep_registry.entries() if _runs(caps, dtype)]
    where = (
        "; ".join(f"{caps.name} ({runs_with(caps.runtime)})" for caps in runners)
        or "no registered EP"
    )
    on_cpu = " or ".join(precision_of(d) for d in sorted(cpu.model_dtypes, key=lambda d: d.value))
    return (
        f"onnxruntime's CPU provider has no {name} kernels, so this {name} bundle does not run "
        f"on CPU; it runs with an EP that has them: {where} (`mobius-genai run BUNDLE --ep EP` "
        f"there), or package it as {on_cpu} to run it on CPU"
    )


def _runs(caps: EpCapabilities, dtype: ir.DataType) -> bool:
    return dtype in caps.model_dtypes and caps.runtime.genai_provider is not None


def runs_with(runtime: RuntimeInfo | str) -> str:
    """What a user installs to run an EP's bundles (`runtime`, or a bare provider name)."""
    package = runtime.package if isinstance(runtime, RuntimeInfo) else None
    if package is not None:
        return f"`pip install {package}`"
    provider = runtime.genai_provider if isinstance(runtime, RuntimeInfo) else runtime
    return f"an onnxruntime-genai build with the {provider} provider"
