"""Byte-range copies for numba code, cached and streaming, and `copy`, their checked Python entry.

Numba building blocks (usable inside ``@numba.njit(cache=True)`` code, on flat ``uint8`` arrays):

- `copy_bytes` / `zero_bytes`: one ``llvm.memcpy`` / ``llvm.memset`` of a byte range. An intrinsic,
  not a slice assignment (which numba lowers to an element loop) nor a ctypes call (which would
  make the calling function uncacheable).
- `stream_bytes`: a copy whose stores bypass the caches (non-temporal stores, ``movntdq`` on x86),
  for large copies into memory the CPU will not read again soon. A normal store first reads the
  destination line into the cache (read-for-ownership) and later writes it back, so a cached copy
  moves three bytes over the memory bus for every two a streaming copy moves. `copy_auto` picks
  `stream_bytes` from `STREAM_THRESHOLD` bytes up and `copy_bytes` below.
- `stream_bytes_nofence`, `stream_line_nofence` / `store_fence`: `stream_bytes` without its final
  fence and its 64-byte step, for kernels that stream many pieces (rows, windows) and fence once.
- `address`: the address of an array element, for alignment arithmetic.

How fast each is, and why the threshold sits where it does: docs/performance.md.

References
----------
Intel 64 and IA-32 Architectures Optimization Reference Manual, "non-temporal stores"; glibc's
``memmove-vec-unaligned-erms`` (the non-temporal threshold); Drepper, "What Every Programmer Should
Know About Memory" (2007), §6.1 "Bypassing the Cache".
"""

from __future__ import annotations

import platform

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = [
    "LINE",
    "STREAM_THRESHOLD",
    "address",
    "copy",
    "copy_auto",
    "copy_bytes",
    "store_fence",
    "stream_bytes",
    "stream_bytes_nofence",
    "stream_line_nofence",
    "zero_bytes",
]

LINE = 64  # bytes per cache line and per streaming store
# From this many bytes of output up (one copy, or one gather call's batch), streaming stores pay; below,
# the output stays in cache for whoever reads it next (docs/performance.md).
STREAM_THRESHOLD = 8 << 20

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


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
