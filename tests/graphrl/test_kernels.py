"""graphrl.kernels: byte-exact copies at awkward sizes and alignments, and the helper-thread team."""

from __future__ import annotations

import mmap
import os
import threading

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


# ------------------------------------------------------------------------------------------ huge pages
def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0]


def _fresh_mapping(nbytes: int):
    import mmap

    buf = mmap.mmap(-1, nbytes + K.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arr = np.frombuffer(buf, dtype=np.uint8)
    off = (-arr.ctypes.data) % K.HUGE_PAGE
    return buf, arr[off:off + nbytes]


def test_advise_huge_pages_covers_only_whole_huge_pages():
    buf, arr = _fresh_mapping(4 * K.HUGE_PAGE)
    ptr = arr.ctypes.data
    assert K.advise_huge_pages(ptr + 1, K.HUGE_PAGE) == 0  # no whole huge page inside
    assert K.advise_huge_pages(ptr, 0) == 0
    advised = K.advise_huge_pages(ptr + 1, 3 * K.HUGE_PAGE)
    assert advised in (0, 2 * K.HUGE_PAGE)  # pages 1 and 2 (0 where the OS refuses)
    assert K.huge_page_bytes(ptr, 4 * K.HUGE_PAGE) == 0  # nothing touched yet
    del arr
    buf.close()


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
def test_advised_fresh_memory_faults_in_as_huge_pages_with_the_same_contents():
    buf, arr = _fresh_mapping(4 * K.HUGE_PAGE)
    assert K.advise_huge_pages(arr.ctypes.data, arr.nbytes) == arr.nbytes
    arr[:] = np.arange(arr.size, dtype=np.uint64).astype(np.uint8)
    assert K.huge_page_bytes(arr.ctypes.data, arr.nbytes) > 0  # the kernel may lack a free one now and then
    assert np.array_equal(arr, np.arange(arr.size, dtype=np.uint64).astype(np.uint8))
    del arr
    buf.close()


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
def test_collapse_turns_written_memory_into_huge_pages_in_place():
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (6, 1):
        pytest.skip("MADV_COLLAPSE needs Linux 6.1")
    buf, arr = _fresh_mapping(4 * K.HUGE_PAGE)
    rng = np.random.default_rng(0)
    arr[:] = rng.integers(0, 256, arr.size, dtype=np.uint8)
    want = arr.copy()
    assert K.huge_page_bytes(arr.ctypes.data, arr.nbytes) == 0  # written before any advice: 4 KiB pages
    assert K.advise_huge_pages(arr.ctypes.data, arr.nbytes, collapse=True) == arr.nbytes
    assert K.huge_page_bytes(arr.ctypes.data, arr.nbytes) > 0
    assert np.array_equal(arr, want)
    del arr
    buf.close()


def test_file_and_shared_mappings_are_not_advised(tmp_path):
    import mmap

    path = tmp_path / "table.bin"
    path.write_bytes(b"\x01" * (4 * K.HUGE_PAGE))
    table = np.memmap(path, dtype=np.uint8, mode="r")  # collapsing would read the whole file in
    assert K.advise_huge_pages(table.ctypes.data, table.nbytes, collapse=True) == 0
    assert K.huge_page_bytes(table.ctypes.data, table.nbytes) == 0
    del table
    shared = mmap.mmap(-1, 4 * K.HUGE_PAGE)  # MAP_SHARED: shared memory
    arr = np.frombuffer(shared, dtype=np.uint8)
    assert K.advise_huge_pages(arr.ctypes.data, arr.nbytes) == 0
    del arr
    shared.close()
    assert K.advise_huge_pages(K.HUGE_PAGE, K.HUGE_PAGE) == 0  # nothing mapped at 2 MiB


def test_huge_page_bytes_of_plain_memory_is_zero():
    # a fresh 64 KiB anonymous mapping, not the heap (which an earlier test may have put on huge pages)
    buf = mmap.mmap(-1, 1 << 16)
    arr = np.frombuffer(buf, dtype=np.uint8)
    arr[:] = 1
    assert K.huge_page_bytes(arr.ctypes.data, arr.nbytes) == 0
    del arr
    assert K.huge_page_bytes(0, 4096) == 0  # no mapping there


# ---------------------------------------------------------------------------------------------- threads


@pytest.mark.parametrize("n", [0, 1, 2, 7, 100])
@pytest.mark.parametrize("threads", [0, 1, 2, 4])
def test_parallel_for_runs_every_index_exactly_once(n, threads):
    counts = np.zeros(n, dtype=np.int64)
    lock = threading.Lock()
    names = set()

    def fn(i):
        with lock:
            counts[i] += 1
            names.add(threading.current_thread().name)

    K.parallel_for(fn, n, threads)
    assert (counts == 1).all()
    if threads <= 1:
        assert names <= {threading.current_thread().name}


def test_parallel_for_uses_helpers():
    seen = set()
    barrier = threading.Event()

    def fn(i):
        seen.add(threading.current_thread().name)
        if i == 0:
            barrier.wait(5.0)  # hold chunk 0 until another thread has run a chunk
        else:
            barrier.set()

    K.parallel_for(fn, 4, 2)
    assert len(seen) == 2


def test_errors_reach_the_caller_after_every_chunk_ran():
    ran = []

    def fail(i):
        ran.append(i)
        if i == 3:
            raise RuntimeError("chunk 3 failed")

    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        K.parallel_for(fail, 8, 2)
    assert sorted(ran) == list(range(8))
    K.parallel_for(lambda i: None, 8, 2)  # the team is usable afterwards


def test_keyboard_interrupt_in_the_caller_propagates():
    main = threading.current_thread()

    def fn(i):
        if threading.current_thread() is main:
            raise KeyboardInterrupt("simulated Ctrl-C")

    with pytest.raises(KeyboardInterrupt):
        K.parallel_for(fn, 16, 1)
    K.parallel_for(lambda i: None, 4, 2)


def test_a_busy_team_runs_the_second_caller_alone():
    inside = threading.Event()
    release = threading.Event()
    other_names = set()

    def slow(i):
        inside.set()
        release.wait(5.0)

    t = threading.Thread(target=K.parallel_for, args=(slow, 2, 2))
    t.start()
    assert inside.wait(5.0)
    K.parallel_for(lambda i: other_names.add(threading.current_thread().name), 6, 2)
    release.set()
    t.join(5.0)
    assert other_names == {threading.current_thread().name}


def test_engaged_chunks_interleave_with_the_callers_work():
    done_order = []
    task = K.Chunks(lambda i: done_order.append(i), 6)
    with K.engaged(task, 1):
        for r in range(task.num_chunks):
            while not task.done[r]:
                i = task.claim()
                if i < 0:
                    task.wait(r)
                    break
                task.run(i)
        task.finish()
    assert sorted(done_order) == list(range(6))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_the_team_works_in_a_forked_child():
    import multiprocessing as mp

    K.parallel_for(lambda i: None, 4, 2)  # helper threads exist in the parent
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert q.get(timeout=5) == list(range(8))


def _child(q):
    out = []
    lock = threading.Lock()

    def fn(i):
        with lock:
            out.append(i)

    K.parallel_for(fn, 8, 2)
    q.put(sorted(out))
