"""Packaging a tiny checkpoint whose safetensors header holds millions of metadata entries.

The attack of issue 13: tests/data/tiny-qwen2 (a 200 KB model) with `--entries` (default
3,000,000, a ~90 MB header) string pairs added to the `__metadata__` of its model.safetensors.
The reference, measured in the same run, is the same checkpoint without them. Each file's header
is parsed once, so the extra cost is one parse of the big header, not one per tensor read.

    python benchmarks/big_header.py [--entries N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from _measure import run_measured

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "tests" / "data" / "tiny-qwen2"
WORK = HERE / "_work" / "big_header"
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
#: One metadata entry: '"k0000001":"<value>"', all the same width.
_KEY_DIGITS, _VALUE = 9, "v" * 16


def add_metadata(source: Path, dest: Path, entries: int) -> int:
    """Copy safetensors `source` to `dest` with `entries` metadata pairs; the header's size."""
    raw = source.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    tensors = json.dumps(header, separators=(",", ":")).encode()[1:-1]  # without the braces
    entry = len(f'"k{0:0{_KEY_DIGITS}d}":"{_VALUE}",')
    size = len(b'{"__metadata__":{') + entries * entry - 1 + len(b"},") + len(tensors) + 1
    padded = size + (-size) % 8  # safetensors pads headers to 8 bytes with spaces
    with open(dest, "wb") as stream:
        stream.write(padded.to_bytes(8, "little"))
        stream.write(b'{"__metadata__":{')
        for start in range(0, entries, 100_000):
            stop = min(entries, start + 100_000)
            chunk = ",".join(f'"k{i:0{_KEY_DIGITS}d}":"{_VALUE}"' for i in range(start, stop))
            stream.write(chunk.encode() + (b"," if stop < entries else b""))
        stream.write(b"}," + tensors + b"}" + b" " * (padded - size))
        stream.write(raw[8 + length :])
    return padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=3_000_000, help="metadata pairs to add")
    args = parser.parse_args()
    plain, padded = WORK / "plain", WORK / "metadata"
    for folder in (plain, padded):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(TINY, folder)
    header = add_metadata(TINY / "model.safetensors", padded / "model.safetensors", args.entries)
    print(f"header: {header / 2**20:.1f} MiB, {args.entries:,} metadata entries")
    print("| checkpoint | wall time (s) | peak RSS (MiB) |\n|---|--:|--:|")
    results = {}
    for name, folder in (("tiny-qwen2", plain), ("tiny-qwen2 + metadata", padded)):
        out = WORK / f"out-{folder.name}"
        command = [MOBIUS, "package", str(folder), "--ep", "cpu", "-o", str(out)]
        measured = run_measured([*command, "--force", "--quiet", "--no-smoke-test"])
        if measured.returncode != 0:
            raise SystemExit(f"{name}: exit {measured.returncode}\n{measured.output}")
        results[name] = measured
        print(f"| {name} | {measured.wall_s:.2f} | {measured.peak_rss_mib:,.0f} |")
    reference, attacked = results.values()
    print(
        f"ratio (metadata / plain): wall time {attacked.wall_s / reference.wall_s:.2f}, "
        f"peak RSS {attacked.peak_rss_mib / reference.peak_rss_mib:.2f}"
    )


if __name__ == "__main__":
    main()
