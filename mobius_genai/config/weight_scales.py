"""Constant multipliers a family folds into weights as they are read (Falcon-H1's µP
multipliers on attention, Mamba2 and MLP projections): y = (W x + b) * m is the projection with
weight m W and bias m b, and a multiplier on its input x scales W alone.

A `WeightScale` names the graph parameters it scales (a regex) and a factor for each run of
their output rows (a weight's first axis, a bias's only one): one run of every row for a plain
multiplier, several for Falcon-H1's `mup_vector` over in_proj's [gate | x | B | C | dt] rows.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np


@dataclasses.dataclass(frozen=True)
class WeightScale:
    """`pattern`: a regex over graph parameter names; `runs`: (rows, factor) pairs in order
    along the output rows, rows None for all the rows left."""

    pattern: str
    runs: tuple[tuple[int | None, float], ...]

    def applies(self, name: str) -> bool:
        return re.search(self.pattern, name) is not None

    def apply(self, array: np.ndarray) -> np.ndarray:
        """`array` [rows, ...] with each run of rows multiplied by its factor, in float32."""
        factors = np.empty(array.shape[0], np.float32)
        start = 0
        for rows, factor in self.runs:
            end = array.shape[0] if rows is None else start + rows
            factors[start:end] = factor
            start = end
        if start != array.shape[0]:
            raise ValueError(f"scale {self.pattern!r}: runs cover {start} of {array.shape[0]} rows")
        shape = (array.shape[0],) + (1,) * (array.ndim - 1)
        return array.astype(np.float32) * factors.reshape(shape)


def scale(pattern: str, factor: float) -> WeightScale:
    """Every row of the parameters `pattern` matches multiplied by `factor`."""
    return WeightScale(pattern, ((None, factor),))
