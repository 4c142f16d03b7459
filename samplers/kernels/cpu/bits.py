"""Bit tricks of the CPU kernels: the lowest set bit, and a row's chosen positions emitted in order.

A row's chosen positions are kept as set bits (of a register mask or a bitmap of the row); emitting the
set bits word by word writes them sorted, with no sort.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["BITMAP_MAX", "SCAN_MAX", "emit_bitmap", "emit_in_order", "lowest_bit_index", "trailing_zeros"]

BITMAP_MAX = 4096  # Floyd on rows of degree 65..4096 keeps the chosen slots in a bitmap
SCAN_MAX = 64  # above 4096, Floyd scans the chosen slots up to this fanout, hashes above


def _debruijn_table() -> np.ndarray:
    table = np.zeros(64, dtype=np.int64)
    for i in range(64):
        table[((_DEBRUIJN64_INT << i) & ((1 << 64) - 1)) >> 58] = i
    return table


_DEBRUIJN64_INT = 0x03F79D71B4CB0A89
_DEBRUIJN64 = np.uint64(_DEBRUIJN64_INT)
_DEBRUIJN_TABLE = _debruijn_table()


@nb.njit(inline="always", cache=True)
def lowest_bit_index(x):
    """Index of the lowest set bit of a non-zero uint64 (de Bruijn multiplication, no branch)."""
    return _DEBRUIJN_TABLE[((x & (~x + np.uint64(1))) * _DEBRUIJN64) >> np.uint64(58)]


@intrinsic
def trailing_zeros(typingctx, x):  # pragma: no cover - compiled
    """Index of the lowest set bit of a non-zero uint64, as int64 (``llvm.cttz``: one instruction where
    the CPU has one, as x86's ``tzcnt``); numba code only."""

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))

    return types.int64(types.uint64), codegen


@nb.njit(nogil=True, cache=True)
def emit_bitmap(bits, d, s, pos, w):
    """Write the positions s + i of the set bits i < d of ``bits`` in increasing order into pos[w:], and
    clear ``bits`` (a row's chosen set, kept as a bitmap)."""
    one = np.uint64(1)
    for word in range((d + 63) >> 6):
        x = bits[word]
        bits[word] = 0
        while x:
            pos[w] = s + (word << 6) + lowest_bit_index(x)
            w += 1
            x &= x - one


@nb.njit(nogil=True, cache=True)
def emit_in_order(chosen, c, s, d, bitmap, pos, o):
    """Write the c chosen CSC positions of a row [s, s + d) to pos[o:o + c] in increasing order: through
    a bitmap of the row (rows up to 4096 edges; no sort), or by insertion sort."""
    one = np.uint64(1)
    if d <= BITMAP_MAX:
        for j in range(c):
            t = chosen[j] - s
            bitmap[t >> 6] |= one << np.uint64(t & 63)
        w = o
        for word in range((d + 63) >> 6):
            x = bitmap[word]
            bitmap[word] = 0
            while x:
                pos[w] = s + (word << 6) + lowest_bit_index(x)
                w += 1
                x &= x - one
    else:
        for j in range(c):
            x = chosen[j]
            k = o + j
            while k > o and pos[k - 1] > x:
                pos[k] = pos[k - 1]
                k -= 1
            pos[k] = x
