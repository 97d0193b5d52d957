"""Open a model argument, whatever it names (`source.classify` decides): its files, its
config.json and a `CheckpointReader` over its tensors, by one path for every kind.

A GGUF file brings its own config and tokenizer (`gguf.open_gguf`); a checkpoint folder or a
hub id is resolved to a folder of files (`source.resolve_source`) whose safetensors are read
with the integers config.json says they store (GPTQ/AWQ, MXFP4 experts, FP8 weights read
through `Fp8Checkpoint`: transformers' fp8, compressed-tensors' float-quantized); a
config.json alone describes a graph without weights.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from mobius_genai.checkpoint.prequantized.bitnet import BitNetScheme, read_bitnet_config
from mobius_genai.checkpoint.prequantized.compressed_tensors import read_compressed_fp8_config
from mobius_genai.checkpoint.prequantized.fp8 import Fp8Checkpoint, Fp8Scheme, read_fp8_config
from mobius_genai.checkpoint.prequantized.gptq import QuantizationScheme, read_quantization_config
from mobius_genai.checkpoint.prequantized.mxfp4 import is_mxfp4
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.checkpoint.source import (
    ArgumentKind,
    Source,
    classify,
    config_file,
    file_refused,
    local_source,
    read_config_json,
    resolve_source,
)
from mobius_genai.checkpoint.weights import Checkpoint


@dataclasses.dataclass
class OpenedCheckpoint:
    """A model argument opened: where its files are, its config.json, and its tensors."""

    source: Source
    config: dict[str, Any]
    _reader: CheckpointReader | None = None

    def reader(self) -> CheckpointReader:
        """The checkpoint's tensors. Safetensors headers are read (and checked) on the first
        call, once the caller has parsed config.json: its errors come before the weights'."""
        if self._reader is None:
            stored = Checkpoint(
                self.source.path,
                _stored_scheme(self.config),
                mxfp4_experts=is_mxfp4(self.config),
            )
            fp8 = _fp8_scheme(self.config)
            self._reader = stored if fp8 is None else Fp8Checkpoint(stored, fp8)
        return self._reader


def open_checkpoint(
    model: str | Path,
    revision: str | None = None,
    *,
    progress: bool = True,
    weights: bool = True,
) -> OpenedCheckpoint:
    """Open `model`: a checkpoint folder, a hub id (downloaded; `progress` shows the bars), a
    GGUF file, or without `weights` also a config.json file."""
    argument = classify(model)
    if argument.kind is ArgumentKind.GGUF and argument.path is not None:
        from mobius_genai.checkpoint.gguf import open_gguf  # the gguf package: GGUF files only

        source, config, gguf = open_gguf(argument.path)
        return OpenedCheckpoint(source, config, gguf)
    if argument.kind is ArgumentKind.CONFIG_JSON and argument.path is not None:
        if weights:
            raise file_refused(argument.given)
        return OpenedCheckpoint(local_source(argument.path.parent), read_config_json(argument.path))
    source = resolve_source(model, revision, progress=progress)
    return OpenedCheckpoint(source, read_config_json(source.path))


def stored_bits(model: str | Path, revision: str | None = None) -> frozenset[int]:
    """The bit widths of the integers `model` stores that the bundle can keep as they are (a
    GGUF's block types, config.json's GPTQ / AWQ quantization_config); empty for float weights.

    Read before the build (a GGUF's tensor list, or config.json alone), for `resolve_target`:
    what the source stores decides the precision that names the bundle.
    """
    argument = classify(model)
    if argument.kind is ArgumentKind.GGUF and argument.path is not None:
        stat = argument.path.stat()
        return _gguf_stored_bits(argument.path, stat.st_mtime_ns, stat.st_size)
    scheme = _stored_scheme(read_config_json(config_file(model, revision)))
    return frozenset() if scheme is None else frozenset({scheme.bits})


def _stored_scheme(config: dict[str, Any]) -> QuantizationScheme | BitNetScheme | None:
    """The GPTQ / AWQ / BitNet scheme config.json names; None for float weights, MXFP4 experts
    and FP8 weights (read as float)."""
    if is_mxfp4(config) or _fp8_scheme(config) is not None:
        return None
    return read_bitnet_config(config) or read_quantization_config(config)


def _fp8_scheme(config: dict[str, Any]) -> Fp8Scheme | None:
    """The FP8 weights config.json names (transformers' fp8, compressed-tensors' float-quantized
    format); None for others."""
    return read_fp8_config(config) or read_compressed_fp8_config(config)


@functools.lru_cache(maxsize=8)
def _gguf_stored_bits(path: Path, mtime_ns: int, size: int) -> frozenset[int]:
    """`stored_bits` of a GGUF file, read once per version of the file (the CLI and package()
    both ask): opening one parses every metadata field, seconds for a 49k-token vocabulary."""
    from mobius_genai.checkpoint.gguf import GgufCheckpoint  # the gguf package: GGUF files only

    return GgufCheckpoint(path).stored_bits()
