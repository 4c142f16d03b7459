"""replay.aligned_lz4: blocks LZ4's own dictionary decoder reads back exactly, matches only at the key's same
byte and at least ``min_match`` long, LZ4's end-of-block rules kept, the bytes of a hand-worked case, and
refusals that write nothing past ``cap``."""

from __future__ import annotations

import ctypes

import numcodecs.lz4
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.aligned_lz4 import ALIGNED, MIN_MATCH, encode_aligned
from replay.chunk_encode import LZ4DICT_LEVEL

_LIB = ctypes.CDLL(numcodecs.lz4.__file__)


def lz4_decode(block: np.ndarray, key: np.ndarray) -> np.ndarray | None:
    """LZ4's own ``LZ4_decompress_safe_usingDict`` of ``block``, ``key`` the dictionary (None: refused)."""
    out = np.empty(key.size, np.uint8)
    got = _LIB.LZ4_decompress_safe_usingDict(
        ctypes.c_void_p(block.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int(block.size),
        ctypes.c_int(out.size), ctypes.c_void_p(key.ctypes.data), ctypes.c_int(key.size))
    return out if got == key.size else None


def sequences(block: bytes) -> list[tuple[int, int, int]]:
    """(literals, match offset, match length) of each sequence of an LZ4 block (offset 0: the last)."""
    out, i = [], 0
    while i < len(block):
        tok = block[i]
        i += 1
        lit = tok >> 4
        if lit == 15:
            while block[i] == 255:
                lit, i = lit + 255, i + 1
            lit, i = lit + block[i], i + 1
        i += lit
        if i == len(block):
            out.append((lit, 0, 0))
            break
        off = block[i] | block[i + 1] << 8
        i += 2
        ml = tok & 15
        if ml == 15:
            while block[i] == 255:
                ml, i = ml + 255, i + 1
            ml, i = ml + block[i], i + 1
        out.append((lit, off, ml + 4))
    return out


def encode(src: np.ndarray, key: np.ndarray, min_match: int = MIN_MATCH, cap: int | None = None,
           shift: tuple[int, int] = (0, 0)) -> np.ndarray | None:
    """`encode_aligned` of ``src`` against ``key``, each placed ``shift`` bytes into a larger array."""
    n = src.size
    s0, k0 = shift
    big_src, big_key = np.zeros(n + s0 + 3, np.uint8), np.zeros(n + k0 + 5, np.uint8)
    big_src[s0 : s0 + n], big_key[k0 : k0 + n] = src, key
    dst = np.full(n + n // 255 + 16 + 8, 0xAB, np.uint8)
    cap = n + n // 255 + 16 if cap is None else cap
    end = encode_aligned(big_src, s0, big_key, k0, n, min_match, dst, 0, cap)
    assert (dst[max(cap, 0) :] == 0xAB).all()  # nothing written past cap
    return dst[:end] if end >= 0 else None


def test_a_hand_worked_block():
    key = np.zeros(64, np.uint8)
    src = key.copy()
    src[20:23] = 7
    block = encode(src, key)
    # 20 equal bytes: a match (offset 64, length 20: 15 + 1); literals 7 7 7 then a match of 36 (15 + 17)
    # up to the last 5 bytes, which stay literals (LZ4's end rule)
    assert block.tobytes() == bytes([0x0F, 64, 0, 1, 0x3F, 7, 7, 7, 64, 0, 17, 0x50, 0, 0, 0, 0, 0])
    assert np.array_equal(lz4_decode(block, key), src)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1), runs=st.integers(0, 12),
       min_match=st.sampled_from([1, 4, 16, 64]), shift=st.tuples(st.integers(0, 9), st.integers(0, 9)))
def test_blocks_decode_with_lz4_to_the_step_and_match_only_the_same_byte(n, seed, runs, min_match, shift):
    rng = np.random.default_rng(seed)
    key = rng.integers(0, 4, n, dtype=np.uint8)  # few values: other offsets would match too
    src = key.copy()
    for _ in range(runs):  # runs of changed bytes, some of them at the ends
        a = int(rng.integers(0, n))
        src[a : a + int(rng.integers(1, 40))] = rng.integers(0, 256, dtype=np.uint8)
    block = encode(src, key, min_match, shift=shift)  # the ranges anywhere in their arrays
    assert np.array_equal(lz4_decode(block, key), src)
    seqs = sequences(block.tobytes())
    assert seqs[-1][1:] == (0, 0) and (n < 13 or seqs[-1][0] >= 5)  # ends with 5 literals or more
    assert all(off == n and ml >= max(min_match, 4) for _, off, ml in seqs[:-1])
    pos = 0
    for lit, _, ml in seqs[:-1]:  # each match starts 12 bytes or more before the end and copies equal bytes
        pos += lit
        assert pos + 12 < n and np.array_equal(src[pos : pos + ml], key[pos : pos + ml])
        pos += ml


def test_equal_steps_take_a_few_bytes_and_unlike_ones_at_most_the_bound():
    rng = np.random.default_rng(0)
    key = rng.integers(0, 256, 7056, dtype=np.uint8)
    same = encode(key.copy(), key)
    assert same.size < 40 and np.array_equal(lz4_decode(same, key), key)
    other = rng.integers(0, 256, 7056, dtype=np.uint8)
    block = encode(other, key)  # nothing equal for 4 bytes: all literals, within n + n // 255 + 16
    assert block.size <= 7056 + 7056 // 255 + 16 and np.array_equal(lz4_decode(block, key), other)


def test_refusals_write_nothing_past_cap():
    rng = np.random.default_rng(1)
    key = rng.integers(0, 256, 500, dtype=np.uint8)
    for cap in (0, 10, 400):  # too small for 500 unlike bytes
        assert encode(rng.integers(0, 256, 500, dtype=np.uint8), key, cap=cap) is None
    big = np.zeros(65536, np.uint8)  # past LZ4's largest offset
    assert encode_aligned(big, 0, big, 0, big.size, 4, np.empty(70000, np.uint8), 0, 70000) == -1


def test_lz4dict_writes_the_aligned_parse_by_default():
    assert LZ4DICT_LEVEL == ALIGNED == -1
