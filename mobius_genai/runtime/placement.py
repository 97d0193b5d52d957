"""Which provider `run`, `chat` and `bench` use for a bundle, and what to tell the user when it
cannot run here.

A bundle runs on the providers its genai_config names, or on those of the EP `--ep` names
(`provider_of`, laid over the bundle's config in memory: the files are not changed). A graph
whose dtype onnxruntime's CPU provider has no kernels for is refused before loading
(`runnable.cpu_refusal`); a provider this onnxruntime-genai lacks becomes one line naming the
wheel that runs the bundle (from its EP's `RuntimeInfo`) and offering `--ep cpu`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai.bundle._og_errors import PROVIDER_UNAVAILABLE
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.runnable import cpu_refusal, runs_with
from mobius_genai.ep import HOST_EP, ep_registry, get_ep
from mobius_genai.errors import BundleError

#: onnxruntime-genai's provider name (None: CPU) and its options, replacing a bundle's.
Provider = tuple[str | None, Mapping[str, str]]


def provider_of(ep: str) -> Provider:
    """The provider of the EP named `ep` (any name `--ep` takes) with its default options."""
    caps = get_ep(ep)
    return caps.runtime.genai_provider, dict(caps.provider_options)


def bundle_providers(config: Mapping[str, Any]) -> list[str]:
    """The provider names the bundle's genai_config asks for (empty: CPU)."""
    decoder = config["model"]["decoder"]
    entries = decoder.get("session_options", {}).get("provider_options", [])
    return [name for entry in entries for name in entry]


def require_runnable(
    folder: str | Path, config: Mapping[str, Any], provider: Provider | None
) -> None:
    """BundleError saying what runs the bundle when it would run on CPU (its own providers, or
    `provider` instead), whose kernels lack its dtype."""
    on_cpu = provider[0] is None if provider is not None else not bundle_providers(config)
    if not on_cpu:
        return
    refusal = _refusal(folder, config)
    if refusal is not None:
        raise BundleError(f"{folder}: {refusal}")


def missing_provider(
    folder: str | Path, config: Mapping[str, Any], cause: str, command: str
) -> str | None:
    """When og's error `cause` says the bundle's provider is missing: one line naming the wheel
    that runs the bundle and offering `mobius-genai COMMAND FOLDER --ep cpu` (or saying what
    runs the graph where CPU cannot); None for any other error."""
    names = bundle_providers(config)
    if not names or not PROVIDER_UNAVAILABLE.search(cause):
        return None
    caps = ep_registry.by_genai_provider(names[0])
    ep = caps.name if caps is not None else names[0]
    wheel = runs_with(caps.runtime) if caps is not None else runs_with(names[0])
    instead = _refusal(folder, config) or (
        f"to run it on CPU here: `mobius-genai {command} {folder} --ep {HOST_EP}`"
    )
    return (
        f"{folder}: a bundle for the {ep} execution provider, which this onnxruntime-genai "
        f"cannot run; it runs with {wheel}; {instead}"
    )


def _refusal(folder: str | Path, config: Mapping[str, Any]) -> str | None:
    try:
        graph = GraphInfo.from_file(Path(folder) / config["model"]["decoder"]["filename"])
    except BundleError:
        return None  # loading it reports the problem
    return cpu_refusal(graph)
