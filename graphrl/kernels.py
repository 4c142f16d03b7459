"""Byte-level copy kernels and the helper-thread team that both engines' CPU kernels share.

Numba building blocks (usable inside ``@numba.njit(cache=True)`` code, on flat ``uint8`` arrays):

- `copy_bytes` / `zero_bytes`: one ``llvm.memcpy`` / ``llvm.memset`` of a byte range. Numba lowers a
  slice assignment to an element loop at about a third of memcpy's bandwidth (1.6 vs 5.3 GB/s for
  12 KiB rows, DESIGN §3); an intrinsic keeps the calling function cacheable, unlike a ctypes call.
- `stream_bytes`: a copy whose stores bypass the caches (non-temporal stores, ``movntdq`` on x86),
  for large copies into a batch that the CPU will not read again soon. A normal store first reads
  the destination line into the cache (read-for-ownership) and later writes it back, so a cached
  copy moves three bytes over the memory bus for every two a streaming copy moves. glibc's ``memcpy``
  switches to such stores only above ``x86_non_temporal_threshold`` (3/4 of the shared cache divided
  by the threads: 114 MiB on this project's machine), so copies of a few hundred KiB, one per window
  of a replay batch, ran at 63 % of a plain large copy and reach the copy ceiling with streaming
  stores (`replay.windows`). `copy_auto` picks `stream_bytes` from `STREAM_THRESHOLD` bytes up and
  `copy_bytes` below.
- `stream_bytes_nofence`, `stream_line_nofence` / `store_fence`: `stream_bytes` without its final
  fence and its 64-byte step, for kernels that stream many pieces (rows, windows) and fence once.
- `prefetch`: a software prefetch hint (``llvm.prefetch``) for loops of random reads whose stores
  keep the core from running far enough ahead by itself. `prefetch_l2` fetches into L2 only
  (``prefetcht1``), for hints issued far ahead: many more of them can be in flight (see its docstring).
- `address`: the address of an array element, for alignment arithmetic.

Python utilities:

- `advise_huge_pages` / `huge_page_bytes`: back a large array with transparent huge pages (2 MiB)
  and check that it is. Random reads from a table of GiBs miss the TLB on almost every row with 4 KiB
  pages; with 2 MiB pages a 1 GiB table needs 512 TLB entries, which the second-level TLB holds.
- `parallel_for` (and `Chunks` / `engaged` for callers that interleave their own work with the
  helpers', as the neighbour sampler's pipelined relabelling does): chunks ``0..n-1`` claimed
  dynamically by the calling thread and daemon helper threads. We do not use ``numba.prange``: on a
  shared 2-core machine, when other processes keep the cores busy, every OpenMP fork-join waits for a
  descheduled worker (a sampler batch took 5x *longer* with 2 threads than with 1, 110 vs 22 ms);
  with dynamic claiming the caller never waits for a chunk no helper has started, so a busy machine
  costs at most the speed-up. The team is shared by the whole process and serves one task at a time:
  a caller that finds it busy runs its chunks alone. It is rebuilt in a forked child (helper threads
  do not survive ``fork``). An exception in any chunk (a helper's error, ``KeyboardInterrupt`` in the
  caller) is re-raised in the caller once every claimed chunk has finished, so no helper still
  writes into the caller's buffers after the call returns or raises.

This is core code: it imports neither engine (DESIGN §1).

References
----------
Intel 64 and IA-32 Architectures Optimization Reference Manual, "non-temporal stores" and
"software prefetch"; glibc's ``memmove-vec-unaligned-erms`` (the non-temporal threshold); Drepper,
"What Every Programmer Should Know About Memory" (2007), §6.1 "Bypassing the Cache".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import llvmlite.binding as llvm_binding
import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = [
    "HUGE_PAGE",
    "LINE",
    "STREAM_THRESHOLD",
    "Chunks",
    "address",
    "advise_huge_pages",
    "copy",
    "copy_auto",
    "copy_bytes",
    "engaged",
    "huge_page_bytes",
    "parallel_for",
    "prefetch",
    "prefetch_l2",
    "store_fence",
    "stream_bytes",
    "stream_bytes_nofence",
    "stream_line_nofence",
    "zero_bytes",
]

LINE = 64  # bytes per cache line and per streaming store
# From this many bytes of output up (one copy, or one gather call's batch), streaming stores pay. On this
# project's 2-core Xeon (2 MiB L2 a core), gathering 786 KiB windows from a 240 MiB ring ran 1.2-1.5x
# faster with streaming stores at every batch size from 3 MiB to 192 MiB (CPU time, busy machine);
# below a few MiB the batch stays in cache for whoever reads it next, so we keep normal stores there.
STREAM_THRESHOLD = 8 << 20

logger = logging.getLogger(__name__)

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
# llvm.prefetch is overloaded on the pointer type: "p0" with opaque pointers (LLVM >= 15), "p0i8" before.
_PREFETCH_NAME = "llvm.prefetch.p0" if llvm_binding.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


# ------------------------------------------------------------------------------------------ intrinsics


def _byte_ptr(context, builder, aryty, ary, off):
    """``&ary.data[off]`` as i8* (the array's data pointer advanced by ``off`` items)."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [off]), ir.IntType(8).as_pointer())


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, nbytes):  # pragma: no cover - compiled
    """``dst[dst_off:dst_off+nbytes] = src[src_off:src_off+nbytes]`` as one ``llvm.memcpy``.

    For numba code only. ``dst`` and ``src`` are contiguous arrays (offsets count their items, so use
    flat ``uint8`` views for byte offsets); the ranges must not overlap; nothing is checked.
    """
    sig = types.void(dst, dst_off, src, src_off, nbytes)

    def codegen(context, builder, signature, args):
        d, doff, s, soff, n = args
        dptr = context.make_array(signature.args[0])(context, builder, d).data
        sptr = context.make_array(signature.args[2])(context, builder, s).data
        cgutils.raw_memcpy(builder, builder.gep(dptr, [doff]), builder.gep(sptr, [soff]), n, 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def zero_bytes(typingctx, dst, dst_off, nbytes):  # pragma: no cover - compiled
    """``dst[dst_off:dst_off+nbytes] = 0`` as one ``llvm.memset`` (numba code only; no checks)."""
    sig = types.void(dst, dst_off, nbytes)

    def codegen(context, builder, signature, args):
        d, doff, n = args
        dptr = context.make_array(signature.args[0])(context, builder, d).data
        cgutils.memset(builder, builder.gep(dptr, [doff]), n, 0)
        return context.get_dummy_value()

    return sig, codegen


def _prefetch_codegen(locality: int):
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH_NAME)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, arr, idx):  # pragma: no cover - compiled
    """Hint the CPU to fetch ``arr[idx]`` into cache (read, high locality); no bounds check, no effect
    on results (numba code only). Used where a loop's stores keep the core from running far enough
    ahead by itself."""
    return types.void(arr, idx), _prefetch_codegen(3)


