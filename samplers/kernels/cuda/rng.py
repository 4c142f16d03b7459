"""The splitmix64 stream of `samplers.kernels.rng` compiled as numba.cuda device functions."""

from __future__ import annotations

from numba import cuda

from samplers.kernels.rng import GOLDEN, TWO_M53, compile_for

__all__ = ["GOLDEN", "TWO_M53", "bounded", "draw", "mix", "row_state", "unit", "unit_open"]

_RNG = compile_for(cuda.jit(device=True))
mix = _RNG.mix
bounded = _RNG.bounded
row_state = _RNG.row_state
draw = _RNG.draw
unit = _RNG.unit
unit_open = _RNG.unit_open
