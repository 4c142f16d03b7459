"""Fixed-length windows over a shard's ring: bounds, masks, the byte-slice gather, the window table.

Positions are *absolute*: the n-th step ever committed to a shard has position n and lives in slot
``n % capacity`` of the shard's ring. A window of length L is anchored at one step (the drawn item):

- ``pad="tail"``: the window starts at the anchor and runs forward ``L`` steps or to the end of the
  anchor's episode, whichever comes first; the rest is padding at the tail.
- ``pad="head"``: the window ends at the anchor and runs back ``L`` steps or to the first step of the
  episode still stored, whichever comes first; the padding is at the head (the anchor is always the
  last real step, as for a policy's context).

A window never crosses an episode boundary. Its real steps ``[first, first + n)`` are consecutive
positions, so in the ring they are one run of slots, or two when they wrap past the ring's end.
``mask[b, j]`` is True for real steps; padded steps are zero. Episode ends are the *committed* ends:
when the shard's write cursor sits inside an open episode, windows stop at the cursor, and when the
ring has overwritten an episode's head, head-padded windows stop at the oldest step still stored.

Each rule has one home here: `window_of` (numba, one window) gives a window's bounds, and the draw
kernel (`replay.draw_kernels.window_rows`) and `window_bounds` (arrays) call it; `copy_window` is the
CPU ring gather, which `gather_fields`, `replay.batch_kernels` and `replay.transition_kernel` call, made
of three parts the Ray client's copy out of shipped runs (`replay.distributed.transport`) calls too:
`first_run` (where a window wraps past the ring's end), `copy_run` (one run: a ``memcpy``, or streaming
stores for runs of `STREAM_PIECE` bytes and more when a gather writes at least
`graphrl.kernels.STREAM_THRESHOLD` bytes) and `zero_padding`; `mask_row` writes a window's mask row.
`WindowTable` lists windows drawn and not yet gathered. See docs/architecture.md#windows.

References
----------
TorchRL's ``SliceSampler`` (slices within trajectories, ``strict_length=False`` truncation); GEAR
(Wang et al., ICML 2023): windows gathered from columnar trajectory storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from graphrl.kernels import (
    STREAM_THRESHOLD,
    copy_bytes,
    parallel_for,
    prefetch_l2,
    store_fence,
    stream_bytes_nofence,
    zero_bytes,
)
from replay.keys import encode_keys

__all__ = [
    "AHEAD",
    "PADS",
    "PAD_CODES",
    "PAGE",
    "STREAM_BATCH_BYTES",
    "STREAM_PIECE",
    "WindowTable",
    "copy_run",
    "copy_window",
    "first_run",
    "gather_fields",
    "gather_windows",
    "mask_row",
    "prefetch_pages",
    "reference_gather",
    "window_bounds",
    "window_mask",
    "window_of",
    "zero_padding",
]

PADS = ("tail", "head")
PAD_CODES = {"tail": 0, "head": 1}  # the pad argument of the kernels (`window_of`)
STREAM_PIECE = 1024  # in a streamed batch, runs shorter than this still go through memcpy
# an owner's host batch (`replay.batch_kernels`, `replay.transition_kernel`) of this many bytes and more is
# written with streaming stores: larger than L2, it would only evict the caller's working set
# (docs/performance.md)
STREAM_BATCH_BYTES = 1 << 20
PAGE = 4096  # rows of at least a page: the copy asks for the pages of the window AHEAD windows on
AHEAD = 2  # (the hardware prefetcher stops at each 4 KiB page; docs/performance.md)
_NO_MASK = np.zeros(0, dtype=np.bool_)
_CHUNK_BYTES = 1 << 22  # output bytes per chunk of a threaded gather


def window_bounds(
    anchor: np.ndarray,
    ep_start: np.ndarray,
    ep_end: np.ndarray,
    floor: np.ndarray | int,
    length: int,
    pad: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Real steps of each window: its first position, its number of real steps, its offset in the window.

    `window_of` (the one rule, which the draw kernel calls for each anchor) over arrays.

    Parameters
    ----------
    anchor : numpy.ndarray, int64 [B]
        Absolute position of each window's anchor (a stored step).
    ep_start, ep_end : numpy.ndarray, int64 [B]
        Absolute positions of the first step and one past the last committed step of the anchor's
        episode: ``ep_start <= anchor < ep_end``.
    floor : int or numpy.ndarray, int64 [B]
        The oldest position still stored in the anchor's shard (``write_pos - capacity``, or 0); steps
        below it were overwritten.
    length : int
        Window length L >= 1.
    pad : "tail" or "head"

    Returns
    -------
    first : numpy.ndarray, int64 [B]
        Absolute position of the first real step.
    n : numpy.ndarray, int64 [B]
        Real steps, 1 <= n <= L.
    dst : numpy.ndarray, int64 [B]
        Index in the window of the first real step (0 for tail padding, ``L - n`` for head padding).

    Raises
    ------
    ValueError
        ``length < 1`` or an unknown ``pad``.
    """
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    if pad not in PAD_CODES:
        raise ValueError(f"pad must be 'tail' or 'head', got {pad!r}")
    anchor = np.ascontiguousarray(anchor, dtype=np.int64).reshape(-1)
    shape = anchor.shape

    def column(x: np.ndarray | int) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype=np.int64), shape))

    out = np.empty((3, len(anchor)), dtype=np.int64)
    _bounds(anchor, column(ep_start), column(ep_end), column(floor), length, PAD_CODES[pad], out)
    return out[0], out[1], out[2]


