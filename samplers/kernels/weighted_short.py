"""Weighted short rows, written once and compiled for the CPU and the GPU kernels.

A short row (the reference's `_choose_short`) has at most SHORT_ROW_MAX (64) positions, is drawn
without replacement, and SHORT_SHARE * k exceeds its eligible count: its c outputs are c successive
draws over running sums ``acc`` of the weights not chosen yet, with no rejection. Positions are bits
relative to the row start s of a uint64 mask; the chosen ones are written in increasing order.

As `samplers.kernels.rng`, the functions below are plain Python that `compile_for` compiles with a
target's decorator (`samplers.kernels.cpu.weighted`, `samplers.kernels.cuda.weighted`), so both
devices run the same additions, subtractions and comparisons in the same order and choose the same
edges.

>>> short = compile_for(numba.njit(_nrt=False), rng, samplers.kernels.cpu.bits.lowest_bit_index)
>>> short.short_row(weights, excl, a, b, s, e, state0, c, acc, pos, o)
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np

from samplers.kernels.cpu.bits import lowest_bit_index
from samplers.kernels.reference import REBASE_FRACTION

# plain Python here; compile_for swaps in the target's compiled ones
from samplers.kernels.rng import compile_functions, draw, unit

__all__ = ["compile_for"]


def available(weights, s, gone, i):
    """Whether row position i (CSC position s + i) has weight > 0 and is not in the mask ``gone``."""
    return weights[s + i] > 0 and (gone >> np.uint64(i)) & np.uint64(1) == 0


def running_sums(weights, s, d, gone, acc):
    """acc[0:d]: the float64 running sums, in position order, of the weights of the row's available
    positions (the others add nothing)."""
    total = 0.0
    for i in range(d):
        if available(weights, s, gone, i):
            total += np.float64(weights[s + i])
        acc[i] = total


def advance(weights, s, d, gone, p):
    """The first available position >= p of the row, else the last available one (a draw that rounding
    put on a chosen position, or past the row)."""
    for i in range(p, d):
        if available(weights, s, gone, i):
            return i
    i = d - 1
    while not available(weights, s, gone, i):
        i -= 1
    return i


def subtract_count(acc, d, p, wp, x):
    """Subtract wp from acc[p:d] and return the number of acc[0:d] <= x, in one branch-free pass (the
    CPU vectorises it; the unsigned index keeps numba's negative-index wrap-around out of it)."""
    c = 0
    for i in range(np.uint64(0), np.uint64(d)):
        a = acc[i] - (wp if np.int64(i) >= p else 0.0)
        acc[i] = a
        c += a <= x
    return c


def short_row(weights, excl, q, b, s, e, state0, c, acc, pos, o):
    """The c outputs of short row [s, e) with excluded positions ``excl[q:b]``, written to pos[o:o + c] in
    increasing order; draw t (t = 1..c) of the row's stream picks output t. Without excluded positions the
    running sums are the row's prefix sums (`weight_prefix`'s additions, summed here from the float32
    weights: the same numbers from half the bytes); choosing p subtracts its weight from acc[p:] in the
    same pass that counts the next draw's position; the sums are summed afresh when they fall below
    REBASE_FRACTION of the last fresh total. ``acc``: float64 scratch of at least e - s entries."""
    d = e - s
    one = np.uint64(1)
    gone = np.uint64(0)  # excluded, then chosen positions
    for x in range(q, b):
        gone |= one << np.uint64(excl[x] - s)
    if b == q:
        total = 0.0
        for i in range(d):
            total += np.float64(weights[s + i])
            acc[i] = total
    else:
        running_sums(weights, s, d, gone, acc)
    total = acc[d - 1]
    base = total
    chosen = np.uint64(0)
    t = np.uint64(0)
    p = d  # the last chosen position (none yet: nothing to subtract)
    wp = 0.0
    for _ in range(c):
        total = total - wp  # what the pass below leaves in acc[d - 1]
        if total < base * REBASE_FRACTION:
            running_sums(weights, s, d, gone, acc)
            total = acc[d - 1]
            base = total
            p = d
        t += one
        x = unit(draw(state0, t)) * total
        p = subtract_count(acc, d, p, wp, x)
        if p == d or (gone >> np.uint64(p)) & one != 0:  # rounding (rare): the next available position
            p = advance(weights, s, d, gone, p)
        bit = one << np.uint64(p)
        gone |= bit
        chosen |= bit
        wp = np.float64(weights[s + p])
    w = o
    while chosen:
        pos[w] = s + lowest_bit_index(chosen)
        w += 1
        chosen &= chosen - one


FUNCTIONS = (available, running_sums, advance, subtract_count, short_row)  # each calls only those before


def compile_for(jit: Callable[[Callable], Callable], rng: types.SimpleNamespace,
                lowest_bit: Callable) -> types.SimpleNamespace:
    """Every function of `FUNCTIONS` compiled by ``jit``, calling ``rng``'s compiled stream (the
    namespace `samplers.kernels.rng.compile_for` returns for the same target) and the target's
    compiled ``lowest_bit`` (the index of a non-zero uint64's lowest set bit, as
    `samplers.kernels.cpu.bits.lowest_bit_index`)."""
    return compile_functions(FUNCTIONS, jit, dict(globals(), draw=rng.draw, unit=rng.unit,
                                                  lowest_bit_index=lowest_bit))
