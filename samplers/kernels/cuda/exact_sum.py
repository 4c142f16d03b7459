"""An exact sum of non-negative float64 values on the GPU, rounded once as ``math.fsum`` rounds it: the
values' binary digits go to 32-bit words held in int64 (`SUM_WORDS` of them), added with integer atomics,
so the sum does not depend on the order of the adds (threads, blocks), then `round_exact` rounds it to the
nearest float64, ties to even. LABOR's fixed point tests its expected source count on it
(`samplers.kernels.cuda.labor`), so the device stops where the CPU's ``math.fsum`` test stops.

>>> acc = cuda.to_device(np.zeros(SUM_WORDS, np.int64))
>>> sum_exact[2, 32](values, running, acc)   # running: device int64 [1] holding 0
>>> # in a kernel: total = round_exact(acc)   (acc cleared)

References
----------
Kulisch's long accumulator, as in Collange, Defour, Graillat and Iakymchuk, "Numerical reproducibility for
the parallel reduction on multi- and many-core architectures" (Parallel Computing, 2015; ExBLAS).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda

__all__ = ["SUM_WORDS", "add_exact", "round_exact", "sum_exact"]

SUM_WORDS = 68
"""32-bit digits of the exact sum of up to 2**30 non-negative doubles (`add_exact`)."""
_MASK32 = np.int64(0xFFFFFFFF)
_TWO_60 = 2.0 ** 60
_TWO_M60 = 2.0 ** -60


@cuda.jit(device=True)
def add_exact(acc, x):  # pragma: no cover - device
    """acc += x exactly: x (a non-negative finite float64) is m 2**(p - 1074) with m < 2**53 and p >= 0;
    its digits go to acc[p // 32 ...] (32 bits each, atomically: a block's threads share acc)."""
    if not x > 0:
        return
    f, e = math.frexp(x)  # x = f 2**e, 0.5 <= f < 1
    m = np.int64(f * 9007199254740992.0)  # f 2**53: an integer below 2**53
    p = e + 1021
    if p < 0:  # a subnormal: m's low bits are zeros
        m = m >> -p
        p = 0
    w = p >> 5
    sh = p & 31
    lo = (m & _MASK32) << sh
    hi = (m >> 32) << sh
    cuda.atomic.add(acc, w, lo & _MASK32)
    cuda.atomic.add(acc, w + 1, (lo >> 32) + (hi & _MASK32))
    cuda.atomic.add(acc, w + 2, hi >> 32)


@cuda.jit(device=True)
def _times_pow2(x, k):  # pragma: no cover - device
    """x 2**k, exact wherever the result is representable (steps of 2**60, one direction)."""
    while k >= 60:
        x *= _TWO_60
        k -= 60
    while k <= -60:
        x *= _TWO_M60
        k += 60
    if k >= 0:
        return x * np.float64(np.int64(1) << k)
    return x / np.float64(np.int64(1) << -k)


@cuda.jit(device=True)
def round_exact(acc):  # pragma: no cover - device
    """The float64 nearest (ties to even) to the exact sum held by ``acc`` (value sum acc[w] 2**(32 w -
    1074)), as ``math.fsum`` rounds it; ``acc`` is cleared."""
    carry = np.int64(0)
    top = -1
    for w in range(SUM_WORDS):
        v = acc[w] + carry
        acc[w] = v & _MASK32
        carry = v >> 32
        if acc[w] != 0:
            top = w
    out = 0.0
    if top >= 0:
        h = 32 * top + 31
        while (acc[h >> 5] >> (h & 31)) & 1 == 0:
            h -= 1
        if h <= 52:  # fits 53 bits: exact (a subnormal, or the smallest normal binade)
            out = _times_pow2(np.float64(acc[0] | (acc[1] << 32)), -1074)
        else:
            shift = h - 52
            m = np.int64(0)
            for b in range(h, shift - 1, -1):
                m = (m << 1) | ((acc[b >> 5] >> (b & 31)) & 1)
            r = shift - 1
            half = (acc[r >> 5] >> (r & 31)) & 1
            sticky = (acc[r >> 5] & ((np.int64(1) << (r & 31)) - 1)) != 0
            for w in range(r >> 5):
                if acc[w] != 0:
                    sticky = True
            if half == 1 and (sticky or (m & 1) == 1):
                m += 1
                if m == np.int64(9007199254740992):
                    m = m >> 1
                    shift += 1
            out = _times_pow2(np.float64(m), shift - 1074)
    for w in range(SUM_WORDS):
        acc[w] = 0
    return out


@cuda.jit
def sum_exact(values, status, acc):  # pragma: no cover - device
    """Add ``values`` (non-negative finite float64 [n]) to the exact sum ``acc`` (int64 [`SUM_WORDS`],
    `add_exact`): per block in shared memory, then one atomic add per digit (integer adds: the same sum in
    any order). Where ``status[0]`` is not 0 (the caller's computation has stopped: a LABOR fixed point no
    longer `samplers.kernels.cuda.labor.RUNNING`) every thread returns at once and ``acc`` is unchanged."""
    if status[0] != 0:
        return
    part = cuda.shared.array(SUM_WORDS, numba.int64)
    w = cuda.threadIdx.x
    while w < SUM_WORDS:
        part[w] = 0
        w += cuda.blockDim.x
    cuda.syncthreads()
    i = cuda.grid(1)
    while i < values.shape[0]:
        add_exact(part, values[i])
        i += cuda.gridsize(1)
    cuda.syncthreads()
    w = cuda.threadIdx.x
    while w < SUM_WORDS:
        if part[w] != 0:
            cuda.atomic.add(acc, w, part[w])
        w += cuda.blockDim.x
