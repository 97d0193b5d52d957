"""Zamba2's shared transformer blocks (`zamba2`): `count` blocks of attention and a gated MLP,
invoked in turn before the Mamba2 mixer of the "hybrid" layers.

- `hybrid_layers`: the layers that invoke a block; the j-th of them (its invocation j) runs
  block j % `count`, with a KV cache of its own (the layer's).
- Each invocation adds its own low-rank adapter (x @ A @ B, rank `adapter_rank`, stored with
  its block as `..._adapter_list.{j}`) to the block's gate_up projection, and with
  `attention_adapters` to its q, k and v projections.
- `invocations`: how many invocations the checkpoint's adapter lists hold (every hybrid layer
  of the checkpoint; a twin with fewer layers still reads them all).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SharedBlocks:
    """Zamba2's shared blocks (see the module docstring)."""

    count: int
    adapter_rank: int
    attention_adapters: bool
    hybrid_layers: tuple[int, ...]
    invocations: int

    def invocation_of(self, layer: int) -> int | None:
        """Which invocation layer `layer` is (None: it invokes no block)."""
        if layer not in self.hybrid_layers:
            return None
        return self.hybrid_layers.index(layer)

    def block_of(self, invocation: int) -> int:
        """The block invocation `invocation` runs."""
        return invocation % self.count

    def first_layers(self, count: int) -> SharedBlocks:
        """The section of the first `count` layers (the adapters of every invocation kept)."""
        return dataclasses.replace(
            self, hybrid_layers=tuple(i for i in self.hybrid_layers if i < count)
        )
