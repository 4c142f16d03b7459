"""graphrl.kernels.copies: byte-exact copies at awkward sizes and alignments; the numba building blocks."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl import kernels as K

SIZES = [0, 1, 2, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4095, 4096, 4097,
         K.STREAM_THRESHOLD - 1, K.STREAM_THRESHOLD, K.STREAM_THRESHOLD + 65, 3 * K.STREAM_THRESHOLD + 17]
OFFSETS = [0, 1, 7, 63, 64, 65]
MODES = ["auto", "cached", "stream"]


def _pair(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, n + 256, dtype=np.uint8), rng.integers(0, 256, n + 256, dtype=np.uint8))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", SIZES)
def test_copy_is_byte_exact_at_every_size_and_alignment(n, mode):
    src, dst0 = _pair(n, n)
    for so in OFFSETS:
        for do in OFFSETS:
            dst = dst0.copy()
            want = dst0.copy()
            want[do:do + n] = src[so:so + n]
            assert K.copy(dst, src, do, so, n, mode=mode) is dst
            assert np.array_equal(dst, want), (n, so, do, mode)  # nothing outside the range either


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300_000), so=st.integers(0, 200), do=st.integers(0, 200), mode=st.sampled_from(MODES),
       seed=st.integers(0, 2**32 - 1))
def test_copy_matches_numpy_slicing(n, so, do, mode, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, n + so + rng.integers(0, 70), dtype=np.uint8)
    dst = rng.integers(0, 256, n + do + rng.integers(0, 70), dtype=np.uint8)
    want = dst.copy()
    want[do:do + n] = src[so:so + n]
    K.copy(dst, src, do, so, n, mode=mode)
    assert np.array_equal(dst, want)


def test_copy_of_other_dtypes_counts_bytes():
    src = np.arange(200, dtype=np.float32).reshape(20, 10)
    dst = np.zeros((5, 10), dtype=np.float32)
    K.copy(dst, src, dst_offset=40, src_offset=400, nbytes=80)  # floats 100..119 -> 10..29
    assert np.array_equal(dst.reshape(-1)[10:30], src.reshape(-1)[100:120])
    assert not dst.reshape(-1)[:10].any() and not dst.reshape(-1)[30:].any()


def test_copy_default_size_is_the_rest_of_src():
    src = np.arange(50, dtype=np.uint8)
    dst = np.zeros(60, dtype=np.uint8)
    K.copy(dst, src, dst_offset=10, src_offset=20)
    assert np.array_equal(dst[10:40], src[20:]) and not dst[:10].any() and not dst[40:].any()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "fast"}, ValueError, "mode"),
        ({"nbytes": -1}, ValueError, "nbytes"),
        ({"dst_offset": -1, "nbytes": 1}, ValueError, "dst_offset"),
        ({"nbytes": 101}, ValueError, "runs past"),
        ({"dst_offset": 95, "nbytes": 10}, ValueError, "runs past"),
        ({"src_offset": 95, "nbytes": 10}, ValueError, "runs past"),
    ],
)
def test_copy_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        K.copy(np.zeros(100, np.uint8), np.zeros(100, np.uint8), **kwargs)


def test_copy_rejects_bad_arrays():
    with pytest.raises(TypeError, match="dst"):
        K.copy([0] * 10, np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        K.copy(np.zeros(10, np.uint8), np.zeros(20, np.uint8)[::2])
    ro = np.zeros(10, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        K.copy(ro, np.zeros(10, np.uint8))


@nb.njit(cache=True)
def _use_intrinsics(dst, src, n):
    """Each building block inside a cacheable njit function."""
    K.copy_bytes(dst, 0, src, 1, n)
    K.zero_bytes(dst, n, 3)
    K.prefetch(src, 0)
    K.prefetch_l2(src, 1)
    K.prefetch_l2(src, 1 << 40)  # a hint far outside the array: no fault, no effect
    a = K.address(dst, 0)
    b = K.address(dst, 5)
    K.copy_auto(dst, n + 3, src, 0, n)
    K.stream_bytes(dst, 2 * n + 3, src, 0, n)
    return b - a


def test_building_blocks_compose_in_a_cacheable_function():
    n = 300
    src = np.arange(1, 2 * n, dtype=np.uint8)
    dst = np.full(3 * n + 10, 7, dtype=np.uint8)
    assert _use_intrinsics(dst, src, n) == 5
    assert np.array_equal(dst[:n], src[1:n + 1])
    assert not dst[n:n + 3].any()
    assert np.array_equal(dst[n + 3:2 * n + 3], src[:n])
    assert np.array_equal(dst[2 * n + 3:3 * n + 3], src[:n])
    assert (dst[3 * n + 3:] == 7).all()


def test_stream_line_writes_exactly_one_line():
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(256 + K.LINE, dtype=np.uint8)
    start = (-dst.ctypes.data) % K.LINE  # the first 64-byte boundary inside dst

    @nb.njit
    def one(dst, do, src, so):
        K.stream_line_nofence(dst, do, src, so)
        K.store_fence()

    one(dst, start, src, 3)
    assert np.array_equal(dst[start:start + K.LINE], src[3:3 + K.LINE])
    assert not dst[:start].any() and not dst[start + K.LINE:].any()
