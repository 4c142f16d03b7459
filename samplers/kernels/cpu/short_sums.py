"""The subtract-and-count pass of weighted short rows on the CPU, as whole-vector operations.

A short row (`samplers.kernels.weighted_short`, at most 64 positions) keeps float64 running sums
acc[0:d]; each output subtracts the last chosen weight ``wp`` from acc[p:d] and counts the entries of
acc[0:d] that are <= x, and that count is the output's position, which the next output's pass waits
for. `subtract_count` does the pass over 8-lane chunks up to d rounded up to a multiple of 8: per chunk
one load, subtraction, store and compare and a population count of the compare's 8 bits, the counts
added in pairs: the same subtractions and comparisons as the plain loop
`samplers.kernels.weighted_short.subtract_count` (the GPU's), with no loop, no lane mask and no chain
of mask concatenations on that wait. The lanes from d to the next multiple of 8 hold NaN (which is
never <= x and stays NaN), as `start_row` leaves them; plain, not masked, stores, so the next output's
load takes them straight from the store. `start_row` and `chosen_weight` are the CPU's versions of
those of `weighted_short` (`compile_for` compiles them in their place): the sums start as a copy of the
row's prefix sums (`fill_row`) and the weights sit beside them widened to float64, so a step's chosen
weight is one load. `count_le` and `count_le64` are the count alone, for the prefix sums that rejection
searches (`samplers.kernels.cpu.weighted`).

>>> p = subtract_count(acc, d, p, wp, x)  # numba code only
>>> c = count_le(prefix, lo, 64, x)
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from samplers.kernels.reference import SHORT_ROW_MAX

__all__ = ["chosen_weight", "count_le", "count_le64", "fill_row", "start_row", "subtract_count"]

def _splat(builder, value, vector_type):
    undef = ir.Constant(vector_type, ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, undef, zeros)


_F64x8 = ir.VectorType(ir.DoubleType(), 8)
_I64x8 = ir.VectorType(ir.IntType(64), 8)
_LANES = ir.Constant(_I64x8, list(range(8)))


def _chunk(builder, data, offset, j: int):
    """A pointer to the 8 float64 entries from data[offset + 8 j] (``offset`` an i64 value or None)."""
    at = ir.Constant(ir.IntType(64), 8 * j)
    if offset is not None:
        at = builder.add(offset, at)
    return builder.bitcast(builder.gep(data, [at]), _F64x8.as_pointer())


def _below(builder, sums, j: int, n, x):
    """The i64 count of the lanes of chunk j (8 float64 ``sums``, positions 8 j...) that are <= ``x`` and,
    unless ``n`` is None, at a position below ``n``: a compare and a population count of its 8 bits."""
    below = builder.fcmp_ordered("<=", sums, _splat(builder, x, _F64x8))
    if n is not None:
        lane = builder.add(_LANES, ir.Constant(_I64x8, [8 * j] * 8))
        below = builder.and_(builder.icmp_signed("<", lane, _splat(builder, n, _I64x8)), below)
    return builder.zext(builder.ctpop(builder.bitcast(below, ir.IntType(8))), ir.IntType(64))


def _added(builder, counts):
    """The sum of the i64 ``counts``, added in pairs (a tree, not a chain)."""
    while len(counts) > 1:
        counts = [builder.add(counts[i], counts[i + 1]) if i + 1 < len(counts) else counts[i]
                  for i in range(0, len(counts), 2)]
    return counts[0]


def _pass_codegen(chunks: int):
    def codegen(context, builder, signature, args):
        acc, d, p, wp, x = args
        data = context.make_array(signature.args[0])(context, builder, acc).data
        counts = []
        for j in range(chunks):
            ptr = _chunk(builder, data, None, j)
            sums = builder.load(ptr, align=8)
            after = builder.icmp_signed(">=", builder.add(_LANES, ir.Constant(_I64x8, [8 * j] * 8)),
                                        _splat(builder, p, _I64x8))
            # acc - (wp after p, else +0.0): the same numbers as a select of acc - wp (x - 0.0 is x), and
            # a store of every lane; LLVM makes a select between the loaded and the new values a masked
            # store, which the next output's load cannot take straight from the store
            zero = ir.Constant(_F64x8, [0.0] * 8)
            sums = builder.fsub(sums, builder.select(after, _splat(builder, wp, _F64x8), zero))
            builder.store(sums, ptr, align=8)
            counts.append(_below(builder, sums, j, None, x))
        return _added(builder, counts)

    return codegen


def _chunks_pass(chunks: int):
    @intrinsic
    def chunks_pass(typingctx, acc, d, p, wp, x):  # pragma: no cover - compiled
        sig = types.int64(acc, types.int64, types.int64, types.float64, types.float64)
        return sig, _pass_codegen(chunks)

    return chunks_pass


_p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8 = (_chunks_pass(m) for m in range(1, 9))


@nb.njit(inline="always", cache=True)
def subtract_count(acc, d, p, wp, x):
    """Subtract ``wp`` from acc[p:d] and return the number of acc[0:d] <= x (float64 ``acc`` of at least
    64 entries, whose entries from d to the next multiple of 8 are NaN, as `start_row` leaves them;
    0 < d <= 64, p >= 0, ``wp`` a float64; numba code only)."""
    m = (d + 7) >> 3
    if m <= 4:
        if m <= 2:
            return _p1(acc, d, p, wp, x) if m == 1 else _p2(acc, d, p, wp, x)
        return _p3(acc, d, p, wp, x) if m == 3 else _p4(acc, d, p, wp, x)
    if m <= 6:
        return _p5(acc, d, p, wp, x) if m == 5 else _p6(acc, d, p, wp, x)
    return _p7(acc, d, p, wp, x) if m == 7 else _p8(acc, d, p, wp, x)


def _count_codegen(chunks: int, whole: bool = False):
    def codegen(context, builder, signature, args):
        arr, lo, n, x = (*args[:2], None, args[2]) if whole else args
        data = context.make_array(signature.args[0])(context, builder, arr).data
        return _added(builder, [_below(builder, builder.load(_chunk(builder, data, lo, j), align=8), j, n, x)
                                for j in range(chunks)])

    return codegen


def _chunks_count(chunks: int):
    @intrinsic
    def chunks_count(typingctx, arr, lo, n, x):  # pragma: no cover - compiled
        sig = types.int64(arr, types.int64, types.int64, types.float64)
        return sig, _count_codegen(chunks)

    return chunks_count


_c1, _c2, _c3, _c4, _c5, _c6, _c7, _c8 = (_chunks_count(m) for m in range(1, 9))


@nb.njit(inline="always", cache=True)
def count_le(arr, lo, n, x):
    """The number of arr[lo:lo + n] <= x (float64 ``arr``; 0 < n <= 64), reading the entries from lo up
    to the next multiple of 8 of n, which must all lie inside ``arr`` (numba code only)."""
    m = (n + 7) >> 3
    if m <= 4:
        if m <= 2:
            return _c1(arr, lo, n, x) if m == 1 else _c2(arr, lo, n, x)
        return _c3(arr, lo, n, x) if m == 3 else _c4(arr, lo, n, x)
    if m <= 6:
        return _c5(arr, lo, n, x) if m == 5 else _c6(arr, lo, n, x)
    return _c7(arr, lo, n, x) if m == 7 else _c8(arr, lo, n, x)


@intrinsic
def _count64(typingctx, arr, lo, x):  # pragma: no cover - compiled
    return types.int64(arr, types.int64, types.float64), _count_codegen(8, whole=True)


@nb.njit(inline="always", cache=True)
def count_le64(arr, lo, x):
    """The number of arr[lo:lo + 64] <= x (float64 ``arr``, the 64 entries from lo inside it): `count_le`
    of 64 entries, with no lane left out."""
    return _count64(arr, lo, x)


def _fill_codegen(context, builder, signature, args):
    acc, prefix, weights, s, c, d = args
    f64, f32, i64 = ir.DoubleType(), ir.FloatType(), ir.IntType(64)
    vf, vw, vi = ir.VectorType(f64, 8), ir.VectorType(f32, 8), ir.VectorType(i64, 8)
    at = builder.add(s, c)
    acc_data = context.make_array(signature.args[0])(context, builder, acc).data
    prefix_data = context.make_array(signature.args[1])(context, builder, prefix).data
    weights_data = context.make_array(signature.args[2])(context, builder, weights).data
    sums = builder.load(builder.bitcast(builder.gep(prefix_data, [at]), vf.as_pointer()), align=8)
    wts = builder.load(builder.bitcast(builder.gep(weights_data, [at]), vw.as_pointer()), align=4)
    inside = builder.icmp_signed("<", ir.Constant(vi, list(range(8))), _splat(builder, builder.sub(d, c), vi))
    nan = ir.Constant(vf, [float("nan")] * 8)
    low = builder.bitcast(builder.gep(acc_data, [c]), vf.as_pointer())
    builder.store(builder.select(inside, sums, nan), low, align=8)
    high = builder.gep(acc_data, [builder.add(c, ir.Constant(i64, SHORT_ROW_MAX))])
    builder.store(builder.fpext(wts, vf), builder.bitcast(high, vf.as_pointer()), align=8)
    return context.get_dummy_value()


@intrinsic
def _fill8(typingctx, acc, prefix, weights, s, c, d):  # pragma: no cover - compiled
    """acc[c:c + 8] = prefix[s + c:s + c + 8] where c + lane < d, else NaN; acc[SHORT_ROW_MAX + c:][:8] =
    the float64 weights[s + c:s + c + 8]: two loads, two stores."""
    return types.void(acc, prefix, weights, types.int64, types.int64, types.int64), _fill_codegen


@nb.njit(inline="always", cache=True)
def fill_row(acc, prefix, weights, s, d):
    """acc[0:d] = prefix[s:s + d], NaN in acc[d:n] (n: d rounded up to a multiple of 8, the lanes
    `subtract_count` reads), and the float64 weights[s:s + d] in acc[SHORT_ROW_MAX:SHORT_ROW_MAX + d]:
    8-lane loads and stores (a pass's loads then take them straight from the stores), reading up to 7
    entries past the row, or a loop where those would run past the end of the arrays (numba code
    only)."""
    if s + ((d + 7) & ~7) <= prefix.shape[0]:
        for c in range(0, d, 8):
            _fill8(acc, prefix, weights, s, c, d)
        return
    for i in range((d + 7) & ~7):
        acc[i] = prefix[s + i] if i < d else np.nan
        if i < d:
            acc[SHORT_ROW_MAX + i] = np.float64(weights[s + i])


def start_row(weights, prefix, excl, q, b, s, d, acc):
    """`samplers.kernels.weighted_short.start_row` on the CPU (plain Python that `compile_for` compiles
    in its place, in that module's scope plus `fill_row`): the running sums into acc[0:d] (copied from
    the prefix sums without excluded positions: the same numbers, with no chain of additions to wait
    on), NaN after them in the lanes `subtract_count` reads past d (which then never count), and the
    row's weights widened to float64 into acc[SHORT_ROW_MAX:] (`chosen_weight`)."""
    one = np.uint64(1)
    gone = np.uint64(0)
    for x in range(q, b):
        gone |= one << np.uint64(excl[x] - s)
    fill_row(acc, prefix, weights, s, d)  # noqa: F821 - in compile_for's scope
    if b != q:
        running_sums(weights, s, d, gone, acc)  # noqa: F821 - weighted_short's, in its scope
    return gone


def chosen_weight(weights, s, p, acc):
    """`samplers.kernels.weighted_short.chosen_weight` on the CPU: the float64 copy `start_row` made."""
    return acc[np.uint64(SHORT_ROW_MAX + p)]  # unsigned: no wrap-around test on the chain
