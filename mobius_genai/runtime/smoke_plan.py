"""Which smoke test `package` runs: the bundle itself, or its twin with fewer layers.

Running a bundle costs a multiple of its size in memory, most of all where its EP is missing and
its graph runs on CPU: onnxruntime's CPU kernels compute float16 as float32 and keep a float32
copy of every float16 weight next to the original. A 7B float16 bundle for CUDA (14 GiB) would
need ~40 GiB on a CPU-only machine. So the whole bundle is run only where its estimated peak
(`memory_needed`) fits a share of the memory available; otherwise `package` builds a twin from
the same checkpoint through the same code (config, graph, EP pipeline, precision, int4,
genai_config, tokenizer files) with only the first layers that hold every kind of layer
(`ArchitectureConfig.layers_of_every_kind`), runs that, and deletes it. The manifest and the
card say which test ran.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json, write_json
from mobius_genai.bundle.bos import required_bos
from mobius_genai.bundle.card import CARD_FILENAME, graph_sections, render_card
from mobius_genai.bundle.genai_config import CONFIG_FILENAME
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.manifest import MANIFEST_FILENAME, file_entries
from mobius_genai.bundle.schema import validate_manifest
from mobius_genai.ep import EpCapabilities
from mobius_genai.errors import BundleError
from mobius_genai.runtime.smoke import SmokeResult, smoke_test

#: Peak memory of the smoke test's process per byte of the bundle's model files, by precision,
#: on CPU, and its peak for a bundle of almost no weights (Python, onnxruntime, genai): measured
#: with benchmarks/smoke_memory.py (benchmarks/README.md, "Smoke test memory"; largest factors
#: seen: fp32 0.97, fp16 2.59, int4 1.67), plus 5% and rounded up. bf16 graphs have no CPU
#: kernels to measure; they count as fp16; int8 (a source's 8-bit integers kept in
#: MatMulNBits, the same kernels as int4) counts as int4.
MEMORY_PER_BYTE: Mapping[str, float] = {
    "fp32": 1.1,
    "fp16": 2.8,
    "bf16": 2.8,
    "int4": 1.8,
    "int8": 1.8,
}
BASE_MEMORY = 170 << 20
#: The whole bundle is run when its estimated peak is within this share of the available memory;
#: packaging should not crowd out the rest of the machine.
FULL_SHARE = 0.25
#: The twin's folder inside the staging folder (deleted after the test).
TWIN_FOLDER = ".smoke-twin"
_MEMINFO = Path("/proc/meminfo")


@dataclasses.dataclass(frozen=True)
class SmokePlan:
    """The layers the smoke test runs (`layers` of `of`), and why not all of them."""

    layers: int
    of: int
    reason: str = ""
    vision_layers: tuple[int, int] | None = None  # a vision-language twin's (layers, of)

    @property
    def whole(self) -> bool:
        return self.layers == self.of


def available_memory(meminfo: Path = _MEMINFO) -> int | None:
    """Bytes of memory available to a new process: /proc/meminfo's MemAvailable on Linux, else
    the free physical pages the OS reports (`os.sysconf`); None when neither is known."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def model_bytes(folder: Path) -> int:
    """Size of the bundle's graphs (a vision-language bundle's vision, embedding and decoder,
    all run by the smoke test) and their external data files."""
    model = read_json(Path(folder) / CONFIG_FILENAME, BundleError, CONFIG_FILENAME)["model"]
    graphs = {Path(folder) / model[section]["filename"] for section in graph_sections(model)}
    data = {
        graph.parent / name for graph in graphs for name in GraphInfo.from_file(graph).external_data
    }
    return sum(path.stat().st_size for path in graphs | data)


def memory_needed(size: int, precision: str) -> int:
    """Estimated peak of the smoke test's process for model files of `size` bytes."""
    return BASE_MEMORY + int(MEMORY_PER_BYTE[precision] * size)


