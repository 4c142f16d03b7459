"""Transparent huge pages (2 MiB) for large arrays: `advise_huge_pages` asks for them, `huge_pages_advised`
checks the request, `huge_page_bytes` what Linux gave, `HUGE_PAGE` is their size.

Random reads from a table of GiBs miss the TLB on almost every row with 4 KiB pages; with 2 MiB
pages a 1 GiB table needs 512 TLB entries, which the second-level TLB holds.

References
----------
Linux ``Documentation/admin-guide/mm/transhuge.rst`` (``MADV_HUGEPAGE``, ``MADV_COLLAPSE``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["HUGE_PAGE", "advise_huge_pages", "huge_page_bytes", "huge_pages_advised"]

logger = logging.getLogger(__name__)


_MADV_HUGEPAGE = 14  # linux/mman.h
_MADV_COLLAPSE = 25  # Linux >= 6.1
_THP = "/sys/kernel/mm/transparent_hugepage"


def _huge_page_size() -> int:
    try:
        with open(f"{_THP}/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


HUGE_PAGE = _huge_page_size()  # bytes of a transparent huge page (2 MiB on x86-64)
_libc = None


def _madvise(addr: int, nbytes: int, advice: int) -> int:
    """``madvise``; 0 or the errno (``ENOSYS`` off Linux)."""
    global _libc
    if platform.system() != "Linux":
        return 38  # ENOSYS
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    if _libc.madvise(addr, nbytes, advice) == 0:
        return 0
    return ctypes.get_errno()


def _huge_range(ptr: int, nbytes: int) -> tuple[int, int]:
    lo = -(-ptr // HUGE_PAGE) * HUGE_PAGE
    hi = (ptr + nbytes) // HUGE_PAGE * HUGE_PAGE
    return lo, max(lo, hi)


def _private_anonymous(lo: int, hi: int) -> bool:
    """Whether every mapping of ``[lo, hi)`` is private and anonymous (``/proc/self/maps``: perms ``..p``,
    inode 0) and the range has no holes."""
    try:
        with open("/proc/self/maps") as f:
            covered = lo
            for line in f:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if end <= lo or start >= hi:
                    continue
                if fields[1][3] != "p" or int(fields[4]) != 0 or start > covered:
                    return False
                covered = max(covered, end)
            return covered >= hi
    except (OSError, ValueError, IndexError):
        return False


def advise_huge_pages(ptr: int, nbytes: int, collapse: bool = False) -> int:
    """Ask Linux to back the whole 2 MiB pages inside ``[ptr, ptr + nbytes)`` with transparent huge pages.

    ``MADV_HUGEPAGE`` makes the kernel fault those pages in as huge pages from their first touch on
    (with THP in ``madvise`` mode nothing is huge unless asked for), so advise fresh memory *before*
    writing it. Memory already written keeps its 4 KiB pages until ``khugepaged`` collapses it
    (16 MiB every 10 s by default); ``collapse=True`` collapses it now (``MADV_COLLAPSE``, Linux 6.1
    and later: the kernel copies every 2 MiB into a huge page, which takes time proportional to the
    size, docs/performance.md). Neither changes the contents. Only private anonymous
    memory (``malloc``, ``torch.empty``, ``numpy.empty``) is advised: a range that touches a file
    mapping (``numpy.memmap``: collapsing would read the whole file into memory) or shared memory
    is left alone. Failure (another OS, THP off, page-locked memory, no free huge pages) is logged at
    debug level, not raised: the memory stays as it was and works the same, only its reads miss the
    TLB more often.

    Parameters
    ----------
    ptr : int
        Start address (e.g. ``tensor.data_ptr()``, ``array.ctypes.data``).
    nbytes : int
        Length in bytes; only the 2 MiB-aligned pages wholly inside the range are advised.
    collapse : bool
        Also collapse pages already present into huge pages now.

    Returns
    -------
    int
        Bytes advised (0 when the range holds no whole huge page or the advice failed).

    References
    ----------
    Linux ``Documentation/admin-guide/mm/transhuge.rst`` (``MADV_HUGEPAGE``, ``MADV_COLLAPSE``).
    """
    lo, hi = _huge_range(int(ptr), int(nbytes))
    if hi <= lo:
        return 0
    if not _private_anonymous(lo, hi):
        logger.debug("not advising %d bytes at %#x onto huge pages: not private anonymous memory",
                     hi - lo, lo)
        return 0
    err = _madvise(lo, hi - lo, _MADV_HUGEPAGE)
    if err:
        logger.debug("madvise(MADV_HUGEPAGE) of %d bytes failed: %s", hi - lo, os.strerror(err))
        return 0
    if collapse:
        err = _madvise(lo, hi - lo, _MADV_COLLAPSE)
        if err:
            logger.debug("madvise(MADV_COLLAPSE) of %d bytes failed: %s", hi - lo, os.strerror(err))
    return hi - lo


def _smaps_fields(ptr: int, nbytes: int):
    """``(overlap bytes, field name, rest of line)`` for every field line of every ``/proc/self/smaps``
    mapping that overlaps ``[ptr, ptr + nbytes)``."""
    lo, hi = int(ptr), int(ptr) + int(nbytes)
    with open("/proc/self/smaps") as f:
        overlap = 0
        for line in f:
            parts = line.split(maxsplit=1)
            if not parts:
                continue
            head = parts[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                overlap = max(0, min(hi, end) - max(lo, start))
            elif overlap:
                yield overlap, head, parts[1] if len(parts) > 1 else ""


def huge_page_bytes(ptr: int, nbytes: int) -> int:
    """Bytes of ``[ptr, ptr + nbytes)`` that Linux backs with transparent huge pages (0 elsewhere).

    Read from ``/proc/self/smaps``: the ``AnonHugePages`` (or ``ShmemPmdMapped``/``FilePmdMapped``)
    of every mapping that overlaps the range, capped by the overlap (smaps counts per mapping, so a
    mapping larger than the range may be over-counted up to the overlap). 0 where smaps cannot be read.
    """
    total = 0
    try:
        for overlap, head, rest in _smaps_fields(ptr, nbytes):
            if head in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
                total += min(overlap, int(rest.split()[0]) * 1024)
    except OSError:
        return 0
    return total


def huge_pages_advised(ptr: int, nbytes: int) -> bool:
    """Whether every mapping that overlaps ``[ptr, ptr + nbytes)`` carries ``MADV_HUGEPAGE`` (``hg`` in
    its smaps ``VmFlags``): what `advise_huge_pages` asks for. Whether Linux then backs the range with huge
    pages (`huge_page_bytes`) depends on the free memory at that moment. False where smaps cannot be read
    or no mapping overlaps."""
    try:
        flags = [("hg" in rest.split()) for _, head, rest in _smaps_fields(ptr, nbytes) if head == "VmFlags:"]
    except OSError:
        return False
    return bool(flags) and all(flags)
