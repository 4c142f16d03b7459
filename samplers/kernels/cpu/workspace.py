"""The reusable memory of one sampler (`Workspace`) and the excluded positions of a call (`Exclusion`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Exclusion", "NextPlan", "Workspace", "exclusion_arrays"]

_INT32_MAX = np.iinfo(np.int32).max
_NO_EXCL = np.empty(0, dtype=np.int64)


@dataclass
class NextPlan:
    """A layer planned by the relabelling of the layer before it (`samplers.kernels.cpu.relabel.
    relabel_src_planned`): its rows lie in the workspace's spare row scratch (`Workspace.spare_rows`).

    Attributes
    ----------
    dst : numpy.ndarray, int64, shape [D]
        The planned layer's destinations: the earlier layer's ``src_nodes``, this very object.
    fanout : int
    replace : bool
    counted : bool
        Degrees are positive-weight counts (weighted rows), not row lengths.
    out_indptr : numpy.ndarray, int64, shape [D + 1]
        The planned output offsets.
    """

    dst: np.ndarray
    fanout: int
    replace: bool
    counted: bool
    out_indptr: np.ndarray


class Workspace:
    """Reusable memory of one sampler (one `sample` at a time; not shared between threads).

    Attributes
    ----------
    node_map : numpy.ndarray, int32, shape [N]
        Dense global -> local id map. An entry ``m`` is valid for the current layer iff
        ``m >= base``; the local id is then ``m - base``.
    base : int
        Smallest valid map entry; advanced past every layer's ids, so nothing needs resetting.

    Per-destination and per-edge intermediates grow geometrically and are reused across calls, so a
    steady-state `sample` call allocates only its outputs. The row scratch is double: a layer's
    relabelling can plan the next layer's rows into the spare one (`spare_rows`, `keep_plan`) while its
    own rows are still read, and the next layer takes them (`take_plan`).
    """

    def __init__(self, num_nodes: int, index_dtype=np.int64) -> None:
        self.node_map = np.full(num_nodes, -1, dtype=np.int32)
        self.base = 0
        self._index_dtype = np.dtype(index_dtype)
        self._rows = np.empty((5, 0), dtype=np.int64)
        self._spare = np.empty((5, 0), dtype=np.int64)
        self._plan: NextPlan | None = None
        self._src = np.empty(0, dtype=self._index_dtype)

    def rows(self, n: int) -> np.ndarray:
        """Int64 scratch [5, n]: row starts, effective degrees, excluded-position ranges [lo, hi), row
        ends (the last used by masked rows only)."""
        if self._rows.shape[1] < n:
            self._rows = np.empty((5, max(n, 2 * self._rows.shape[1])), dtype=np.int64)
        return self._rows[:, :n]

    def spare_rows(self, n: int) -> np.ndarray:
        """The spare row scratch, int64 [5, >= n] (C-contiguous, laid out as `rows`), for the next layer's
        plan; it drops any plan kept there."""
        self._plan = None
        if self._spare.shape[1] < n:
            self._spare = np.empty((5, max(n, 2 * self._spare.shape[1])), dtype=np.int64)
        return self._spare

    def keep_plan(self, plan: NextPlan) -> None:
        """Keep ``plan``, whose rows were written into `spare_rows`, for the layer of ``plan.dst``."""
        self._plan = plan

    def take_plan(self, dst: np.ndarray, fanout: int, replace: bool, counted: bool) -> NextPlan | None:
        """The kept plan (`keep_plan`) when it was made for this layer, its rows then the current row
        scratch (`rows`); else None. Either way no plan is kept afterwards.

        Parameters
        ----------
        dst : numpy.ndarray, int64, shape [D]
            The layer's destinations: a plan is taken only for the very array it was made for (``is``).
        fanout : int
            The layer's fanout (k >= 0, or -1), as the plan's.
        replace : bool
            As the plan's.
        counted : bool
            Degrees are positive-weight counts (weighted rows), as the plan's.

        Returns
        -------
        NextPlan or None
            The plan (its ``out_indptr``, int64 [D + 1]; its rows in `rows`, int64 [5, >= D]), or None
            where none was kept or it was made for other destinations or another rule. A layer with
            excluded positions takes none (a plan ahead knows no exclusions): `drop_plan`.
        """
        plan, self._plan = self._plan, None
        if plan is None or plan.dst is not dst or (plan.fanout, plan.replace, plan.counted) != (
                fanout, bool(replace), counted):
            return None
        self._rows, self._spare = self._spare, self._rows
        return plan

    def drop_plan(self) -> None:
        """Forget the kept plan, if any (a layer that plans its own rows)."""
        self._plan = None

    def src(self, n: int) -> np.ndarray:
        """A scratch array of length n for sampled sources, in the graph's index dtype."""
        if self._src.shape[0] < n:
            self._src = np.empty(max(n, 2 * self._src.shape[0]), dtype=self._index_dtype)
        return self._src[:n]

    def reserve(self, ids: int) -> int:
        """Return the base for a layer that may create up to ``ids`` local ids (clears on overflow)."""
        if ids > _INT32_MAX:
            raise ValueError(f"a layer with {ids:,} destinations + sampled edges exceeds the int32 local "
                             f"id range; sample fewer seeds per batch")
        if self.base + ids > _INT32_MAX:
            self.node_map.fill(-1)
            self.base = 0
        return self.base


class Exclusion:
    """Excluded CSC positions prepared once per `sample` call for the kernels of every layer.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]
        The graph's row pointer.
    positions : numpy.ndarray, int64, shape [X]
        Sorted, distinct CSC positions that are never drawn.

    Attributes
    ----------
    positions : numpy.ndarray, int64, shape [X]
    row_bitmap : numpy.ndarray, uint64, shape [ceil(N / 64)]
        Bit v is set iff row v holds an excluded position; rows without one skip all exclusion work.
    """

    def __init__(self, indptr: np.ndarray, positions: np.ndarray) -> None:
        self.positions = np.ascontiguousarray(positions, dtype=np.int64)
        num_nodes = indptr.shape[0] - 1
        self.row_bitmap = np.zeros((num_nodes + 63) // 64, dtype=np.uint64)
        rows = np.searchsorted(indptr, self.positions, side="right") - 1
        bits = np.left_shift(np.uint64(1), (rows & 63).astype(np.uint64))
        np.bitwise_or.at(self.row_bitmap, rows >> 6, bits)


_NO_EXCLUSION_BITMAP = np.zeros(0, dtype=np.uint64)


def exclusion_arrays(indptr, excluded) -> tuple[np.ndarray, np.ndarray]:
    if excluded is None:
        return _NO_EXCL, _NO_EXCLUSION_BITMAP
    if not isinstance(excluded, Exclusion):
        excluded = Exclusion(indptr, excluded)
    return excluded.positions, excluded.row_bitmap
