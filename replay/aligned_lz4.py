"""The aligned parse: one step as an LZ4 block against its chunk's key, each match at the key's same byte.

The ``"lz4dict"`` chunks of `replay.chunk_encode` store a chunk's first step raw as a key and each later
step as one LZ4 block with the key as dictionary. Steps of a chunk are consecutive frames of one
episode: most of a step's bytes equal the key's byte at the same offset (the background, the maze, the
score), and the bytes that differ are a few short runs (the moving sprites). `encode_aligned` writes the
step as literals for the differing runs and one match for each run of at least ``min_match`` equal
bytes, its offset the row's length (the key's byte at the same position, in LZ4's dictionary mode).
It searches nothing: one pass comparing the step with the key a word at a time, several times
faster than LZ4 HC; its blocks hold as few, long matches as the frames allow, which LZ4 decodes fastest
(its cost is per sequence). The blocks are ordinary LZ4 blocks: ``LZ4_decompress_safe_usingDict``
with the key decodes them, as it decodes LZ4 HC's.

>>> size = encode_aligned(rows, i * row_bytes, rows, 0, row_bytes, MIN_MATCH, dst, at, cap)

References
----------
LZ4 block format (lz4.org: sequences of literals and one match, the end-of-block rules); DeepMind
Reverb's chunkers (the key-frame idea of compressing steps against one step of their chunk).
"""

from __future__ import annotations

import sys

import numba as nb
import numpy as np

from graphrl.kernels.copies import copy_bytes

__all__ = ["ALIGNED", "MIN_MATCH", "encode_aligned"]

ALIGNED = -1  # `replay.chunk_encode`'s level of "lz4dict" for this parse (LZ4 HC's are 1-12, fast mode 0)
MIN_MATCH = 4  # equal runs shorter than this stay literals (LZ4's own minimum is 4)
_LAST_LITERALS = 5  # LZ4: a block ends with at least 5 literals
_MF_LIMIT = 12  # LZ4: the last match starts at least 12 bytes before the block's end
_LITTLE = sys.byteorder == "little"


@nb.njit(cache=True, nogil=True)
def _length(dst, at, v):  # pragma: no cover - numba
    """LZ4's length continuation bytes of ``v`` (the part beyond the token's 15) at ``dst[at:]``."""
    while v >= 255:
        dst[at] = 255
        at += 1
        v -= 255
    dst[at] = v
    return at + 1


@nb.njit(cache=True, nogil=True, inline="always")
def _sequence(src, s0, lit_from, lit_to, match, n, dst, at):  # pragma: no cover - numba
    """One sequence: literals ``src[s0 + lit_from : s0 + lit_to]`` then a match of ``match`` bytes at
    offset ``n`` (none when 0: the block's last literals); returns the byte after it."""
    lit = lit_to - lit_from
    ml = match - 4
    dst[at] = (min(lit, 15) << 4) | (min(ml, 15) if match else 0)
    at += 1
    if lit >= 15:
        at = _length(dst, at, lit - 15)
    copy_bytes(dst, at, src, s0 + lit_from, lit)
    at += lit
    if match:
        dst[at] = n & 0xFF
        dst[at + 1] = (n >> 8) & 0xFF
        at += 2
        if ml >= 15:
            at = _length(dst, at, ml - 15)
    return at


@nb.njit(cache=True, nogil=True, inline="always")
def _next_differing(a, b, src, s0, key, k0, p, n):  # pragma: no cover - numba
    """The first ``q >= p`` with ``src[s0 + q] != key[k0 + q]``, or ``n``; ``a`` and ``b`` are the two
    ranges' first ``n // 8`` words (uint64 views, little-endian: byte ``8 w + i`` is bits ``8 i ..``),
    compared a word at a time."""
    w = p // 8
    if w < a.shape[0]:
        x = (a[w] ^ b[w]) >> np.uint64(8 * (p % 8))
        if x == 0:
            w += 1
            while w < a.shape[0] and a[w] == b[w]:
                w += 1
            p = 8 * w
            if w < a.shape[0]:
                x = a[w] ^ b[w]
        if x != 0:
            while x & np.uint64(0xFF) == 0:
                x >>= np.uint64(8)
                p += 1
            return p
    while p < n and src[s0 + p] == key[k0 + p]:
        p += 1
    return p


@nb.njit(cache=True, nogil=True)
def encode_aligned(src, s0, key, k0, n, min_match, dst, at, cap):  # pragma: no cover - numba
    """``src[s0 : s0 + n]`` (uint8) as one LZ4 block for the dictionary ``key[k0 : k0 + n]`` (the same
    length), written at ``dst[at:]`` within ``dst[: cap]``; returns the offset after the block, or -1
    when it does not fit (``cap - at`` >= n + n // 255 + 16 always fits) or n >= 65536 (LZ4's largest
    offset is 65535).

    Every match is at offset ``n`` (the key's byte at the same position) and at least
    ``max(min_match, 4)`` bytes long; the rest is literals. Decode with ``LZ4_decompress_safe_usingDict``
    and the key as dictionary.
    """
    if n >= 65536:
        return -1
    words = n // 8 if _LITTLE else 0  # the word compare reads bytes in little-endian order
    a = src[s0 : s0 + 8 * words].view(np.uint64)
    b = key[k0 : k0 + 8 * words].view(np.uint64)
    need = max(min_match, 4)
    last = n - _LAST_LITERALS  # a match ends at or before this byte
    anchor = 0  # the first byte not yet written
    run = 0  # the first byte of the current run of equal bytes
    while run < n:
        end = _next_differing(a, b, src, s0, key, k0, run, n)  # the equal run is [run, end)
        stop = min(end, last)
        if run + _MF_LIMIT < n and stop - run >= need:
            if at + (run - anchor) + (run - anchor) // 255 + 4 + (stop - run) // 255 + 1 > cap:
                return -1
            at = _sequence(src, s0, anchor, run, stop - run, n, dst, at)
            anchor = stop
        run = end + 1
    if at + (n - anchor) + (n - anchor) // 255 + 2 > cap:
        return -1
    return _sequence(src, s0, anchor, n, 0, n, dst, at)