def plan_smoke_test(
    size: int, precision: str, layers: int, twin_layers: int, available: int | None
) -> SmokePlan:
    """Run all `layers` when the estimate for `size` bytes fits FULL_SHARE of `available`
    memory, else the first `twin_layers`; the twin too where the memory is unknown."""
    if twin_layers >= layers:
        return SmokePlan(layers, layers)
    needed = memory_needed(size, precision)
    if available is None:
        return SmokePlan(twin_layers, layers, "the memory available here is unknown")
    if needed <= FULL_SHARE * available:
        return SmokePlan(layers, layers)
    return SmokePlan(
        twin_layers,
        layers,
        f"the whole bundle would need ~{_gib(needed)} to run here, {_gib(available)} are "
        f"available and {FULL_SHARE:.0%} of it is allowed",
    )


def run_smoke_phase(
    staging: Path,
    ep: EpCapabilities,
    *,
    precision: str,
    layers: int,
    twin_layers: int,
    write_twin: Callable[[Path, int], None],
    say: Callable[[str], None],
    vision_layers: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Smoke-test the bundle in `staging`, or its twin; the manifest's record of what ran.

    `write_twin(folder, n)` writes the bundle of the same checkpoint cut to its first `n`
    layers into `folder` (the packager's own functions); a vision-language twin cuts its vision
    tower too, to the first of `vision_layers` (twin's, whole's).
    """
    plan = plan_smoke_test(model_bytes(staging), precision, layers, twin_layers, available_memory())
    # on a terminal, each step of the test as it starts (a log gets the phase's time)
    steps = (lambda step: say(f"smoke test: {step}…")) if sys.stderr.isatty() else None
    if plan.whole:
        return _record(plan, smoke_test(staging, ep, on_step=steps))
    twin = staging / TWIN_FOLDER
    scope = f"the first {plan.layers} of {plan.of} layers"
    if vision_layers is not None:
        plan = dataclasses.replace(plan, vision_layers=vision_layers)
        scope += f" and {vision_layers[0]} of {vision_layers[1]} vision layers"
    say(f"smoke test on a twin bundle of {scope}: {plan.reason}")
    try:
        write_twin(twin, plan.layers)
        needed, available = memory_needed(model_bytes(twin), precision), available_memory()
        if available is not None and needed > available:
            note = (
                f"smoke test skipped: even the twin of {scope} would need ~{_gib(needed)}, "
                f"{_gib(available)} are available"
            )
            return _record(plan, SmokeResult(False, note))
        try:
            result = smoke_test(twin, ep, on_step=steps)
        except BundleError as error:
            raise BundleError(f"smoke test of the twin bundle of {scope}: {error}") from error
        return _record(plan, dataclasses.replace(result, note=f"{result.note} (twin of {scope})"))
    finally:
        shutil.rmtree(twin, ignore_errors=True)


def record_smoke_test(folder: Path, name: str, record: Mapping[str, Any]) -> None:
    """Add `record` to the manifest's build section and the card (README.md) of `folder`.

    The card is rendered again from the manifest (which holds all it shows), and only its
    own entry in the manifest's file list changes.
    """
    manifest = read_json(folder / MANIFEST_FILENAME, BundleError, MANIFEST_FILENAME)
    manifest["build"]["smoke_test"] = dict(record)
    card = render_card(
        read_json(folder / CONFIG_FILENAME, BundleError, CONFIG_FILENAME),
        folder=name,
        model_id=manifest["source"]["model_id"],
        revision=manifest["source"]["revision"],
        build=manifest["build"],
        tool_version=manifest["tool"]["version"],
        files=sorted({*manifest["files"], MANIFEST_FILENAME}),
        bos_token_id=required_bos(folder),
    )
    (folder / CARD_FILENAME).write_text(card, encoding="utf-8")
    manifest["files"].update(file_entries(folder, [CARD_FILENAME]))
    validate_manifest(manifest)
    write_json(folder / MANIFEST_FILENAME, manifest)


def _record(plan: SmokePlan, result: SmokeResult) -> dict[str, Any]:
    record = {"ran": result.ran, "layers": plan.layers, "of": plan.of, "note": result.note}
    if plan.vision_layers is not None:
        record["vision_layers"] = dict(zip(("layers", "of"), plan.vision_layers, strict=True))
    if result.mtp is not None:
        record["mtp"] = result.mtp
    return {**record, "reason": plan.reason} if plan.reason else record


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"
