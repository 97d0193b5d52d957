"""Residual factors (MiniMax's `*_alpha_factor`, `*_beta_factor`): each residual add is
alpha * residual + beta * block, with one pair for the MLP and one per token-mixer layer kind
(MiniMaxDecoderLayer: full attention's, lightning attention's)."""

from __future__ import annotations

import dataclasses

#: (alpha, beta) of an add left as it is.
PLAIN = (1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class ResidualFactors:
    """`mixers`: (layer kind, alpha, beta) of the add after that kind's token mixer (a kind
    not named: PLAIN); `mlp`: (alpha, beta) of the add after the MLP."""

    mixers: tuple[tuple[str, float, float], ...]
    mlp: tuple[float, float] = PLAIN

    def mixer(self, layer_type: str) -> tuple[float, float]:
        """(alpha, beta) of the add after the token mixer of a `layer_type` layer."""
        return next(((a, b) for kind, a, b in self.mixers if kind == layer_type), PLAIN)
