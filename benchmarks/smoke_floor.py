"""What running a 7B float16 GPU bundle's one-layer twin on CPU costs, with nothing of ours loaded.

`package --ep cuda` of a 7B checkpoint on a CPU-only machine smoke-tests a twin with the first
layer only, on onnxruntime's CPU EP (benchmarks/README.md, "7B package"). This measures the floor
under that smoke test: the peak RSS of a fresh process that imports only onnxruntime-genai (or
onnxruntime) and numpy, loads the twin-shaped bundle on CPU and generates, for the settings
onnxruntime offers. The bundle is `package --ep cuda --no-smoke-test` of a checkpoint in the real
Qwen2.5-7B shapes with one layer (random bf16 weights, written by make_qwen25_05b_shape.py's
functions; ~2.5 GB), so its graph is the twin's.

    python benchmarks/smoke_floor.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_qwen25_05b_shape as shapes  # noqa: E402
from _random_checkpoint import cached_checkpoint  # noqa: E402

CHECKPOINT = shapes.WORK / "qwen2.5-7b-shape-1-layer"
BUNDLE = shapes.WORK / "qwen2.5-7b-shape-1-layer-cuda"
#: onnxruntime's transformer that converts float16 weights to float32 copies at load.
FUSE = "FuseFp16InitializerToFp32NodeTransformer"
NO_PREPACKING = {"session.disable_prepacking": "1"}  # what the smoke test sets

#: name → (runtime, session options). og takes config entries and its own keys; plain
#: onnxruntime also takes an execution order, which og does not expose.
VARIANTS = {
    "onnxruntime-genai, the smoke test's options": ("og", NO_PREPACKING),
    "onnxruntime-genai, float32 casts at run time, no arena": (
        "og",
        {
            **NO_PREPACKING,
            "optimization.disable_specified_optimizers": FUSE,
            "enable_cpu_mem_arena": False,
        },
    ),
    "onnxruntime, the smoke test's options": ("ort", NO_PREPACKING),
    "onnxruntime, float32 casts at run time, no arena, priority-based order": (
        "ort",
        {**NO_PREPACKING, "optimization.disable_specified_optimizers": FUSE, "arena": False},
    ),
}

_MEASURE = r"""
import json, resource, sys
import numpy as np
runtime, folder, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if runtime == "og":
    import onnxruntime_genai as og
    config = og.Config(folder)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=13)
    generator = og.Generator(model, params)
    generator.append_tokens([1, 2, 3, 4, 5])
    while not generator.is_done():
        generator.generate_next_token()
else:
    import onnxruntime as ort
    session_options = ort.SessionOptions()
    if options.pop("arena", True) is False:
        session_options.enable_cpu_mem_arena = False
        session_options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    for key, value in options.items():
        session_options.add_session_config_entry(key, value)
    session = ort.InferenceSession(
        folder + "/model.onnx", session_options, providers=["CPUExecutionProvider"]
    )
    feeds = {}
    for value in session.get_inputs():
        dtype = np.float16 if value.type == "tensor(float16)" else np.int64
        if value.name.startswith("past"):
            feeds[value.name] = np.zeros([1, value.shape[1], 0, value.shape[3]], dtype)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(5, dtype=dtype)[None]
        else:
            feeds[value.name] = np.ones((1, 5), dtype)
    session.run(None, feeds)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
"""


def one_layer_checkpoint() -> Path:
    """The Qwen2.5-7B shapes with one layer, random bf16 weights (cached by its stamp)."""
    config = {**shapes.hf_config("7b"), "num_hidden_layers": 1, "max_window_layers": 1}
    return cached_checkpoint(CHECKPOINT, config, shapes.tensor_specs(config))


def peak_mib(runtime: str, options: dict) -> int:
    """Peak RSS (MiB) of a fresh process loading BUNDLE on CPU and generating."""
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, runtime, str(BUNDLE), json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and bundle")
    args = parser.parse_args()
    checkpoint = one_layer_checkpoint()
    command = [str(Path(sys.executable).with_name("mobius-genai")), "package", str(checkpoint)]
    command += ["--ep", "cuda", "-o", str(BUNDLE), "--force", "--no-smoke-test", "--quiet"]
    subprocess.run(command, check=True)
    print("| runtime and settings | peak RSS (MiB) |\n|---|--:|")
    for name, (runtime, options) in VARIANTS.items():
        print(f"| {name} | {peak_mib(runtime, dict(options)):,} |", flush=True)
    if not args.keep:
        shutil.rmtree(BUNDLE, ignore_errors=True)
        shutil.rmtree(CHECKPOINT, ignore_errors=True)


if __name__ == "__main__":
    main()
