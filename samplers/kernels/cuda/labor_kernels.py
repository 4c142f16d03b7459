"""The LABOR kernels on the GPU, a thread per row: the passes of `samplers.kernels.cpu.labor` with the same
arithmetic (`samplers.kernels.labor_rows`, compiled here for the device), so the same seed keeps the same
edges on both devices. The host side (sizes, scratch, the order of launches) is
`samplers.kernels.cuda.labor`.

``labor_init`` takes each row's span and starting c_t. Importance sampling numbers the layer's unique sources
once (``labor_claim``: each source's first eligible edge by an atomic min; ``labor_owners`` counts them per
row and, after a scan, numbers them), so pi holds one float64 per unique source. Each iteration takes the max
of c_t per source (``labor_hop_max``, an atomic max), the owning row updates the source's pi and its share of
the expected source count (``labor_hop_apply``), every row solves its c_t again (``labor_solve``), the shares
are summed exactly (`samplers.kernels.cuda.exact_sum.sum_exact`) and ``labor_decide`` tests the CPU's rule
(`labor_rows.converged`) on the device: the fixed point's status (`RUNNING`, `DONE`, `OVERFLOW`) makes the
later iterations' kernels exit at once. ``labor_count`` and ``labor_take`` keep the edges, ``labor_release``
restores the scratch.

References
----------
Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS 2023);
DGL's ``CSRLaborPick``.

"""

from __future__ import annotations

import types

import numpy as np
from numba import cuda

from samplers.kernels import labor_rows
from samplers.kernels.cuda import rng
from samplers.kernels.cuda.exact_sum import SUM_WORDS, round_exact, sum_exact
from samplers.kernels.cuda.rows import row_span

__all__ = ["DONE", "KERNELS", "OVERFLOW", "RUNNING", "labor_claim", "labor_count", "labor_decide",
           "labor_hop_apply", "labor_hop_max", "labor_init", "labor_owners", "labor_release", "labor_solve",
           "labor_start", "labor_take", "sum_exact"]

@cuda.jit(device=True)
def _raise_hop_max(hop, owner, u, ct, f):  # pragma: no cover - device
    """`labor_rows.raise_hop`'s max, atomic (rows of the layer run concurrently and share sources); the
    owners were claimed once for the layer (`labor_claim`), so ``owner`` and ``f`` are not used."""
    cuda.atomic.max(hop, u, ct)


@cuda.jit(device=True)
def _pi_slot(indices, slots, p0, s, j):  # pragma: no cover - device
    """`labor_rows.pi_index` on the GPU: pi per unique source of the layer, source u at slot
    ``-1 - slots[u]`` (`labor_owners`; ``p0`` and ``s`` not used)."""
    return -1 - slots[indices[j]]


_ROWS = labor_rows.compile_for(cuda.jit(device=True), types.SimpleNamespace(
    row_state=rng.row_state, draw=rng.draw, unit=rng.unit), raise_hop=_raise_hop_max, pi_index=_pi_slot)
_start_c = _ROWS.start_c
_solve_c = _ROWS.solve_c
_count_kept = _ROWS.count_kept
_take_kept = _ROWS.take_kept
_skipped = _ROWS.skipped
_clip1 = _ROWS.clip1
_next_pi = _ROWS.next_pi
_converged = _ROWS.converged
_hop_max_row = _ROWS.hop_max_row
_hop_reset_row = _ROWS.hop_reset_row


RUNNING = 0
"""A layer's fixed point is still iterating (`labor_start`; also the status of a layer without one)."""
DONE = 1
"""A layer's fixed point has converged (`labor_decide`, the CPU's rule), or it has no rows."""
OVERFLOW = 2
"""A chained layer's fixed point cannot finish on the device (its sources pass pi's capacity): the layer is
sampled again unchained."""

