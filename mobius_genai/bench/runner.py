"""Measure a bundle for each (prompt length, batch size): one process per configuration.

Each process loads the bundle, warms up, then generates `new_tokens` tokens `rounds` times
after a random prompt of the configuration's length and batch size (greedy, never stopping
early); a row holds the medians and the process's peak resident memory.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mobius_genai._child_process import ask_child
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.errors import BundleError, OptionError

_CHILD = "mobius_genai.bench._child"


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """Medians of one configuration's rounds; rates count the tokens of the whole batch."""

    prompt_length: int
    batch_size: int
    ttft_ms: float
    prefill_tps: float
    decode_tps: float
    peak_rss_mib: float | None
    """Peak resident memory of the configuration's process (model loading included; memory
    of a GPU not counted); None where the system does not report it."""
    load_s: float
    acceptance: float | None = None
    """The MTP head's drafts the main model accepted, per draft it evaluated (og.MtpGenerator);
    None without a head."""


def bench(
    folder: str | Path,
    *,
    prompt_lengths: Sequence[int],
    batch_sizes: Sequence[int],
    new_tokens: int = 32,
    rounds: int = 3,
    cpu: bool = False,
    threads: int | None = None,
    adapter: str | None = None,
    mtp: bool = True,
) -> list[BenchRow]:
    """One BenchRow per (prompt length, batch size), prompt lengths first; `cpu` runs the
    bundle's graph on the CPU provider, `threads` sets onnxruntime's intra-op threads, `adapter`
    names the LoRA adapter the generations run with; a bundle's MTP head drafts at batch 1
    unless `mtp` is False (the row's `acceptance` says how often the main model agreed)."""
    config = read_genai_config(Path(folder))
    if "vocab_size" not in config["model"]:
        raise BundleError(
            f"{folder}: genai_config.json has no model.vocab_size; bench draws its prompts' "
            "tokens below it"
        )
    max_length = int(config.get("search", {}).get("max_length", config["model"]["context_length"]))
    if new_tokens < 2:
        raise OptionError(f"new tokens {new_tokens}: too few; accepted: 2 or more")
    for length in prompt_lengths:
        if length + new_tokens > max_length:
            raise OptionError(
                f"prompt length {length}: with {new_tokens} new tokens it needs {length + new_tokens} "
                f"tokens, {folder} holds {max_length} (search.max_length); accepted: prompt "
                f"lengths up to {max_length - new_tokens}"
            )
    request = {
        "folder": str(folder),
        "cpu": cpu,
        "threads": threads,
        "adapter": adapter,
        "mtp": mtp,
        "vocab_size": config["model"]["vocab_size"],
        "new_tokens": new_tokens,
        "rounds": rounds,
    }
    return [
        _row(length, batch, _measured({**request, "prompt_length": length, "batch_size": batch}))
        for length in prompt_lengths
        for batch in batch_sizes
    ]


def _measured(request: dict[str, Any]) -> dict[str, Any]:
    """The child's answer to `request`; its error, crash or death is a BundleError."""
    returncode, stdout, stderr = ask_child(_CHILD, request)
    try:
        answer = json.loads(stdout)
    except ValueError:
        said = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
        what = f"; its last output: {said[-1].strip()}" if said else ""
        raise BundleError(
            f"{request['folder']}: bench's process for prompt length {request['prompt_length']}, "
            f"batch size {request['batch_size']} failed (exit code {returncode}){what}"
        ) from None
    if "error" in answer:
        raise BundleError(answer["error"])
    return answer


def _row(length: int, batch: int, answer: dict[str, Any]) -> BenchRow:
    def median(key: str) -> float:
        return statistics.median(result[key] for result in answer["rounds"])

    return BenchRow(
        prompt_length=length,
        batch_size=batch,
        ttft_ms=median("ttft_s") * 1000,
        prefill_tps=median("prefill"),
        decode_tps=median("decode"),
        peak_rss_mib=answer["peak_rss_mib"],
        load_s=answer["load_s"],
        acceptance=median("acceptance") if "acceptance" in answer["rounds"][0] else None,
    )
