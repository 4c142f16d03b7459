"""Weighted short rows, written once and compiled for the CPU and the GPU kernels.

A short row (the reference's `_choose_short`) has at most SHORT_ROW_MAX (64) positions, is drawn
without replacement, and SHORT_SHARE * k exceeds its eligible count: its c outputs are c successive
draws over running sums ``acc`` of the weights not chosen yet, with no rejection. Positions are bits
relative to the row start s of a uint64 mask; the chosen ones are written in increasing order.
`is_short` is the selection test both targets' kernels ask. A row is `start_row`, one `step` per
output, `emit`: `short_row` runs one row (the GPU's thread), `short_pair` two rows with their steps
interleaved (a CPU core overlaps the two rows' chains of dependent steps).

As `samplers.kernels.rng`, the functions below are plain Python that `compile_for` compiles with a
target's decorator (`samplers.kernels.cpu.weighted`, `samplers.kernels.cuda.weighted`), so both
devices run the same additions, subtractions and comparisons in the same order and choose the same
edges. Three steps are the target's, each computing the same numbers as the plain version here: the
pass that subtracts the last chosen weight and counts the next draw's position (the plain loop
`subtract_count` on the GPU, whole-vector operations on the CPU: `samplers.kernels.cpu.short_sums`),
and, where a target gives them, `start_row` and `chosen_weight` (the CPU's copy the row's prefix sums
``P`` and its weights widened to float64 into its scratch, so that no step waits on a conversion).

>>> device = numba.cuda.jit(device=True)
>>> short = compile_for(device, rng, lowest_bit, device(subtract_count))
>>> short.short_row(weights, prefix, excl, a, b, s, e, state0, c, acc, pos, o)
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np

from samplers.kernels.cpu.bits import lowest_bit_index
from samplers.kernels.reference import REBASE_FRACTION, SHORT_ROW_MAX, SHORT_SHARE

# plain Python here; compile_for swaps in the target's compiled ones
from samplers.kernels.rng import compile_functions, draw, unit

__all__ = ["compile_for"]


def is_short(replace, s, e, c, eligible):
    """Whether row [s, e) with c outputs and ``eligible`` eligible positions is short, drawn by
    `short_row`: without replacement, at most SHORT_ROW_MAX positions, and SHORT_SHARE * c above its
    eligible count (where rejection would reject often). Both targets' kernels ask this one test."""
    return not replace and e - s <= SHORT_ROW_MAX and SHORT_SHARE * c > eligible


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
    GPU's pass; the unsigned index keeps numba's negative-index wrap-around out of it)."""
    c = 0
    for i in range(np.uint64(0), np.uint64(d)):
        a = acc[i] - (wp if np.int64(i) >= p else 0.0)
        acc[i] = a
        c += a <= x
    return c


def start_row(weights, prefix, excl, q, b, s, d, acc):
    """Row [s, s + d)'s running sums into acc[0:d], and the mask of its excluded positions ``excl[q:b]``.
    Without excluded positions the sums are the row's prefix sums prefix[s:s + d] (`weight_prefix`'s
    additions, summed here from the float32 weights: the same numbers from half the bytes)."""
    one = np.uint64(1)
    gone = np.uint64(0)
    for x in range(q, b):
        gone |= one << np.uint64(excl[x] - s)
    if b == q:
        total = 0.0
        for i in range(d):
            total += np.float64(weights[s + i])
            acc[i] = total
    else:
        running_sums(weights, s, d, gone, acc)
    return gone


def chosen_weight(weights, s, p, acc):
    """The float64 weight of row position p (CSC position s + p), the one a step subtracts."""
    return np.float64(weights[np.uint64(s + p)])


def step(weights, s, d, acc, u, gone, total, base, p, wp):
    """One output of row [s, s + d) for the draw ``u`` in [0, 1): returns (its position, the running sums'
    total, the last fresh total). ``gone``: the excluded and chosen positions; ``total``: the sums' last
    entry before subtracting ``wp``, the weight of the last chosen position ``p`` (p = d and wp = 0
    before the first output); ``base``: the total when the sums were last summed afresh."""
    total = total - wp  # what the pass below leaves in acc[d - 1]
    if total < base * REBASE_FRACTION:
        running_sums(weights, s, d, gone, acc)
        total = acc[d - 1]
        base = total
        p = d
    x = u * total
    p = subtract_count(acc, d, p, wp, x)
    if p == d or (gone >> np.uint64(p)) & np.uint64(1) != 0:  # rounding (rare): the next available position
        p = advance(weights, s, d, gone, p)
    return p, total, base


def emit(chosen, s, c, pos, o):
    """Write the positions s + i of the c set bits i of ``chosen`` to pos[o:o + c] in increasing order."""
    for j in range(o, o + c):
        pos[j] = s + lowest_bit_index(chosen)
        chosen &= chosen - np.uint64(1)


def short_row(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o):
    """The c outputs of short row [s, e) with excluded positions ``excl[q:b]``, written to pos[o:o + c] in
    increasing order; draw t (t = 1..c) of the row's stream picks output t (`step`): choosing p subtracts
    its weight from acc[p:] in the pass that counts the next draw's position, and the sums are summed
    afresh when they fall below REBASE_FRACTION of the last fresh total. ``prefix``: the per-row prefix
    sums (`weight_prefix`); ``acc``: float64 scratch of the target's size (SHORT_ROW_MAX entries here)."""
    d = e - s
    one = np.uint64(1)
    gone = start_row(weights, prefix, excl, q, b, s, d, acc)
    total = acc[d - 1]
    base = total
    chosen = np.uint64(0)
    p = d
    wp = 0.0
    for t in range(1, c + 1):
        p, total, base = step(weights, s, d, acc, unit(draw(state0, t)), gone, total, base, p, wp)
        bit = one << np.uint64(p)
        gone |= bit
        chosen |= bit
        wp = chosen_weight(weights, s, p, acc)
    emit(chosen, s, c, pos, o)


