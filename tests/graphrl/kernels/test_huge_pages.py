"""graphrl.kernels.huge_pages: advice covers whole huge pages of private anonymous memory only."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from graphrl import kernels as K


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
def test_huge_pages_advised_reads_the_advice_of_every_overlapping_mapping():
    buf, arr = _fresh_mapping(4 * K.HUGE_PAGE)
    ptr = arr.ctypes.data
    assert not K.huge_pages_advised(ptr, arr.nbytes)  # a fresh private mapping carries no advice
    assert K.advise_huge_pages(ptr, 2 * K.HUGE_PAGE) == 2 * K.HUGE_PAGE  # the first half only
    assert K.huge_pages_advised(ptr, 2 * K.HUGE_PAGE)  # untouched, yet advised
    assert not K.huge_pages_advised(ptr, arr.nbytes)  # the second half's mapping is not
    assert not K.huge_pages_advised(ptr + arr.nbytes + 64 * K.HUGE_PAGE, 0)  # nothing overlaps
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
