"""Peak memory of the smoke test's process per byte of a bundle's model files.

These are the factors `mobius_genai/runtime/smoke_plan.py` holds (MEMORY_PER_BYTE): `package`
runs the whole bundle only where `base + factor x model bytes` fits the memory it allows.

Each bundle is packaged without a smoke test, then smoke-tested (`smoke_test`, as `package` runs
it) from a fresh Python process, which reports the peak RSS of the smoke test's own process
(ru_maxrss of its waited-for children). base is that peak for the bundle of the committed tiny
checkpoint (0.6 MB of weights); factor = (peak - base) / model bytes.

    python benchmarks/smoke_memory.py                    # tiny + the 0.5B shape, 5 variants
    python benchmarks/smoke_memory.py --also CKPT:EP:PRECISION ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from make_qwen25_05b_shape import WORK, make_checkpoint

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "tests" / "data" / "tiny-qwen2"
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
VARIANTS = (("cpu", "fp32"), ("cpu", "fp16"), ("cuda", "fp16"), ("cpu", "int4"), ("cuda", "int4"))

_SMOKE = (
    "import json, resource, sys; from mobius_genai.runtime.smoke import smoke_test; "
    "from mobius_genai.runtime.smoke_plan import model_bytes; from mobius_genai.ep import get_ep; "
    "note = smoke_test(sys.argv[1], get_ep(sys.argv[2])).note; "
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024; "
    "print(json.dumps({'peak': peak, 'bytes': model_bytes(sys.argv[1]), 'note': note}))"
)


def measure(checkpoint: Path, ep: str, precision: str) -> dict:
    """Package `checkpoint` (unless done before), smoke-test it; peak and model bytes."""
    out = WORK / "smoke-memory" / f"{checkpoint.name}-{ep}-{precision}"
    if not (out / "mobius_manifest.json").is_file():
        command = [MOBIUS, "package", str(checkpoint), "--ep", ep, "--precision", precision]
        command += ["-o", str(out), "--force", "--quiet", "--no-smoke-test"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    result = subprocess.run(
        [sys.executable, "-c", _SMOKE, str(out), ep], check=True, capture_output=True, text=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--also", nargs="*", default=[], help="more CHECKPOINT:EP:PRECISION to measure"
    )
    args = parser.parse_args()
    base = measure(TINY, "cpu", "fp32")["peak"]
    print(f"base (tiny cpu fp32): peak {base / 2**20:,.0f} MiB")
    print("| checkpoint | EP | precision | model files (MiB) | peak (MiB) | factor |")
    print("|---|---|---|--:|--:|--:|")
    runs = [(make_checkpoint("0.5b"), ep, precision) for ep, precision in VARIANTS]
    for spec in args.also:
        checkpoint, ep, precision = spec.rsplit(":", 2)
        runs.append((Path(checkpoint), ep, precision))
    for checkpoint, ep, precision in runs:
        found = measure(checkpoint, ep, precision)
        factor = (found["peak"] - base) / found["bytes"]
        print(
            f"| {checkpoint.name} | {ep} | {precision} | {found['bytes'] / 2**20:,.0f} | "
            f"{found['peak'] / 2**20:,.0f} | {factor:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