@intrinsic
def prefetch_l2(typingctx, arr, idx):  # pragma: no cover - compiled
    """Hint the CPU to fetch ``arr[idx]`` into L2, not L1 (``prefetcht1`` on x86; LLVM locality 2).

    Numba code only; no bounds check, no effect on results. For hints issued far ahead of the reads:
    a line on its way to L1 holds one of the core's few L1 miss buffers (16 on recent Intel cores)
    until it arrives, so `prefetch` far ahead stalls the loop once they are all taken; the L2 keeps
    many more misses in flight (48 on the same cores), and the later read then costs an L2 hit.
    Measured gathering random 512-byte rows (streaming stores, 2 MiB pages, one thread): 4.9 GB/s
    with `prefetch` 8 rows ahead, 6.1-7.1 GB/s with `prefetch_l2` 32-64 rows ahead.
    """
    return types.void(arr, idx), _prefetch_codegen(2)


@intrinsic
def address(typingctx, arr, off):  # pragma: no cover - compiled
    """The address (uint64) of item ``off`` of a contiguous array, for alignment arithmetic."""
    sig = types.uint64(arr, off)

    def codegen(context, builder, signature, args):
        ptr = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.ptrtoint(ptr, ir.IntType(64))

    return sig, codegen


@intrinsic
def stream_line_nofence(typingctx, dst, dst_off, src, src_off):  # pragma: no cover - compiled
    """Copy 64 bytes ``src[src_off:src_off+64]`` -> ``dst[dst_off:dst_off+64]`` with a streaming store.

    For numba code only, on ``uint8`` arrays. ``&dst[dst_off]`` must be 64-byte aligned (``src`` need
    not be). The store is an LLVM store with ``!nontemporal`` metadata (``vmovntdq`` on x86); it is
    weakly ordered, so a run of them must end with `store_fence` before another thread reads ``dst``.
    """
    sig = types.void(dst, dst_off, src, src_off)

    def codegen(context, builder, signature, args):
        d, doff, s, soff = args
        vec = ir.VectorType(ir.IntType(64), LINE // 8)
        sptr = builder.bitcast(_byte_ptr(context, builder, signature.args[2], s, soff), vec.as_pointer())
        dptr = builder.bitcast(_byte_ptr(context, builder, signature.args[0], d, doff), vec.as_pointer())
        value = builder.load(sptr, align=1)
        store = builder.store(value, dptr, align=LINE)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):  # pragma: no cover - compiled
    """Order earlier streaming stores before later stores (``sfence`` on x86; a full fence elsewhere)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


# ------------------------------------------------------------------------------------------ numba copies


@nb.njit(nogil=True, cache=True, inline="always")
def stream_bytes_nofence(dst, dst_off, src, src_off, nbytes):  # pragma: no cover - compiled
    """`stream_bytes` without the final fence: ``memcpy`` up to ``dst``'s next 64-byte boundary,
    streaming stores for the whole lines (four per iteration), ``memcpy`` for the tail.

    Numba code only. A run of calls must end with `store_fence` (streaming stores are weakly
    ordered: x86 orders them only against fences, locked and serializing instructions).
    """
    head = np.int64((np.uint64(0) - address(dst, dst_off)) & np.uint64(LINE - 1))
    if head > nbytes:
        head = nbytes
    if head:
        copy_bytes(dst, dst_off, src, src_off, head)
    d = dst_off + head
    s = src_off + head
    end = dst_off + nbytes
    while d + 4 * LINE <= end:
        stream_line_nofence(dst, d, src, s)
        stream_line_nofence(dst, d + LINE, src, s + LINE)
        stream_line_nofence(dst, d + 2 * LINE, src, s + 2 * LINE)
        stream_line_nofence(dst, d + 3 * LINE, src, s + 3 * LINE)
        d += 4 * LINE
        s += 4 * LINE
    while d + LINE <= end:
        stream_line_nofence(dst, d, src, s)
        d += LINE
        s += LINE
    if d < end:
        copy_bytes(dst, d, src, s, end - d)


@nb.njit(nogil=True, cache=True)
def stream_bytes(dst, dst_off, src, src_off, nbytes):  # pragma: no cover - compiled
    """``dst[dst_off:dst_off+nbytes] = src[src_off:src_off+nbytes]`` with streaming (non-temporal) stores.

    Numba code (or Python, through the compiled dispatcher) on flat ``uint8`` arrays; the ranges must
    lie inside the arrays and not overlap (not checked). Bytes before ``dst``'s first 64-byte boundary
    and after its last one are copied by ``memcpy``; the lines between by 64-byte streaming stores;
    then a store fence. Best for copies of tens of KiB and more into memory that is not read soon:
    small copies and destinations about to be read are faster through the cache (`copy_auto`).
    """
    stream_bytes_nofence(dst, dst_off, src, src_off, nbytes)
    store_fence()


@nb.njit(nogil=True, cache=True, inline="always")
def copy_auto(dst, dst_off, src, src_off, nbytes):  # pragma: no cover - compiled
    """`stream_bytes` from `STREAM_THRESHOLD` bytes up, `copy_bytes` below (same contract)."""
    if nbytes >= STREAM_THRESHOLD:
        stream_bytes_nofence(dst, dst_off, src, src_off, nbytes)
        store_fence()
    elif nbytes > 0:
        copy_bytes(dst, dst_off, src, src_off, nbytes)


@nb.njit(nogil=True, cache=True)
def _copy_kernel(dst, dst_off, src, src_off, nbytes, mode):  # pragma: no cover - compiled
    if mode == 0:
        copy_auto(dst, dst_off, src, src_off, nbytes)
    elif mode == 1:
        if nbytes > 0:
            copy_bytes(dst, dst_off, src, src_off, nbytes)
    else:
        stream_bytes(dst, dst_off, src, src_off, nbytes)


_MODES = {"auto": 0, "cached": 1, "stream": 2}


def copy(dst: np.ndarray, src: np.ndarray, dst_offset: int = 0, src_offset: int = 0,
         nbytes: int | None = None, mode: str = "auto") -> np.ndarray:
    """Copy ``nbytes`` bytes from ``src`` into ``dst`` with the kernels above (releases the GIL).

    Parameters
    ----------
    dst : numpy.ndarray, any dtype, C-contiguous, writable
        Written in place: bytes ``[dst_offset, dst_offset + nbytes)`` of its flat byte view.
    src : numpy.ndarray, any dtype, C-contiguous
        Read: bytes ``[src_offset, src_offset + nbytes)``. Must not overlap the written range.
    dst_offset, src_offset : int
        Offsets in bytes (any alignment).
    nbytes : int or None
        Bytes to copy; default all of ``src`` after ``src_offset``.
    mode : "auto", "cached" or "stream"
        ``"auto"``: streaming stores from `STREAM_THRESHOLD` bytes up (`copy_auto`); ``"cached"``:
        one ``memcpy`` (`copy_bytes`); ``"stream"``: streaming stores at any size (`stream_bytes`).

    Returns
    -------
    numpy.ndarray
        ``dst``.

    Raises
    ------
    TypeError
        ``dst`` or ``src`` is not a numpy array.
    ValueError
        An unknown ``mode``; a non-contiguous or read-only array; a negative offset or size; a range
        outside its array.

    Examples
    --------
    >>> a = np.arange(100, dtype=np.uint8); b = np.zeros(100, dtype=np.uint8)
    >>> _ = copy(b, a, dst_offset=3, src_offset=5, nbytes=10); b[3:13].tolist() == a[5:15].tolist()
    True
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    for name, arr in (("dst", dst), ("src", src)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    if not dst.flags.writeable:
        raise ValueError("dst must be writable")
    if nbytes is None:
        nbytes = src.nbytes - src_offset
    nbytes, dst_offset, src_offset = int(nbytes), int(dst_offset), int(src_offset)
    if nbytes < 0 or dst_offset < 0 or src_offset < 0:
        raise ValueError(f"offsets and nbytes must be >= 0, got dst_offset={dst_offset}, "
                         f"src_offset={src_offset}, nbytes={nbytes}")
    if dst_offset + nbytes > dst.nbytes or src_offset + nbytes > src.nbytes:
        raise ValueError(f"copy of {nbytes} bytes runs past an array: dst_offset={dst_offset} of "
                         f"{dst.nbytes} bytes, src_offset={src_offset} of {src.nbytes} bytes")
    if nbytes:
        _copy_kernel(dst.reshape(-1).view(np.uint8), np.int64(dst_offset), src.reshape(-1).view(np.uint8),
                     np.int64(src_offset), np.int64(nbytes), _MODES[mode])
    return dst


# ------------------------------------------------------------------------------------------ huge pages

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
    (this project's machines run THP in ``madvise`` mode: nothing is huge unless asked for), so
    advise fresh memory *before* writing it. Memory already written keeps its 4 KiB pages until
    ``khugepaged`` collapses it (16 MiB every 10 s by default); ``collapse=True`` collapses it now
    (``MADV_COLLAPSE``, Linux 6.1 and later: the kernel copies every 2 MiB into a huge page; about
    1 s per GiB on this project's machine). Neither changes the contents. Only private anonymous
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


def huge_page_bytes(ptr: int, nbytes: int) -> int:
    """Bytes of ``[ptr, ptr + nbytes)`` that Linux backs with transparent huge pages (0 elsewhere).

    Read from ``/proc/self/smaps``: the ``AnonHugePages`` (or ``ShmemPmdMapped``/``FilePmdMapped``)
    of every mapping that overlaps the range, capped by the overlap (smaps counts per mapping, so a
    mapping larger than the range may be over-counted up to the overlap).
    """
    lo, hi = int(ptr), int(ptr) + int(nbytes)
    total = 0
    try:
        with open("/proc/self/smaps") as f:
            overlap = 0
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    start, end = (int(x, 16) for x in head.split("-"))
                    overlap = max(0, min(hi, end) - max(lo, start))
                elif overlap and head in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
                    total += min(overlap, int(line.split()[1]) * 1024)
    except OSError:
        return 0
    return total


# ------------------------------------------------------------------------------------------ thread team


class Chunks:
    """Chunks ``0..num_chunks-1`` of one parallel loop, claimed in order by whichever thread asks first.

    Parameters
    ----------
    fn : callable(int) -> None
        Runs one chunk; a numba kernel called from it should be ``nogil`` so that threads overlap.
    num_chunks : int

    Attributes
    ----------
    done : bytearray
        ``done[i]`` is 1 once chunk ``i`` has finished (or raised).
    error : BaseException or None
        The first exception a chunk raised.
    """

    def __init__(self, fn: Callable[[int], None], num_chunks: int) -> None:
        self.fn = fn
        self.num_chunks = num_chunks
        self.next = 0
        self.done = bytearray(num_chunks)
        self.cond = threading.Condition(threading.Lock())
        self.error: BaseException | None = None

    def claim(self) -> int:
        """The next unclaimed chunk, or -1 when all are claimed."""
        with self.cond:
            i = self.next
            if i >= self.num_chunks:
                return -1
            self.next = i + 1
        return i

    def run(self, i: int) -> None:
        """Run chunk ``i`` (claimed by this thread); an exception is kept for `finish`."""
        try:
            self.fn(i)
        except BaseException as err:  # re-raised by finish() in the calling thread
            if self.error is None:
                self.error = err
        finally:
            with self.cond:
                self.done[i] = 1
                self.cond.notify_all()

    def help(self) -> None:
        """Claim and run chunks until none is left."""
        while (i := self.claim()) >= 0:
            self.run(i)

    def wait(self, i: int) -> None:
        """Block until chunk ``i`` (already claimed) is done."""
        if self.done[i]:
            return
        with self.cond:
            while not self.done[i]:
                self.cond.wait()

    def finish(self) -> None:
        """Run the unclaimed chunks here, wait for the claimed ones, re-raise the first error.

        Raises
        ------
        BaseException
            Whatever the first failing chunk raised (in a helper or here).
        """
        self.help()
        for i in range(self.num_chunks):
            self.wait(i)
        if self.error is not None:
            raise self.error


class _Team:
    """Daemon helper threads shared by the whole process; one task at a time."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._task: Chunks | None = None
        self._generation = 0
        self._threads: list[threading.Thread] = []
        self._busy = threading.Lock()

    def _loop(self) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._generation == seen:
                    self._cv.wait()
                seen = self._generation
                task = self._task
            if task is not None:
                task.help()
            task = None

    @contextmanager
    def engaged(self, task: Chunks, helpers: int) -> Iterator[None]:
        if helpers <= 0 or task.num_chunks <= 1 or not self._busy.acquire(blocking=False):
            yield
            return
        try:
            while len(self._threads) < helpers:
                thread = threading.Thread(target=self._loop, name="graphrl-helper", daemon=True)
                thread.start()
                self._threads.append(thread)
            with self._cv:
                self._task = task
                self._generation += 1
                self._cv.notify(helpers)
            yield
        finally:
            with self._cv:
                self._task = None
            self._busy.release()


_TEAM = _Team()


def _reset_team_after_fork() -> None:  # helper threads do not survive fork()
    global _TEAM
    _TEAM = _Team()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_team_after_fork)


@contextmanager
def engaged(task: Chunks, helpers: int) -> Iterator[None]:
    """Let up to ``helpers`` helper threads claim chunks of ``task`` inside the ``with`` block.

    The caller must end the block with ``task.finish()`` (or wait for every claimed chunk itself):
    helpers stop claiming when the block exits but finish the chunk they hold. With ``helpers <= 0``,
    a single chunk, or the team busy with another caller's task, no helper joins.

    Parameters
    ----------
    task : Chunks
    helpers : int
        Helper threads besides the caller (started on first use, then kept).
    """
    with _TEAM.engaged(task, helpers):
        yield


def parallel_for(fn: Callable[[int], None], n: int, threads: int) -> None:
    """Run ``fn(0) .. fn(n-1)``, each exactly once, on up to ``threads`` threads (the caller included).

    Chunks are claimed dynamically, in order; the caller works too and never waits for a chunk no
    helper has started (see the module docstring). ``fn`` should release the GIL (a ``nogil`` numba
    kernel) for the threads to overlap. A chunk that raises does not stop the others: every chunk
    runs, then the first error is re-raised in the caller.

    Parameters
    ----------
    fn : callable(int) -> None
    n : int
        Number of chunks (>= 0).
    threads : int
        Threads that may run chunks, the caller included; 1 (or less) runs them all in the caller.

    Raises
    ------
    BaseException
        The first exception a chunk raised, once every claimed chunk has finished.
    """
    task = Chunks(fn, int(n))
    with _TEAM.engaged(task, int(threads) - 1):
        task.finish()
