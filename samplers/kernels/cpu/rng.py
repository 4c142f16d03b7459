"""The splitmix64 stream of `samplers.kernels.rng` compiled for the CPU kernels (inlined into them)."""

from __future__ import annotations

import numba as nb

from samplers.kernels.rng import GOLDEN, TWO_M53, compile_for

__all__ = ["GOLDEN", "TWO_M53", "bounded", "draw", "mix", "row_state", "unit", "unit_open"]

_RNG = compile_for(nb.njit(inline="always"))
mix = _RNG.mix
bounded = _RNG.bounded
row_state = _RNG.row_state
draw = _RNG.draw
unit = _RNG.unit
unit_open = _RNG.unit_open