@cuda.jit
def labor_init(indptr, dst, nrow, fanout, excl, weights, has_w, row_s, row_e, row_a, row_b, raw,
               cs):  # pragma: no cover - device
    """Each of the first ``nrow[0]`` rows' span and starting c_t; the rest of ``dst`` (an upper bound)
    an empty row with c_t = 0 (nothing kept)."""
    i = cuda.grid(1)
    n_excl = excl.shape[0]
    n = nrow[0]
    while i < dst.shape[0]:
        if i >= n:
            row_s[i] = 0
            row_e[i] = 0
            row_a[i] = 0
            row_b[i] = 0
            raw[i] = 0
            cs[i] = 0.0
            i += cuda.gridsize(1)
            continue
        s, e, a, b = row_span(indptr, excl, n_excl, dst[i])
        row_s[i] = s
        row_e[i] = e
        row_a[i] = a
        row_b[i] = b
        raw[i] = e - s
        cs[i] = _start_c(fanout, weights, has_w, excl, a, b, s, e)
        i += cuda.gridsize(1)


@cuda.jit
def labor_claim(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off,
                owner):  # pragma: no cover - device
    """owner[u] = the first (lowest frontier index ``raw_off[i] + j - s``) of source u's eligible edges in
    the rows (an atomic min: any order), once per layer (eligibility does not change between iterations)."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        s, q, b, off = row_s[i], row_a[i], row_b[i], raw_off[i]
        for j in range(s, row_e[i]):
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            if not skip:
                cuda.atomic.min(owner, indices[j], off + j - s)
        i += cuda.gridsize(1)


@cuda.jit
def labor_owners(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off, owner, slot,
                 number):  # pragma: no cover - device
    """Row i's owned sources (their first eligible edge in row i, `labor_claim`): counted into slot[i];
    with ``number`` (``slot`` their offsets [D + 1]) numbered in CSC order from slot[i], owner[u] =
    ``-1 - slot`` (negative: no row's edge index equals it, so the rows beside still see their owners)."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        s, q, b, off = row_s[i], row_a[i], row_b[i], raw_off[i]
        k = slot[i] if number else 0
        for j in range(s, row_e[i]):
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            if not skip and owner[indices[j]] == off + j - s:
                if number:
                    owner[indices[j]] = -1 - k
                k += 1
        if not number:
            slot[i] = k
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_max(indices, weights, has_w, use_w, excl, row_s, row_e, row_a, row_b, raw_off, cs, hop, owner,
                  status):  # pragma: no cover - device
    """hop[u] = the max of c_t (times A with ``use_w``) over source u's eligible edges (atomic max)."""
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_max_row(indices, weights, has_w, use_w, excl, row_a[i], row_b[i], row_s[i], row_e[i], raw_off[i],
                     cs[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_apply(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, slot_off, hop, owner, pi,
                    first, contrib, status):  # pragma: no cover - device
    """`labor_rows.hop_apply_row` per unique source: row i's owned sources (slots ``slot_off[i]...`` in CSC
    order) take their pi (`labor_rows.next_pi`) and clear their hop; contrib[i] sums min(1, pi) over them in
    that order (the CPU's sum)."""
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        q, b = row_a[i], row_b[i]
        k, end = slot_off[i], slot_off[i + 1]
        total = 0.0
        for j in range(row_s[i], row_e[i]):
            if k == end:
                break
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            u = indices[j]
            if not skip and owner[u] == -1 - k:
                pi[k] = _next_pi(pi[k], hop[u], first)
                hop[u] = 0.0
                total += _clip1(pi[k])
                k += 1
        contrib[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def labor_release(indices, row_s, row_e, hop, owner):  # pragma: no cover - device
    """The scratch restored after a layer: hop[u] = 0 and owner[u] = NO_OWNER for the rows' sources."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_reset_row(indices, row_s[i], row_e[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_solve(fanout, indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                cs, status):  # pragma: no cover - device
    """Each row's c_t solved again over the current pi (`labor_rows.solve_c`; rows with c_t = 0 keep
    nothing and are skipped), while the fixed point runs."""
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        if cs[i] > 0:
            cs[i] = _solve_c(cs[i], fanout, indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl,
                             row_a[i], row_b[i], row_s[i], row_e[i])
        i += cuda.gridsize(1)


@cuda.jit
def labor_start(raw_off, slot_off, pi_cap, nrow, status, prev, acc):  # pragma: no cover - device
    """A chained layer's fixed point starts (one thread), no iteration run (``status[1]``), the exact sum
    cleared: running, the expected source count at its bound (the rows' edges, ``raw_off``'s last entry),
    or an overflow where its sources (``slot_off``'s last) pass pi's capacity ``pi_cap``; no rows
    (``nrow[0]`` 0; ``raw_off``, ``slot_off`` unread, may be empty): done, as the CPU's loop runs none."""
    if cuda.grid(1) != 0:
        return
    for w in range(SUM_WORDS):
        acc[w] = 0
    status[0], status[1] = DONE, 0
    if nrow[0] > 0:
        prev[0] = np.float64(raw_off[raw_off.shape[0] - 1])
        status[0] = RUNNING if slot_off[slot_off.shape[0] - 1] <= pi_cap else OVERFLOW


@cuda.jit
def labor_decide(acc, status, prev, it):  # pragma: no cover - device
    """The fixed point's test after iteration ``it`` (one thread), the CPU's (`labor_rows.converged`): the
    expected source count (``acc`` rounded once, as ``math.fsum``; then cleared) against the previous one;
    done, or the next iteration's previous count; ``status[1]`` = the iterations run (``it + 1``). A fixed
    point no longer running returns at once (``acc`` is clear: `sum_exact` added nothing)."""
    if cuda.grid(1) != 0 or status[0] != RUNNING:
        return
    expected = round_exact(acc)
    status[1] = it + 1
    if _converged(prev[0], expected, it):
        status[0] = DONE
    else:
        prev[0] = expected


@cuda.jit
def labor_count(indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs,
                vkey, counts, status, capped, cap):  # pragma: no cover - device
    """Each row's kept count; a chained layer whose fixed point did not finish on the device (``status``
    an overflow: pi past its capacity; or, with ``capped``, still running after the launched iterations)
    writes ``cap + 1`` for its first row and 0 for the others, an overflow of its edges' capacity ``cap``
    (pi is not read)."""
    bad = status[0] == OVERFLOW or (capped and status[0] == RUNNING)
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        n = 0
        if bad:
            n = cap + 1 if i == 0 else 0
        elif cs[i] > 0:
            n = _count_kept(indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                            row_s[i], row_e[i], cs[i], vkey)
        counts[i] = n
        i += cuda.gridsize(1)


@cuda.jit
def labor_take(indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs,
               vkey, out_indptr, pos, ew, want_w):  # pragma: no cover - device
    """Each row's kept CSC positions into pos[out_indptr[i]:out_indptr[i + 1]] and, with ``want_w``, their
    edge weights into ``ew`` (`labor_rows.take_kept`); a row past ``pos``'s end (a chain's overflow, read
    back and sampled again) writes zeros up to the end, safe positions for the gather."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        o = out_indptr[i]
        n = out_indptr[i + 1] - o
        if n > 0 and o + n > pos.shape[0]:  # past a chain's capacity (an overflow, sampled again): safe
            for x in range(o, pos.shape[0]):  # positions for the gather (o + n is past the end)
                pos[x] = 0
        elif n > 0:
            _take_kept(indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                       row_s[i], row_e[i], cs[i], vkey, pos, ew, want_w, o, n)
        i += cuda.gridsize(1)


KERNELS = {"labor_init": labor_init, "labor_claim": labor_claim, "labor_owners": labor_owners,
           "labor_hop_max": labor_hop_max, "labor_hop_apply": labor_hop_apply,
           "labor_release": labor_release, "labor_solve": labor_solve, "labor_count": labor_count,
           "labor_take": labor_take, "labor_start": labor_start, "sum_exact": sum_exact,
           "labor_decide": labor_decide}
"""The LABOR kernels by name."""