def short_pair(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o, q2, b2, s2, e2, state2, c2, acc2,
               o2):
    """`short_row` of two rows at once (the second's arguments suffixed 2), their steps interleaved:
    each row's outputs form one chain of dependent steps, and a core's out-of-order execution runs the
    two chains side by side."""
    d = e - s
    d2 = e2 - s2
    one = np.uint64(1)
    gone = start_row(weights, prefix, excl, q, b, s, d, acc)
    gone2 = start_row(weights, prefix, excl, q2, b2, s2, d2, acc2)
    total = acc[d - 1]
    total2 = acc2[d2 - 1]
    base = total
    base2 = total2
    chosen = np.uint64(0)
    chosen2 = np.uint64(0)
    p = d
    p2 = d2
    wp = 0.0
    wp2 = 0.0
    for t in range(1, max(c, c2) + 1):
        if t <= c:
            p, total, base = step(weights, s, d, acc, unit(draw(state0, t)), gone, total, base, p, wp)
            bit = one << np.uint64(p)
            gone |= bit
            chosen |= bit
            wp = chosen_weight(weights, s, p, acc)
        if t <= c2:
            p2, total2, base2 = step(weights, s2, d2, acc2, unit(draw(state2, t)), gone2, total2, base2, p2,
                                     wp2)
            bit2 = one << np.uint64(p2)
            gone2 |= bit2
            chosen2 |= bit2
            wp2 = chosen_weight(weights, s2, p2, acc2)
    emit(chosen, s, c, pos, o)
    emit(chosen2, s2, c2, pos, o2)


# each calls only those before (and the target's pass)
FUNCTIONS = (is_short, available, running_sums, advance, start_row, chosen_weight, step, emit, short_row,
             short_pair)


def compile_for(jit: Callable[[Callable], Callable], rng: types.SimpleNamespace, lowest_bit: Callable,
                pass_fn: Callable, rows: dict[str, Callable] | None = None,
                helpers: dict[str, Callable] | None = None) -> types.SimpleNamespace:
    """Every function of `FUNCTIONS` compiled by ``jit``, calling ``rng``'s compiled stream (the
    namespace `samplers.kernels.rng.compile_for` returns for the same target), the target's compiled
    ``lowest_bit`` (the index of a non-zero uint64's lowest set bit, as
    `samplers.kernels.cpu.bits.lowest_bit_index`) and the target's compiled ``pass_fn`` (the
    arguments and result of `subtract_count`, and its numbers). ``rows`` may replace `start_row` and
    `chosen_weight` by plain Python functions of the same name, arguments and numbers, compiled here in
    their place with this module's names in scope plus ``helpers`` (the target's compiled functions and
    constants that they call or read, by name).

    Raises
    ------
    ValueError
        ``rows`` names a function other than `start_row` and `chosen_weight`.
    """
    rows = dict(rows or {})
    if set(rows) - {"start_row", "chosen_weight"}:
        raise ValueError(f"rows may replace start_row and chosen_weight, not {sorted(set(rows))}")
    functions = tuple(rows.get(fn.__name__, fn) for fn in FUNCTIONS)
    return compile_functions(functions, jit, dict(globals(), **(helpers or {}), draw=rng.draw, unit=rng.unit,
                                                  lowest_bit_index=lowest_bit, subtract_count=pass_fn))
