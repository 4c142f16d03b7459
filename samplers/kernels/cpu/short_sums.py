"""The subtract-and-count pass of weighted short rows on the CPU, as whole-vector operations.

A short row (`samplers.kernels.weighted_short`, at most 64 positions) keeps float64 running sums
acc[0:d]; each output subtracts the last chosen weight ``wp`` from acc[p:d] and counts the entries of
acc[0:d] that are <= x, and that count is the output's position, which the next output's pass waits
for. `subtract_count` does the pass as one load, subtraction, store and compare over the first 8, 16, 32 or
64 lanes (the fewest that hold d) and a population count of the compare's bit mask, lanes at or after
d left out of it: the same subtractions and comparisons as the plain loop
`samplers.kernels.weighted_short.subtract_count` (the GPU's), with no loop and no sum of per-lane
counts on that wait. Lanes d and above are read and overwritten, so ``acc`` has 64 entries (plain,
not masked, stores: the next output's load takes them straight from the store). `count_le` is the
count alone, for the prefix sums that rejection searches (`samplers.kernels.cpu.weighted`).

>>> p = subtract_count(acc, d, p, wp, x)  # numba code only
>>> c = count_le(prefix, lo, 64, x)
"""

from __future__ import annotations

import numba as nb
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["count_le", "subtract_count"]

def _splat(builder, value, vector_type):
    undef = ir.Constant(vector_type, ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, undef, zeros)


def _count_below(builder, sums, n, x, lanes: int):
    """The number (i64) of the first ``n`` lanes of the float64 vector ``sums`` that are <= ``x``: one
    compare, the lanes from ``n`` on masked off, and a population count of the bit mask."""
    vi = ir.VectorType(ir.IntType(64), lanes)
    lane = ir.Constant(vi, list(range(lanes)))
    inside = builder.icmp_signed("<", lane, _splat(builder, n, vi))
    below = builder.and_(inside, builder.fcmp_ordered("<=", sums, _splat(builder, x, sums.type)))
    count = builder.ctpop(builder.bitcast(below, ir.IntType(lanes)))
    return count if lanes == 64 else builder.zext(count, ir.IntType(64))


def _pass_codegen(lanes: int):
    def codegen(context, builder, signature, args):
        acc, d, p, wp, x = args
        ary = context.make_array(signature.args[0])(context, builder, acc)
        f64, i64 = ir.DoubleType(), ir.IntType(64)
        vf = ir.VectorType(f64, lanes)
        vi = ir.VectorType(i64, lanes)
        ptr = builder.bitcast(ary.data, vf.as_pointer())
        lane = ir.Constant(vi, list(range(lanes)))
        sums = builder.load(ptr, align=8)
        after = builder.icmp_signed(">=", lane, _splat(builder, p, vi))
        # acc - (wp after p, else +0.0): the same numbers as a select of acc - wp (x - 0.0 is x), and a
        # store of every lane; LLVM makes a select between the loaded and the new values a masked store,
        # which the next output's load cannot take straight from the store
        zero = ir.Constant(vf, [0.0] * lanes)
        sums = builder.fsub(sums, builder.select(after, _splat(builder, wp, vf), zero))
        builder.store(sums, ptr, align=8)
        return _count_below(builder, sums, d, x, lanes)

    return codegen


def _lanes_pass(lanes: int):
    @intrinsic
    def lanes_pass(typingctx, acc, d, p, wp, x):  # pragma: no cover - compiled
        sig = types.int64(acc, types.int64, types.int64, types.float64, types.float64)
        return sig, _pass_codegen(lanes)

    return lanes_pass


_pass8, _pass16, _pass32, _pass64 = (_lanes_pass(n) for n in (8, 16, 32, 64))


@nb.njit(inline="always", cache=True)
def subtract_count(acc, d, p, wp, x):
    """Subtract ``wp`` from acc[p:d] and return the number of acc[0:d] <= x (float64 ``acc`` of 64 entries,
    whose entries from d on are scratch; 0 < d <= 64, p >= 0, ``wp`` a float64; numba code only)."""
    if d <= 8:
        return _pass8(acc, d, p, wp, x)
    if d <= 16:
        return _pass16(acc, d, p, wp, x)
    if d <= 32:
        return _pass32(acc, d, p, wp, x)
    return _pass64(acc, d, p, wp, x)


def _count_codegen(lanes: int):
    def codegen(context, builder, signature, args):
        arr, lo, n, x = args
        ary = context.make_array(signature.args[0])(context, builder, arr)
        vf = ir.VectorType(ir.DoubleType(), lanes)
        ptr = builder.bitcast(builder.gep(ary.data, [lo]), vf.as_pointer())
        sums = builder.load(ptr, align=8)
        return _count_below(builder, sums, n, x, lanes)

    return codegen


def _lanes_count(lanes: int):
    @intrinsic
    def lanes_count(typingctx, arr, lo, n, x):  # pragma: no cover - compiled
        sig = types.int64(arr, types.int64, types.int64, types.float64)
        return sig, _count_codegen(lanes)

    return lanes_count


_count8, _count16, _count32, _count64 = (_lanes_count(n) for n in (8, 16, 32, 64))


@nb.njit(inline="always", cache=True)
def count_le(arr, lo, n, x):
    """The number of arr[lo:lo + n] <= x (float64 ``arr``; 0 < n <= 64), reading the 8, 16, 32 or 64
    entries from lo (the fewest that hold n), which must all lie inside ``arr`` (numba code only)."""
    if n <= 8:
        return _count8(arr, lo, n, x)
    if n <= 16:
        return _count16(arr, lo, n, x)
    if n <= 32:
        return _count32(arr, lo, n, x)
    return _count64(arr, lo, n, x)
