"""How a shard's windows travel to the client: runs of ring slots, then placed into the batch.

A shard gives its drawn windows (`replay.windows.WindowTable`) to `ring_runs`, which merges the ring slots
they read into runs (windows that overlap or touch share one run, so a ring byte travels once however
many windows read it); the shard puts the runs' flat byte views into Ray's object store with one
``ray.put``. The client maps them zero-copy (``ray.get`` on the same node) and `place` copies each
window's one or two pieces into its rows of the staging slot, zeroes the padding and writes the mask
with the CPU ring gather's own parts (`replay.windows.first_run` splits a wrapped window,
`replay.windows.copy_run` copies a piece, streaming stores for large batches; `replay.windows.zero_padding`,
`replay.windows.window_mask`): the batch holds the bytes a local gather of the same windows gives
(`replay.windows.gather_fields`). A codec field travels as compressed chunks and
is decompressed into the batch here (`replay.distributed.chunk_transport`). See docs/architecture.md#windows.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import store_fence
from replay.distributed.chunk_transport import unpack_field
from replay.windows import WindowTable, copy_run, first_run, window_mask, zero_padding

__all__ = ["concat_tables", "place", "ring_runs"]


def ring_runs(
    slots: np.ndarray, n: np.ndarray, dst: np.ndarray, capacity: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The runs of ring slots that hold a set of windows, and where each window's pieces lie in them.

    A window is one segment of slots, or two when it wraps past the ring's end; segments that overlap
    or touch merge into one run, so every ring byte is sent once however many windows read it.

    Parameters
    ----------
    slots, n, dst : numpy.ndarray, int64 [B]
        Each window's first slot, real steps and offset in the window (`replay.windows.WindowTable`).
    capacity : int
        Ring slots.

    Returns
    -------
    runs : numpy.ndarray, int64 [R, 2]
        ``[start, end)`` slots of each run, in slot order.
    segments : dict of str to numpy.ndarray, int64 [G], sorted by run
        ``window`` (index in the B windows), ``run``, ``off`` (first step in the run), ``wdst`` (first
        step in the window), ``len`` (steps).
    """
    n1 = first_run(slots, n, capacity)
    wrap = np.flatnonzero(n > n1)
    start = np.concatenate([slots, np.zeros(len(wrap), np.int64)])
    length = np.concatenate([n1, n[wrap] - n1[wrap]])
    window = np.concatenate([np.arange(len(slots), dtype=np.int64), wrap])
    wdst = np.concatenate([dst, dst[wrap] + n1[wrap]])
    order = np.argsort(start, kind="stable")
    start, length, window, wdst = start[order], length[order], window[order], wdst[order]
    end = start + length
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > np.maximum.accumulate(end)[:-1]
    heads = np.flatnonzero(new)
    runs = (
        np.stack([start[heads], np.maximum.reduceat(end, heads)], axis=1)
        if len(heads)
        else np.zeros((0, 2), np.int64)
    )
    run = np.cumsum(new) - 1
    return runs, {"window": window, "run": run, "off": start - runs[run, 0], "wdst": wdst, "len": length}


def concat_tables(tables: list[WindowTable]) -> WindowTable:
    """One `WindowTable` of several draws' tables, in order (size, capacity, incarnation of the last)."""
    return WindowTable(
        *(
            np.concatenate([getattr(t, f) for t in tables])
            for f in ("shard", "anchor", "first", "n", "dst", "probabilities")
        ),
        tables[-1].table_size,
        tables[-1].capacity,
        tables[-1].incarnation,
    )


@nb.njit(cache=True, nogil=True)
def copy_segments(pieces, outs, row_bytes, off, dst, n, stream):  # pragma: no cover - numba
    """Copy segments of one run (``pieces[j]``: field j's bytes) to steps ``dst`` of the batch ``outs``
    (each one `replay.windows.copy_run`)."""
    for j in range(len(outs)):
        rb = row_bytes[j]
        for i in range(off.shape[0]):
            copy_run(outs[j], dst[i] * rb, pieces[j], off[i] * rb, n[i] * rb, stream)
    if stream:
        store_fence()


@nb.njit(cache=True, nogil=True)
def zero_pads(outs, row_bytes, row0, n, dst, length):  # pragma: no cover - numba
    """Zero the padding of windows ``row0 ..`` in every field (`replay.windows.zero_padding`)."""
    for j in range(len(outs)):
        rb = row_bytes[j]
        for b in range(n.shape[0]):
            zero_padding(outs[j], (row0 + b) * length * rb, rb, n[b], dst[b], length)


def place(
    reply: dict,
    pieces: list[list[np.ndarray]],
    outs: tuple[np.ndarray, ...],
    mask: np.ndarray,
    row_bytes: np.ndarray,
    row0: int,
    length: int,
    stream: bool,
    dctx: int = 0,
) -> None:
    """Copy one shard reply's windows into rows ``row0 ..`` of a batch: fields, padding and mask.

    ``pieces[i]`` is ``ray.get`` of ``reply["parts"][i][0]``: flat byte views of the raw fields' runs
    (run-major), then one blob of compressed chunks per codec field, decompressed here
    (`replay.distributed.chunk_transport.unpack_field`; ``dctx`` a zstd context for zstd fields);
    ``outs`` the batch's fields as flat bytes ([B * L * row_bytes[j]]), ``mask`` bool [B, L]. Gives
    the bytes a gather of the same windows from the rings gives (`replay.windows.gather_fields`).

    Raises
    ------
    RuntimeError
        A codec field's chunk did not decompress (corrupt bytes).
    """
    for (_, num_runs, seg, packs), got in zip(reply["parts"], pieces, strict=True):
        coded = {pk.field for pk in packs}
        raw = [j for j in range(len(outs)) if j not in coded]
        f = len(raw)
        raw_outs = tuple(outs[j] for j in raw)
        raw_bytes = row_bytes[raw]
        bounds = np.searchsorted(seg["run"], np.arange(num_runs + 1))
        dst = (row0 + seg["window"]) * length + seg["wdst"]
        for r in range(num_runs if f else 0):
            lo, hi = bounds[r], bounds[r + 1]
            if hi > lo:
                copy_segments(
                    tuple(got[r * f : (r + 1) * f]),
                    raw_outs,
                    raw_bytes,
                    seg["off"][lo:hi],
                    dst[lo:hi],
                    seg["len"][lo:hi],
                    stream,
                )
        for pk, blob in zip(packs, got[num_runs * f :], strict=True):
            unpack_field(pk, blob, outs[pk.field], row0, length, int(row_bytes[pk.field]), dctx)
    n, d = reply["n"], reply["dst"]
    zero_pads(outs, row_bytes, row0, n, d, length)
    window_mask(n, d, length, out=mask[row0 : row0 + len(n)])
