"""The splitmix64 random stream of the sampling kernels, written once and compiled for every target.

The functions below are plain Python on numpy ``uint64`` scalars: `compile_for` compiles each of them
with a target's decorator (``numba.njit(inline="always")`` for the CPU kernels, ``numba.cuda.jit(
device=True)`` for the GPU kernels), each compiled function calling the compiled versions of the
others. So the CPU kernels, the GPU kernels and numba's CUDA simulator run the same arithmetic and
draw bit-identical streams; `samplers.kernels.reference` states the same stream on Python ints.

The stream of row ``v`` of a layer with key ``key`` (docs/architecture.md#sampling-rules):
``state0 = row_state(key, v)``; its draw ``t`` (t = 1, 2, ...) is ``draw(state0, t)``; ``bounded(r,
n)`` maps a draw to [0, n), ``unit(r)`` to [0, 1) and ``unit_open(r)`` to (0, 1].

>>> from samplers.kernels.rng import compile_for
>>> rng = compile_for(numba.njit(inline="always"))
>>> rng.bounded(rng.draw(rng.row_state(key, node), 1), np.uint64(deg))

References
----------
Steele, Lea and Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014), splitmix64;
Lemire, "Fast random integer generation in an interval" (ACM TOMACS 2019), multiply-shift.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np

from samplers.kernels.reference import GOLDEN as GOLDEN_INT

__all__ = ["GOLDEN", "TWO_M53", "bounded", "compile_for", "compile_functions", "draw", "mix", "mixed_seed",
           "row_state", "unit", "unit_open"]

GOLDEN = np.uint64(GOLDEN_INT)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
LO32 = np.uint64(0xFFFFFFFF)
TWO_M53 = 2.0 ** -53


def mix(z):
    """splitmix64's finaliser of a uint64."""
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def bounded(r, n):
    """floor(r * n / 2^64) for uint64 r, n: the high word of the 128-bit product (int64)."""
    a = r >> np.uint64(32)
    b = r & LO32
    if n <= LO32:  # exact in 64-bit arithmetic when n < 2^32 (every realistic degree)
        return np.int64((a * n + ((b * n) >> np.uint64(32))) >> np.uint64(32))
    c = n >> np.uint64(32)
    d = n & LO32
    bd = b * d
    ad = a * d
    bc = b * c
    mid = (bd >> np.uint64(32)) + (ad & LO32) + (bc & LO32)
    return np.int64(a * c + (ad >> np.uint64(32)) + (bc >> np.uint64(32)) + (mid >> np.uint64(32)))


def row_state(key, node):
    """The start ``state0`` of a row's stream: mix(key ^ (node * GOLDEN))."""
    return mix(key ^ (np.uint64(node) * GOLDEN))


def draw(state0, t):
    """Draw t (t = 1, 2, ...) of the row's stream: mix(state0 + t * GOLDEN)."""
    return mix(state0 + np.uint64(t) * GOLDEN)


def unit(r):
    """[0, 1) from a draw: its top 53 bits times 2^-53."""
    return np.float64(r >> np.uint64(11)) * TWO_M53


def unit_open(r):
    """(0, 1] from a draw: its top 53 bits, plus one, times 2^-53."""
    return (np.float64(r >> np.uint64(11)) + 1.0) * TWO_M53


FUNCTIONS = (mix, bounded, row_state, draw, unit, unit_open)  # each only calls those before it


def compile_functions(functions: tuple[Callable, ...], jit: Callable[[Callable], Callable],
                      scope: dict) -> types.SimpleNamespace:
    """Each of ``functions`` (plain Python, each calling only those before it) compiled by ``jit``, as
    attributes of one namespace: each from a copy whose globals are ``scope`` with the compiled
    functions added, so a compiled function calls the compiled versions of the others (and whatever
    compiled functions of the same target ``scope`` names). The kernels' modules that are written once
    for every target (`samplers.kernels.labor_rows`, `samplers.kernels.weighted_short`) compile with it."""
    scope = dict(scope)
    compiled = {}
    for fn in functions:
        copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
        compiled[fn.__name__] = scope[fn.__name__] = jit(copy)
    return types.SimpleNamespace(**compiled)


def compile_for(jit: Callable[[Callable], Callable]) -> types.SimpleNamespace:
    """Every function of `FUNCTIONS` compiled by ``jit``, as attributes of one namespace (a compiled
    `draw` calls the compiled `mix` of the same target; see `compile_functions`)."""
    return compile_functions(FUNCTIONS, jit, globals())


def mixed_seed(seed: int, other: int) -> int:
    """A seed in [0, 2**63) derived from ``seed`` and ``other`` (numpy's ``SeedSequence``; ``other`` taken
    mod 2**64): the adapters' one rule for a seed of their own per DataLoader worker (``other``: the
    worker's ``torch.initial_seed()``) or per rebuilt sampler (``other``: its generation).

    Raises
    ------
    ValueError
        ``seed`` is negative (``SeedSequence`` takes non-negative entropy).
    """
    return int(np.random.SeedSequence([seed, other % 2**64]).generate_state(1, np.uint64)[0]) >> 1
