"""A partition owner: one part of a partition folder, served to samplers and feature stores.

`PartitionOwner` loads part ``p`` of a folder (verified: `graphrl.partition.load_partition`) and
answers three requests, each for many nodes at once: `sample` (one layer's rows through the sampling
core, `samplers.distributed.core`), `rows` (feature or label rows of owned nodes) and `hot_nodes` (its
nodes of highest in-degree, for a feature cache). It is a plain class: `samplers.distributed.owners`
runs it in-process or as a Ray actor, built again from the folder when restarted. The owner holds its
rows' CSC indexed by global node id (8 bytes per node of the graph, see
docs/architecture.md#partitioned-graphs), so the core's kernel reads it unchanged.
"""

from __future__ import annotations

import os

import numpy as np

from graphrl.partition import load_partition
from graphrl.threads import team_size
from samplers.distributed.core import row_prefix, sample_owned_rows

__all__ = ["PartitionOwner"]


class PartitionOwner:
    """Serve one part of a partition folder.

    Parameters
    ----------
    folder : str
        The partition folder (`graphrl.partition.write_partitions`).
    part : int
        The part to hold, in [0, P).
    expect : str or None
        The graph fingerprint the folder must hold.

    Raises
    ------
    graphrl.partition.PartitionError
        A damaged folder (naming the file), a bad ``part``, or a folder of another graph.
    """

    def __init__(self, folder: str, part: int, expect: str | None = None) -> None:
        self.partition = load_partition(folder, part, expect)
        p = self.partition
        self.folder = str(folder)
        deg = np.diff(p.indptr)
        counts = np.zeros(p.num_nodes, dtype=np.int64)
        counts[p.owned] = deg
        self.indptr = np.zeros(p.num_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=self.indptr[1:])
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None

    def info(self) -> dict:
        """Part, folder, fingerprint, process id, and the owned node, edge and halo counts."""
        p = self.partition
        feats = None if p.features is None else [str(p.features.dtype), list(p.features.shape[1:])]
        return {"part": p.part, "folder": self.folder, "fingerprint": p.fingerprint, "pid": os.getpid(),
                "nodes": int(p.owned.shape[0]), "edges": int(p.indices.shape[0]),
                "halo": int(p.halo.shape[0]), "weighted": p.weights is not None, "features": feats,
                "labels": None if p.labels is None else str(p.labels.dtype)}

    def sample(self, dst: np.ndarray, fanout: int, replace: bool, key: int, weighted: bool,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One layer's draws for owned rows ``dst`` (int64 [D], global ids, trusted owned).

        Returns counts int64 [D], sources int64 [nnz] (global ids) and edge ids int64 [nnz], rows in
        the order of ``dst``.

        Raises
        ------
        ValueError
            ``weighted`` on a part written without weights.
        """
        p = self.partition
        weights = None
        if weighted:
            if p.weights is None:
                raise ValueError(f"weighted sampling asked of part {p.part}, whose folder holds no edge "
                                 "weights")
            if self._prefix is None:
                self._prefix = row_prefix(self.indptr, p.weights, team_size())
            weights = p.weights
        return sample_owned_rows(self.indptr, p.indices, p.edge_ids, dst, int(fanout), bool(replace),
                                 int(key), team_size(), weights, self._prefix if weighted else None)

    def rows(self, ids: np.ndarray, name: str = "features") -> np.ndarray:
        """Rows of owned nodes ``ids`` (int64 [K], global) of ``"features"`` ([K, F]) or ``"labels"`` ([K]).

        Raises
        ------
        ValueError
            An unknown ``name``, a column the folder does not hold, or an id this part does not own.
        """
        if name not in ("features", "labels"):
            raise ValueError(f"name must be 'features' or 'labels', got {name!r}")
        data = getattr(self.partition, name)
        if data is None:
            raise ValueError(f"part {self.partition.part} of {self.folder} holds no {name}")
        return data[self.partition.local_ids(ids)]

    def hot_nodes(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` owned nodes of highest in-degree (int64, global ids; fewer when it owns fewer) and
        their in-degrees (int64), highest first."""
        p = self.partition
        deg = np.diff(p.indptr)
        top = np.argsort(-deg, kind="stable")[: max(int(k), 0)]
        return p.owned[top], deg[top]
