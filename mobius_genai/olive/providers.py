"""Olive's execution provider names (onnxruntime's) → mobius-genai EP names, from the registry.

An EP is an Olive target when its entry declares an onnxruntime name
(`RuntimeInfo.ort_provider`); an EP registered at runtime joins the mapping. Kept free of Olive
imports so the mapping can be read and tested without olive-ai installed.
"""

from __future__ import annotations

from mobius_genai.ep import HOST_EP, ep_registry
from mobius_genai.errors import ExecutionProviderError

#: The EP built for when the workflow's accelerator names no execution provider.
NO_PROVIDER_EP = HOST_EP


def olive_ep_mapping() -> dict[str, str]:
    """onnxruntime EP name, as an Olive accelerator lists it → mobius-genai EP name."""
    return {
        caps.runtime.ort_provider: caps.name
        for caps in ep_registry.entries()
        if caps.runtime.ort_provider is not None
    }


def mobius_ep_for(olive_ep: str | None) -> str:
    """The mobius-genai EP for an Olive accelerator's EP (any case); "cpu" when it names none.

    An EP without a counterpart (TensorRT, OpenVINO, QNN, ...) raises ExecutionProviderError (a
    ValueError): guessing would build a graph with ops that EP may not run.
    """
    if olive_ep is None or str(olive_ep) == "":
        return NO_PROVIDER_EP
    caps = ep_registry.by_ort_provider(str(olive_ep))
    if caps is None:
        raise ExecutionProviderError(
            f"MobiusExport: the workflow's execution provider {str(olive_ep)!r} has no mobius-genai "
            f"counterpart; accepted: {', '.join(olive_ep_mapping())}, or set the pass's `ep` "
            "option (see `mobius-genai eps`, e.g. 'default' for portable ONNX)"
        )
    return caps.name