@nb.njit(cache=True, nogil=True, inline="always")
def window_of(anchor, start, end, floor, length, pad):  # pragma: no cover - numba
    """``(first, n, dst)`` of one window (docs/architecture.md#windows): the one home of the rule.

    ``anchor`` in ``[start, end)`` (its episode's first and one-past-last committed position), ``floor``
    the oldest position still stored, ``length`` L, ``pad`` 0 tail, 1 head (`PAD_CODES`); all int64.
    Tail: ``(anchor, min(L, end - anchor), 0)``; head: the window ends at the anchor and starts at
    ``max(start, floor, anchor - L + 1)``, its real steps at the end (``dst = L - n``).
    """
    if pad == 0:
        return anchor, min(length, end - anchor), anchor - anchor
    lo = max(max(start, floor), anchor - (length - 1))
    n = anchor - lo + 1
    return lo, n, length - n


@nb.njit(cache=True, nogil=True)
def _bounds(anchor, start, end, floor, length, pad, out):  # pragma: no cover - numba
    for b in range(anchor.shape[0]):
        out[0, b], out[1, b], out[2, b] = window_of(anchor[b], start[b], end[b], floor[b], length, pad)


def window_mask(n: np.ndarray, dst: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
    """``mask[b, j] = dst[b] <= j < dst[b] + n[b]``: bool [B, L], True for real steps.

    Every mask of a batch is `mask_row`'s: this (host batches of the general loop, and GPU batches,
    whose mask is made here and copied up), and the gathers that fill it in the copy's own pass.

    Parameters
    ----------
    n, dst : numpy.ndarray, integer [B]
        From `window_bounds`.
    length : int
        L.
    out : numpy.ndarray, bool [B, L], optional
        Filled in place (one numba loop).

    Returns
    -------
    numpy.ndarray, bool [B, L]
        ``out``, or a new array.

    Raises
    ------
    ValueError
        ``out`` is not C-contiguous.
    """
    if out is None:
        out = np.empty((len(n), length), dtype=np.bool_)
    if not out.flags.c_contiguous:
        raise ValueError(f"window_mask: out must be C-contiguous, got strides {out.strides}")
    _fill_mask(np.asarray(n, dtype=np.int64), np.asarray(dst, dtype=np.int64), out.reshape(-1), length)
    return out


@nb.njit(cache=True, nogil=True, inline="always")
def mask_row(mask, base, n, dst, length):  # pragma: no cover - numba
    """``mask[base + j] = dst <= j < dst + n`` for ``j < length`` (one window's row of a flat mask)."""
    for j in range(length):
        mask[base + j] = dst <= j < dst + n


@nb.njit(cache=True, nogil=True)
def _fill_mask(n, dst, out, length):  # pragma: no cover - numba
    for b in range(n.shape[0]):
        mask_row(out, b * length, n[b], dst[b], length)


@nb.njit(cache=True, nogil=True, inline="always")
def first_run(slot, n, capacity):  # pragma: no cover - numba
    """Steps of windows in their first run of ring slots: ``min(n, capacity - slot)`` (int64, or arrays).

    A window of ``n`` real steps from ring ``slot`` is one run of slots, or two when it wraps past the
    ring's end: ``slot .. slot + n1 - 1``, then ``0 .. n - n1 - 1``. Scalars in numba code, int64 arrays
    [B] from Python (`replay.distributed.transport.ring_runs`).
    """
    return np.minimum(n, capacity - slot)


@nb.njit(cache=True, nogil=True, inline="always")
def copy_run(out, o, src, s, nbytes, stream):  # pragma: no cover - numba
    """``out[o : o + nbytes] = src[s : s + nbytes]`` (flat bytes): one ``memcpy``, or streaming stores
    when ``stream`` and ``nbytes >= STREAM_PIECE`` (then the caller ends with
    `graphrl.kernels.store_fence`)."""
    if stream and nbytes >= STREAM_PIECE:
        stream_bytes_nofence(out, o, src, s, nbytes)
    elif nbytes > 0:
        copy_bytes(out, o, src, s, nbytes)


@nb.njit(cache=True, nogil=True, inline="always")
def zero_padding(out, base, row_bytes, n, dst, length):  # pragma: no cover - numba
    """Zero the padding of one window row of ``out`` (flat bytes from ``base``): its ``length`` steps of
    ``row_bytes`` outside the real steps ``dst .. dst + n - 1``."""
    if dst > 0:
        zero_bytes(out, base, dst * row_bytes)
    if dst + n < length:
        zero_bytes(out, base + (dst + n) * row_bytes, (length - dst - n) * row_bytes)


@nb.njit(cache=True, nogil=True, inline="always")
def copy_window(out, base, src, row_bytes, capacity, slot, n, dst, length, stream):  # pragma: no cover
    """One window out of a ring: the CPU ring gather (every CPU copy of windows calls this).

    ``src`` a field's ring as flat bytes (``capacity`` rows of ``row_bytes``), ``out`` flat bytes whose
    window row starts at byte ``base``; the ``n`` real steps from ring slot ``slot`` (one run, or two
    when they wrap past the ring's end, `first_run`; each `copy_run`) go to steps ``dst .. dst + n - 1``;
    the other steps of the ``length`` are zeroed (`zero_padding`).
    """
    n1 = first_run(slot, n, capacity)
    o = base + dst * row_bytes
    copy_run(out, o, src, slot * row_bytes, n1 * row_bytes, stream)
    if n > n1:
        copy_run(out, o + n1 * row_bytes, src, 0, (n - n1) * row_bytes, stream)
    zero_padding(out, base, row_bytes, n, dst, length)


@nb.njit(cache=True, nogil=True, inline="always")
def prefetch_pages(src, row_bytes, capacity, slot, n):  # pragma: no cover - numba
    """Ask for the first line of each page of a window's steps (``n`` from ring ``slot``) into L2.

    For rows of at least `PAGE` bytes, issued `AHEAD` windows before the copy: the hardware
    prefetcher follows a run only within a 4 KiB page, so each page's first miss (and its TLB walk)
    would otherwise stall the copy. No effect on results.
    """
    n1 = first_run(slot, n, capacity)
    for o in range(slot * row_bytes, (slot + n1) * row_bytes, PAGE):
        prefetch_l2(src, o)
    for o in range(0, (n - n1) * row_bytes, PAGE):
        prefetch_l2(src, o)


@nb.njit(cache=True, nogil=True)
def _gather(src, row_bytes, capacity, first_slot, n, dst, rows, length, out, stream):  # pragma: no cover
    ahead = AHEAD if row_bytes >= PAGE else 0
    for b in range(min(ahead, first_slot.shape[0])):
        prefetch_pages(src, row_bytes, capacity, first_slot[b], n[b])
    for b in range(first_slot.shape[0]):
        if ahead and b + ahead < first_slot.shape[0]:
            prefetch_pages(src, row_bytes, capacity, first_slot[b + ahead], n[b + ahead])
        base = rows[b] * length * row_bytes
        copy_window(out, base, src, row_bytes, capacity, first_slot[b], n[b], dst[b], length, stream)
    if stream:
        store_fence()


@nb.njit(cache=True, nogil=True)
def _gather_fields(
    srcs, outs, row_bytes, capacity, first_slot, n, dst, rows, length, mask, stream, threshold
):  # pragma: no cover
    if stream < 0:  # auto: stream when the windows' output is large (see gather_fields)
        total = 0
        for j in range(row_bytes.shape[0]):
            total += row_bytes[j]
        stream = 1 if first_slot.shape[0] * length * total >= threshold else 0
    if len(srcs) > 0:  # an empty tuple (no raw field): skipped untyped (`replay.commit_kernel.write_steps`)
        for j in range(len(srcs)):
            _gather(srcs[j], row_bytes[j], capacity, first_slot, n, dst, rows, length, outs[j], stream)
    if mask.shape[0]:
        for b in range(first_slot.shape[0]):
            mask_row(mask, rows[b] * length, n[b], dst[b], length)


def gather_fields(
    srcs: tuple[np.ndarray, ...],
    outs: tuple[np.ndarray, ...],
    row_bytes: np.ndarray,
    capacity: int,
    first_slot: np.ndarray,
    n: np.ndarray,
    dst: np.ndarray,
    rows: np.ndarray,
    length: int,
    mask: np.ndarray | None = None,
    stream: bool | None = None,
    threads: int = 1,
) -> None:
    """`gather_windows` for several fields of one ring at once, on flat byte views (the store's hot path).

    Parameters
    ----------
    srcs : tuple of numpy.ndarray, uint8 [capacity * row_bytes[j]]
        Each raw field's ring as flat bytes; empty when every field has a codec (only the mask is filled,
        `replay.chunk_decode` decodes).
    outs : tuple of numpy.ndarray, uint8 [R * length * row_bytes[j]]
        Each raw field's batch as flat bytes.
    row_bytes : numpy.ndarray, int64 [F]
    capacity : int
    first_slot, n, dst, rows : numpy.ndarray, int64 [B]
        As for `gather_windows` (all arrays trusted: no checks).
    length : int
    mask : numpy.ndarray, bool [R * length], optional
        Filled with ``dst <= j < dst + n`` for each window's row.
    stream : bool or None
        Copy runs of `STREAM_PIECE` bytes and more with streaming stores (see `graphrl.kernels`);
        default: when the windows' output is at least `graphrl.kernels.STREAM_THRESHOLD` bytes.
    threads : int
        Threads that may copy, the caller included (windows are split into chunks of at least
        ``_CHUNK_BYTES`` of output; see `graphrl.kernels.parallel_for`).
    """
    b = first_slot.shape[0]
    mask = _NO_MASK if mask is None else mask
    threshold = STREAM_THRESHOLD  # an argument, not a global, so that cached kernels follow a change of it
    if threads <= 1:  # the common case: no Python arithmetic (the kernel decides on streaming)
        code = -1 if stream is None else int(bool(stream))
        _gather_fields(
            srcs, outs, row_bytes, capacity, first_slot, n, dst, rows, length, mask, code, threshold
        )
        return
    total = b * length * int(row_bytes.sum())
    stream = total >= STREAM_THRESHOLD if stream is None else bool(stream)
    chunks = min(b, total // _CHUNK_BYTES)
    if chunks <= 1:
        _gather_fields(
            srcs, outs, row_bytes, capacity, first_slot, n, dst, rows, length, mask, int(stream), threshold
        )
        return
    bounds = np.linspace(0, b, chunks + 1).astype(np.int64)

    def chunk(i: int) -> None:
        part = slice(bounds[i], bounds[i + 1])
        args = (first_slot[part], n[part], dst[part], rows[part])
        _gather_fields(srcs, outs, row_bytes, capacity, *args, length, mask, int(stream), threshold)

    parallel_for(chunk, chunks, threads)


def gather_windows(
    src: np.ndarray,
    first_slot: np.ndarray,
    n: np.ndarray,
    dst: np.ndarray,
    out: np.ndarray,
    rows: np.ndarray | None = None,
    stream: bool | None = None,
) -> np.ndarray:
    """Copy windows out of a ring column into ``out``, zeroing the padding.

    Parameters
    ----------
    src : numpy.ndarray, shape [C, *field_shape], C-contiguous
        One field's ring buffer (any dtype).
    first_slot : numpy.ndarray, int64 [B]
        Slot of each window's first real step, ``first % C``.
    n, dst : numpy.ndarray, int64 [B]
        From `window_bounds`; ``n <= C``.
    out : numpy.ndarray, shape [R, L, *field_shape], same dtype, C-contiguous
        Filled in place.
    rows : numpy.ndarray, int64 [B], optional
        Row of ``out`` for each window (default ``0..B-1``); each ``0 <= row < R``.
    stream : bool or None
        Streaming stores for long runs, as in `gather_fields` (default: for outputs of at least
        `graphrl.kernels.STREAM_THRESHOLD` bytes).

    Returns
    -------
    numpy.ndarray
        ``out``.

    Raises
    ------
    ValueError
        Mismatched dtypes, shapes or a non-contiguous array.
    """
    if src.dtype != out.dtype or src.shape[1:] != out.shape[2:]:
        raise ValueError(f"gather: src {src.dtype}{src.shape} and out {out.dtype}{out.shape} do not match")
    if not (src.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("gather: src and out must be C-contiguous")
    if rows is None:
        rows = np.arange(len(first_slot), dtype=np.int64)
    elif len(rows) and (np.min(rows) < 0 or np.max(rows) >= out.shape[0]):
        raise ValueError(f"gather: rows must lie in [0, {out.shape[0]})")
    capacity = src.shape[0]
    row_bytes = src.itemsize * (src.size // capacity if capacity else 0)
    flat_src = src.reshape(-1).view(np.uint8)
    flat_out = out.reshape(-1).view(np.uint8)
    if stream is None:
        stream = len(first_slot) * out.shape[1] * row_bytes >= STREAM_THRESHOLD
    _gather(
        flat_src,
        row_bytes,
        capacity,
        np.ascontiguousarray(first_slot, dtype=np.int64),
        np.ascontiguousarray(n, dtype=np.int64),
        np.ascontiguousarray(dst, dtype=np.int64),
        np.ascontiguousarray(rows, dtype=np.int64),
        out.shape[1],
        flat_out,
        bool(stream),
    )
    return out


def reference_gather(
    src: np.ndarray, first_slot: np.ndarray, n: np.ndarray, dst: np.ndarray, length: int
) -> np.ndarray:
    """Plain-Python `gather_windows` (step by step, modulo the ring) for tests."""
    capacity = src.shape[0]
    out = np.zeros((len(first_slot), length, *src.shape[1:]), dtype=src.dtype)
    for b in range(len(first_slot)):
        for j in range(int(n[b])):
            out[b, int(dst[b]) + j] = src[(int(first_slot[b]) + j) % capacity]
    return out


@dataclass(frozen=True)
class WindowTable:
    """Windows drawn by `ReplayStore.draw_windows` and not gathered: where each one's steps lie in its shard.

    Window b's real steps are the positions ``first[b] .. first[b] + n[b] - 1`` of shard ``shard[b]``,
    in ring slots ``(first[b] + j) % capacity`` (one run of slots, or two when it wraps past the ring's
    end); they go to steps ``dst[b] .. dst[b] + n[b] - 1`` of the window, the rest is padding (zeros in a
    `Batch`, see `replay.windows`).

    Attributes
    ----------
    shard, anchor, first, n, dst : numpy.ndarray, int64 [B]
        The shard, the drawn anchor position, and `replay.windows.window_bounds` of each window.
    probabilities : numpy.ndarray, float64 [B]
        Probability with which each anchor was drawn (as ``Batch.probabilities``).
    table_size : int
        N: drawable items when the windows were drawn (as ``Batch.table_size``).
    capacity : int
        Steps per shard ring.
    """

    shard: np.ndarray
    anchor: np.ndarray
    first: np.ndarray
    n: np.ndarray
    dst: np.ndarray
    probabilities: np.ndarray
    table_size: int
    capacity: int
    incarnation: int = 0

    def __len__(self) -> int:
        return len(self.anchor)

    @property
    def keys(self) -> np.ndarray:
        """int64 [B]: the windows' keys (as ``Batch.keys``, for `ReplayStore.update_priorities`)."""
        return encode_keys(self.shard, self.anchor, self.anchor - self.first, self.incarnation)

    @property
    def slots(self) -> np.ndarray:
        """int64 [B]: the ring slot of each window's first real step."""
        return self.first % self.capacity

    def take(self, rows: np.ndarray) -> WindowTable:
        """The windows ``rows`` (an index or a bool mask over B), in that order."""
        return WindowTable(
            self.shard[rows],
            self.anchor[rows],
            self.first[rows],
            self.n[rows],
            self.dst[rows],
            self.probabilities[rows],
            self.table_size,
            self.capacity,
            self.incarnation,
        )
