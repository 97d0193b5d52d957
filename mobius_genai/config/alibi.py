"""ALiBi (attention with linear biases, Press et al. 2021): the positions of a decoder whose
layers have no rotary embedding; each head's attention scores get its slope times the key's
distance back from the query (components/alibi.py builds the bias).

Bloom's and MPT's slopes are one formula (transformers' `_get_alibi_slopes` and
`build_mpt_alibi_tensor` agree for every head count at a max_bias of 8): with n heads rounded up
to a power of two p, slope_k = 2^(-max_bias · k / p) for k = 1..p; when p != n the even k come
first, then the odd ones, and the first n are kept. Falcon's ALiBi layers (Falcon-RW) round
the slopes and each slope x key position to bfloat16 and divide the bias by sqrt(head_dim),
as transformers' FalconModel does.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Alibi:
    """How one family's ALiBi bias is made: the largest slope exponent (MPT's
    alibi_bias_max; 8 for Bloom), whether slopes and products are rounded to bfloat16 and
    the bias scaled like the scores (falcon)."""

    max_bias: float = 8.0
    bfloat16: bool = False
    scaled: bool = False

    def slopes(self, num_heads: int) -> np.ndarray:
        """Each head's slope, float64 [num_heads]."""
        padded = 2 ** math.ceil(math.log2(num_heads))
        slopes = 2.0 ** (-self.max_bias * np.arange(1, padded + 1) / padded)
        if padded != num_heads:
            slopes = np.concatenate([slopes[1::2], slopes[::2]])[:num_heads]
        return slopes
