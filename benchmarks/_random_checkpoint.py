"""Random bf16 checkpoints in real shapes, written locally and cached under benchmarks/_work/.

Benchmarks need checkpoints of real sizes without downloading any. A checkpoint is a config.json,
one `model.safetensors` of bf16 tensors (deterministic for a seed; or several shards with an
index, and uint8 MXFP4 blocks and scales), the tokenizer files of
tests/data/tiny-qwen2 (384 tokens: speed does not depend on the tokenizer, and every tool only
needs one that loads) and any extra JSON files. Tensors are written one after another in chunks,
so even a 7B shape (~15 GB) needs a few tens of MB of memory.

A folder whose `stamp.json` matches the config, the tensor list and the seed is reused.

The tensor list is either written out by the caller or read from transformers' own model class
for the config (`transformers_specs`: built on the meta device, so nothing is allocated).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
TOKENIZER = HERE.parent / "tests" / "data" / "tiny-qwen2"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
)
#: Token ids of the tiny tokenizer's <|endoftext|> and <|im_end|>.
BOS, EOS = 381, 383
GENERATOR_VERSION = 2

Spec = tuple[str, tuple[int, ...], str]
"""(name, shape, kind): kind "norm" draws 1 + N(0, 0.02), "fp4" random bytes (MXFP4 blocks, two
codes a byte) and "e8m0" exponents 2^-5..2^-1 (their scales), both U8; "hole" zeros in bf16
left as a hole of the file (sparse: no disk blocks; reads, also through mmap, see zeros in page
cache pages like any data); any other kind N(0, 0.02) in bf16."""

#: Elements generated at a time: bounds the generator's own memory.
_CHUNK_ELEMENTS = 1 << 22
_U8_KINDS = frozenset({"fp4", "e8m0"})
HOLE = "hole"


def _bf16_chunks(
    shape: tuple[int, ...], kind: str, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """The tensor's bf16 bits (uint16, little-endian), a few million elements at a time.

    bf16 is the top half of the float32 (truncation; the weights are random anyway).
    """
    total = int(np.prod(shape))
    for start in range(0, total, _CHUNK_ELEMENTS):
        count = min(_CHUNK_ELEMENTS, total - start)
        if kind in _U8_KINDS:
            low, high = (0, 255) if kind == "fp4" else (127 - 5, 127 - 1)
            yield rng.integers(low, high, count, dtype=np.uint8, endpoint=True)
            continue
        values = rng.standard_normal(count, dtype=np.float32)
        values *= np.float32(0.02)
        if kind == "norm":
            values += np.float32(1.0)
        yield (values.view(np.uint32) >> 16).astype("<u2")


def write_safetensors(path: Path, specs: list[Spec], seed: int, first_index: int = 0) -> None:
    """Write every tensor of `specs` into one safetensors file, streaming; tensor i draws from
    the generator seeded with (seed, first_index + i)."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, kind in specs:
        u8 = kind in _U8_KINDS
        size = int(np.prod(shape)) * (1 if u8 else 2)
        header[name] = {
            "dtype": "U8" if u8 else "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as stream:
        stream.write(len(encoded).to_bytes(8, "little"))
        stream.write(encoded)
        for index, (_, shape, kind) in enumerate(specs):
            if kind == HOLE:
                stream.seek(int(np.prod(shape)) * 2, os.SEEK_CUR)
                continue
            rng = np.random.default_rng([seed, first_index + index])
            for chunk in _bf16_chunks(shape, kind, rng):
                stream.write(chunk.tobytes())
        stream.truncate()  # the file's length even when it ends in a hole
    os.replace(partial, path)


def transformers_specs(config: Mapping, auto_class: str = "AutoModelForCausalLM") -> list[Spec]:
    """The tensors of transformers' model for `config` (a config.json as a dict), the class
    `auto_class` (a transformers Auto class name) maps it to.

    The model is built on the meta device (shapes only). Tied weights appear once, under the
    name the checkpoint stores (the embedding); one-dimensional tensors named like a norm are
    kind "norm", everything else "matrix".
    """
    import torch
    import transformers

    keys = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **keys)
    with torch.device("meta"):
        model = getattr(transformers, auto_class).from_config(hf_config)
    return [
        (name, tuple(tensor.shape), "norm" if tensor.dim() == 1 and "norm" in name else "matrix")
        for name, tensor in model.named_parameters()  # shared (tied) parameters once
    ]


def cached_checkpoint(
    folder: Path,
    config: Mapping,
    specs: list[Spec] | Mapping[str, list[Spec]],
    seed: int = 0,
    extra_files: Mapping[str, Mapping] | None = None,
) -> Path:
    """`folder` holding the checkpoint, generated unless a matching one is already there.

    `specs` is one file's tensors, or shard file names mapped to theirs (written with an index).
    """
    extra_files = dict(extra_files or {})
    digest = hashlib.sha256(
        json.dumps([config, specs, extra_files, seed], sort_keys=True).encode()
    ).hexdigest()
    stamp = {"generator_version": GENERATOR_VERSION, "seed": seed, "digest": digest}
    stamp_file = folder / "stamp.json"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name, content in extra_files.items():
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, folder / name)
    shards = specs if isinstance(specs, Mapping) else {"model.safetensors": specs}
    first, weight_map = 0, {}
    for file, tensors in shards.items():
        write_safetensors(folder / file, tensors, seed, first)
        first += len(tensors)
        weight_map.update(dict.fromkeys((name for name, _, _ in tensors), file))
    if len(shards) > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index) + "\n")
    stamp_file.write_text(json.dumps(stamp) + "\n")  # last: marks the folder complete
    return folder
