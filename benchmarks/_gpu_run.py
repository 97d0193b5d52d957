"""One line of gpu_check.py, in a process of its own: package, compare, time.

Steps, each recorded on its own (a failing step says why, and the steps after it that do not
need its result still run):

- `package`: the tiny checkpoint packaged for cuda (the line's kernels turned on), and `graph`:
  the ops the line is about are in its graphs;
- `cpu`: the same checkpoint packaged for cpu (fp32) and its greedy tokens with
  onnxruntime-genai; for int4 lines the cuda bundle itself on onnxruntime's CPU provider (the
  same int4 weights: a cpu int4 bundle's differ, its calibration running another graph);
- `reference`: transformers in float32 on the device (the GPU; CPU in a dry run): greedy tokens
  and the logits of every step;
- `logits-<capture>`: onnxruntime-genai's logits of the cuda bundle, fed transformers' tokens
  one at a time, against transformers' (largest difference over the largest reference logit,
  within `TOLERANCE` of the precision); for vision lines `features`: the vision graph's image
  features against transformers' vision tower; for speech lines og's logits of its own greedy
  steps from its audio processor's features, against transformers' for the same (_gpu_speech.py);
- `tokens-<capture>`: the cuda bundle's greedy tokens against the cpu bundle's (equal, or they
  part where the cpu bundle's top two logits are within the tolerance: a near tie);
- `decode`: decode tokens/s of the cuda bundle against onnxruntime-genai's builder's cuda bundle
  of the same checkpoint (`python -m onnxruntime_genai.models.builder -e cuda`), as a ratio.

The steps that use the device (the reference, onnxruntime-genai's runs, the timing) run in the
line's turn (`device_turn`): gpu_check.py --jobs runs lines side by side, their packaging and
the builder overlapping, their GPU work and timing one line at a time.

Graph capture is on and off through og.Config's provider options (the bundle is not changed);
it needs past_present_share_buffer, else that run is marked not applicable. A dry run clears
the providers instead (onnxruntime's CPU provider runs the cuda graphs where it has the ops'
kernels; PackedMultiHeadAttention has none, so the vision graph runs with the op's standard
body inlined) and has no graph capture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from _gpu_lines import GQA_BIAS, PACKED_MHA, TOLERANCE, Line, write_checkpoint

if TYPE_CHECKING:
    from mobius_genai.ep import EpCapabilities

PROMPT = (381, 17, 92, 250, 33, 301, 8, 140)  # bos + seven tokens of the tiny tokenizer
SPEED_PROMPT, SPEED_NEW, SPEED_ROUNDS = 16, 40, 9  # within the tiny models' 64 positions
BUILDER_TIMEOUT_S = 120
DEVICE_LOCK = "device.lock"
#: The line of a traceback that names the exception.
_RAISED = re.compile(r"\w+(Error|Exception)\b")


@dataclasses.dataclass
class Run:
    """Where a line runs and what it has recorded so far."""

    line: Line
    folder: Path
    dry_run: bool
    new_tokens: int
    steps: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    waited_s: float = 0.0
    """Seconds the line waited for the device (other lines' turns)."""

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def step(self, name: str, work: Callable[[], Any]) -> Any:
        """Run `work`, record its verdict under `name`; None when it failed."""
        try:
            result = work()
        except Exception as error:
            self.steps[name] = {
                "ok": False,
                "note": f"{type(error).__name__}: {error}"[:600],
                "trace": traceback.format_exc()[-2000:],
            }
            return None
        return result

    def record(self, name: str, ok: bool | None, note: str, **values: Any) -> None:
        self.steps[name] = {"ok": ok, "note": note, **values}


def run_line(line: Line, folder: Path, *, dry_run: bool, new_tokens: int) -> dict[str, Any]:
    """Every step of `line` in `folder` (emptied first); the record gpu_check.py tabulates."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run = Run(line, folder, dry_run, new_tokens)
    checkpoint = folder / "checkpoint"
    hf_model = run.step("checkpoint", lambda: write_checkpoint(line, checkpoint) or True)
    if hf_model is None:
        return _result(run)
    builder = _start_builder(line, checkpoint, folder)
    cuda = run.step("package", lambda: _package_cuda(run, checkpoint))
    cpu = run.step("cpu", lambda: _package_cpu(run, checkpoint, cuda))
    built = _finish_builder(run, builder)
    with device_turn(run):
        if line.vision is not None:
            from _gpu_vision import check_vision

            check_vision(run, cuda, cpu, hf_model)
        elif line.speech is not None:
            from _gpu_speech import check_speech

            check_speech(run, cuda, cpu, hf_model)
        else:
            _check_text(run, checkpoint, cuda, cpu)
        run.step("decode", lambda: _decode_ratio(run, cuda, built))
    return _result(run)


@contextlib.contextmanager
def device_turn(run: Run) -> Iterator[None]:
    """The line's device steps, one line at a time: gpu_check.py --jobs runs lines side by
    side, their packaging overlapping, their GPU work and timing not. An exclusive lock on a
    file beside the lines' folders, released when its process ends, however it ends."""
    asked = time.monotonic()
    with (run.folder.parent / DEVICE_LOCK).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run.waited_s = round(time.monotonic() - asked, 1)
        yield


def _result(run: Run) -> dict[str, Any]:
    line = run.line
    return {
        "line": line.name,
        "family": line.family,
        "precision": line.precision,
        "checks": line.checks,
        "flags": dict(line.flags),
        "dry_run": run.dry_run,
        "device_wait_s": run.waited_s,
        "steps": run.steps,
    }


def cuda_caps(line: Line) -> EpCapabilities:
    """cuda's capabilities with the line's kernels turned on (nothing is registered)."""
    from mobius_genai.ep import get_ep

    return get_ep("cuda").with_kernels(line.flags)


def _package_cuda(run: Run, checkpoint: Path) -> Path:
    from mobius_genai.packager import package

    line = run.line
    out = package(
        checkpoint,
        cuda_caps(line),
        run.folder / "cuda",
        precision=line.precision,
        smoke_test=False,
        quiet=True,
    )
    ops = _graph_ops(out)
    missing = [op for op in line.expects if op not in ops]
    present = [op for op in line.absent if op in ops]
    windows = sorted(ops.get("local_window_size", set()))
    said = [f"holds {', '.join(line.expects)}"] if line.expects else []
    said += [f"no {', '.join(line.absent)}"] if line.absent else []
    if missing or present:
        said = [f"missing {', '.join(missing)}"] if missing else []
        said += [f"holds {', '.join(present)}"] if present else []
    run.record("graph", not (missing or present), "; ".join(said), windows=windows)
    run.record("package", True, out.name)
    return out


def _graph_ops(bundle: Path) -> dict[str, Any]:
    """Op (domain::op) → graph files holding it (GQA_BIAS: a GQA node with causal=0 and an
    attention_bias); "local_window_size" → GQA's window sizes."""
    import onnx

    found: dict[str, Any] = {}
    for path in sorted(bundle.glob("*.onnx")):
        graph = onnx.load(str(path), load_external_data=False).graph
        for node in graph.node:
            op = f"{node.domain or 'ai.onnx'}::{node.op_type}"
            found.setdefault(op, set()).add(path.name)
            if op == GQA_BIAS.split("(")[0] and _bias_without_causal(node):
                found.setdefault(GQA_BIAS, set()).add(path.name)
            for attribute in node.attribute:
                if attribute.name == "local_window_size":
                    found.setdefault("local_window_size", set()).add(int(attribute.i))
    return found


def _bias_without_causal(node: Any) -> bool:
    causal = next((a.i for a in node.attribute if a.name == "causal"), 1)
    return causal == 0 and len(node.input) > 10 and bool(node.input[10])


def _package_cpu(run: Run, checkpoint: Path, cuda: Path | None) -> Path:
    from mobius_genai.packager import package

    if run.line.precision == "int4":
        if cuda is None:
            raise RuntimeError("no cuda bundle to run on CPU")
        run.record("cpu", True, "the cuda int4 bundle on onnxruntime's CPU provider")
        return cpu_copy(cuda)
    out = package(
        checkpoint, "cpu", run.folder / "cpu", precision="fp32", smoke_test=False, quiet=True
    )
    run.record("cpu", True, "cpu fp32 bundle")
    return out


def load_on_device(run: Run, bundle: Path, capture: bool, *, cpu: bool = False) -> Any:
    """og.Model of `bundle` on the device: cuda with graph capture on or off, or (dry run, or
    `cpu`) the CPU provider."""
    from mobius_genai.runtime.generate import load_model

    if cpu:
        return load_model(bundle, cpu=True)
    if run.dry_run:
        return load_model(cpu_copy(bundle), cpu=True)
    return load_model(bundle, provider=("cuda", {"enable_cuda_graph": "1" if capture else "0"}))


def cpu_copy(bundle: Path) -> Path:
    """A copy of a cuda bundle that onnxruntime's CPU provider runs (dry run), made once: every
    graph's provider options cleared (og.Config's clear_providers clears the decoder's only),
    and PackedMultiHeadAttention, which has no CPU kernel, replaced by its standard body."""
    import onnx_ir as ir
    from onnx_ir.passes.common import InlinePass

    copy = bundle.with_name(f"{bundle.name}-on-cpu")
    if copy.is_dir():
        return copy
    shutil.copytree(bundle, copy)
    config = json.loads((copy / "genai_config.json").read_text())
    _clear_providers(config)
    (copy / "genai_config.json").write_text(json.dumps(config, indent=2))
    for path in copy.glob("*.onnx"):
        model = ir.load(path)
        if not any(node.op_type == PACKED_MHA.split("::")[1] for node in model.graph):
            continue
        InlinePass(criteria=lambda function: function.name == "PackedMultiHeadAttention")(model)
        ir.external_data.load_to_model(model)
        ir.save(model, path, external_data=f"{path.name}.data")
    return copy


def _clear_providers(document: Any) -> None:
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "provider_options":
                document[key] = []
            else:
                _clear_providers(value)


def captures(run: Run, bundle: Path) -> dict[str, str | None]:
    """ "off" and "on" → None where that run applies, else why not."""
    config = json.loads((bundle / "genai_config.json").read_text())
    shared = config.get("search", {}).get("past_present_share_buffer", False)
    on = None
    if run.dry_run:
        on = "no graph capture on CPU (dry run)"
    elif run.line.no_capture is not None:
        on = run.line.no_capture
    elif not shared:
        on = "the bundle does not share past/present buffers (graph capture needs it)"
    return {"off": None, "on": on}


def cpu_refusal(run: Run) -> str | None:
    """Why the dry run cannot run the line's cuda bundle on CPU (bf16), or None."""
    if not run.dry_run:
        return None
    from mobius_genai.bundle.runnable import dtype_refusal
    from mobius_genai.target import FLOAT_PRECISIONS

    return dtype_refusal(FLOAT_PRECISIONS[run.line.dtype])


def device_models(run: Run, cuda: Path, steps: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """(capture, og.Model of `cuda`) for each graph-capture run that applies; the other runs'
    `steps` are recorded as not applicable, with why."""
    refusal = cpu_refusal(run)
    for capture, why_not in captures(run, cuda).items():
        why_not = why_not or refusal
        if why_not is not None:
            for step in steps:
                run.record(f"{step}-{capture}", None, why_not)
            continue
        model = run.step(f"load-{capture}", lambda c=capture: load_on_device(run, cuda, c == "on"))
        if model is not None:
            yield capture, model


def _check_text(run: Run, checkpoint: Path, cuda: Path | None, cpu: Path | None) -> None:
    expected = None
    if cpu is not None:
        expected = run.step("cpu", lambda: cpu_greedy(run, cpu))
    reference = run.step("reference", lambda: _reference(run, checkpoint))
    if reference is not None and run.line.precision == "int4" and cpu is not None:
        reference = run.step("reference", lambda: _int4_reference(run, cpu, reference))
    if cuda is None:
        return
    for capture, model in device_models(run, cuda, ("logits", "tokens")):
        if reference is not None:
            run.step(f"logits-{capture}", lambda m=model, c=capture: _logits(run, m, reference, c))
        if expected is not None:
            run.step(
                f"tokens-{capture}", lambda m=model, c=capture: tokens_step(run, m, expected, c)
            )


def cpu_greedy(
    run: Run, bundle: Path, inputs_for: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """The cpu bundle's greedy tokens (after `inputs_for(model)` where given)."""
    model = load_on_device(run, bundle, False, cpu=True)
    return greedy(model, run.new_tokens, None if inputs_for is None else inputs_for(model))


def greedy(model: Any, new_tokens: int, inputs: Any = None) -> dict[str, Any]:
    """Greedy tokens (exactly `new_tokens`) after PROMPT, or after a multimodal processor's
    `inputs`, and each step's logits, top-two margin and largest logit."""
    import onnxruntime_genai as og

    length = len(PROMPT) if inputs is None else inputs["input_ids"].as_numpy().shape[1]
    total = length + new_tokens
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=total, min_length=total, repetition_penalty=1.0
    )
    generator = og.Generator(model, params)
    if inputs is None:
        generator.append_tokens(list(PROMPT))
    else:
        generator.set_inputs(inputs)
    tokens, margins, scale, steps = [], [], 0.0, []
    while not generator.is_done():
        logits = np.asarray(generator.get_logits()[0, -1], np.float32)
        steps.append(logits)
        top = np.sort(logits)[-2:]
        margins.append(float(top[1] - top[0]))
        scale = max(scale, float(np.abs(logits).max()))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return {"tokens": tokens, "margins": margins, "scale": scale, "logits": np.stack(steps)}


def _reference(run: Run, checkpoint: Path) -> dict[str, Any]:
    """transformers' float32 greedy tokens after PROMPT on the device, and each step's logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(  # eager experts: grouped_mm wants bf16
        checkpoint, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    model = model.to(run.device).eval()
    ids = torch.tensor([PROMPT], device=run.device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=run.new_tokens,
            min_new_tokens=run.new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(PROMPT) :].tolist()
    logits = np.stack([step[0].float().cpu().numpy() for step in out.logits])
    run.record("reference", True, f"transformers float32 on {run.device}", tokens=tokens)
    return {"tokens": tokens, "logits": logits}


def _logits(run: Run, model: Any, reference: dict[str, Any], capture: str) -> None:
    """og's logits fed the reference's tokens one at a time, against the reference's logits."""
    ours = forced_logits(model, reference["tokens"])
    relative = relative_error(ours, reference["logits"])
    tolerance = TOLERANCE[run.line.precision]
    note = f"{relative:.2e} of the largest logit (tolerance {tolerance:g}), {len(ours)} steps"
    run.record(f"logits-{capture}", relative <= tolerance, note, value=relative)


def forced_logits(model: Any, tokens: list[int]) -> np.ndarray:
    """og's last-position logits after PROMPT and after each of `tokens` but the last, fed one
    at a time (what transformers' greedy steps saw): [len(tokens), vocab] float32."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + len(tokens))
    generator = og.Generator(model, params)
    generator.append_tokens(list(PROMPT))
    ours = [np.asarray(generator.get_logits()[0, -1], np.float32)]
    for token in tokens[:-1]:
        generator.append_tokens([token])
        ours.append(np.asarray(generator.get_logits()[0, -1], np.float32))
    return np.stack(ours)


def _int4_reference(run: Run, cpu: Path, reference: dict[str, Any]) -> dict[str, Any]:
    """For int4 lines: the int4 graph's logits on onnxruntime's CPU provider, fed transformers'
    tokens (transformers' float weights are further from the int4 ones than any kernel)."""
    logits = forced_logits(load_on_device(run, cpu, False, cpu=True), reference["tokens"])
    float_error = relative_error(logits, reference["logits"])
    note = (
        f"the int4 graph on CPU fed transformers' tokens (its logits against transformers' "
        f"float32: {float_error:.2e} of the largest logit)"
    )
    run.record("reference", True, note, tokens=reference["tokens"], int4_vs_float=float_error)
    return {"tokens": reference["tokens"], "logits": logits}


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute difference over the largest absolute reference value (NaN → inf)."""
    difference = np.abs(ours.astype(np.float64) - reference.astype(np.float64)).max()
    scale = max(float(np.abs(reference).max()), 1e-6)
    return float("inf") if not np.isfinite(difference) else float(difference) / scale


def tokens_step(
    run: Run, model: Any, expected: dict[str, Any], capture: str, inputs: Any = None
) -> None:
    """The cuda bundle's greedy tokens against the cpu bundle's (`expected`)."""
    ours = greedy(model, run.new_tokens, inputs)["tokens"]
    ok, note = compare_tokens(ours, expected, TOLERANCE[run.line.precision])
    run.record(f"tokens-{capture}", ok, note, tokens=ours, expected=expected["tokens"])


def compare_tokens(ours: list[int], expected: dict[str, Any], tolerance: float) -> tuple[bool, str]:
    """Equal tokens pass; tokens that part where the expected run's top two logits were within
    `tolerance` of its largest logit pass as a near tie (rounding may pick either)."""
    theirs = expected["tokens"]
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if same is None and len(ours) == len(theirs):
        return True, f"{len(ours)}/{len(theirs)} equal"
    step = min(len(ours), len(theirs)) if same is None else same
    margin = expected["margins"][step] if step < len(expected["margins"]) else float("inf")
    tie = margin <= tolerance * expected["scale"]
    kind = "near tie" if tie else "differ"
    return tie, f"{step}/{len(theirs)} equal, then {kind} (cpu top-2 margin {margin:.3g})"


def _start_builder(line: Line, checkpoint: Path, folder: Path) -> subprocess.Popen | None:
    """onnxruntime-genai's builder making the cuda bundle of the same checkpoint, started now
    and run beside the other steps (a process of its own, isolated)."""
    command = [
        sys.executable,
        "-I",
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(checkpoint),
        "-o",
        str(folder / "builder"),
        "-p",
        line.precision,
        "-e",
        "cuda",
        "-c",
        str(folder / "builder-cache"),
    ]
    with (folder / "builder.log").open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder)


def _finish_builder(run: Run, process: subprocess.Popen) -> Path | None:
    try:
        code = process.wait(timeout=BUILDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        run.record("builder", False, f"no bundle within {BUILDER_TIMEOUT_S} s")
        return None
    if code != 0:
        said = (run.folder / "builder.log").read_text(errors="replace").strip().splitlines()
        errors = [line for line in said if _RAISED.match(line)] or said or ["no output"]
        run.record("builder", None, f"the builder failed (exit {code}): {errors[-1][:300]}")
        return None
    run.record("builder", True, "python -m onnxruntime_genai.models.builder -e cuda")
    return run.folder / "builder"


def _decode_ratio(run: Run, ours: Path | None, builder: Path | None) -> None:
    """Decode tokens/s of our cuda bundle over the builder's, both loaded in this process, the
    order alternating round by round after a warm-up each; the median of the rounds' ratios."""
    from mobius_genai.bench.speed import random_prompt, time_generation

    if run.line.speech is not None:
        why = "not timed: the timing feeds tokens, where a speech generator takes audio"
        run.record("decode", None, why)
        return
    if ours is None or builder is None:
        why = "no cuda bundle" if ours is None else run.steps["builder"]["note"]
        run.record("decode", None, why)
        return
    refusal = cpu_refusal(run)
    if refusal is not None:
        run.record("decode", None, refusal)
        return
    prompt = random_prompt(1, SPEED_PROMPT, 384)
    models = {"ours": load_on_device(run, ours, False)}
    time_generation(models["ours"], prompt, 4)
    try:
        models["builder"] = load_on_device(run, builder, False)
        time_generation(models["builder"], prompt, 4)
    except Exception as error:  # ours ran: no ratio, and nothing of ours failed
        note = f"the builder's bundle does not run on {run.device}: {error}"
        run.record("decode", None, note[:400])
        return
    rates: dict[str, list[float]] = {"ours": [], "builder": []}
    for index in range(SPEED_ROUNDS):
        for name in list(models) if index % 2 == 0 else list(reversed(models)):
            rates[name].append(time_generation(models[name], prompt, SPEED_NEW)["decode"])
    ratios = [a / b for a, b in zip(rates["ours"], rates["builder"], strict=True)]
    ratio = statistics.median(ratios)
    ours_rate, theirs = statistics.median(rates["ours"]), statistics.median(rates["builder"])
    note = f"{ratio:.2f} ({ours_rate:.0f} vs {theirs:.0f} tokens/s, {run.device})"
    run.record("decode", True, note, value=ratio, ratios=ratios, **rates)
