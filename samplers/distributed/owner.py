"""A partition owner: one part of a partition folder, served to samplers and feature stores.

`PartitionOwner` loads part ``p`` of a folder (verified: `graphrl.partition.load_partition`) and
answers three requests, each for many nodes at once: `sample` (one layer's rows through the sampling
core, `samplers.distributed.core`, asked in one buffer; `sample_rows` takes them unpacked), `rows`
(feature or label rows of owned nodes) and `hot_nodes` (its nodes of highest out-degree, for a feature
cache). It is a plain class: `samplers.distributed.owners`
runs it in-process or as a Ray actor, built again from the folder when restarted. The owner holds its
rows' CSC indexed by global node id (8 bytes per node of the graph, see
docs/architecture.md#partitioned-graphs), so the core's kernel reads it unchanged.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np

from graphrl.partition import load_partition
from graphrl.threads import team_size
from samplers.distributed.assemble import pack_reply, reply_buffer, unpack_request
from samplers.distributed.core import KINDS, owner_loop, sample_owned_rows, sample_owned_segments

__all__ = ["PartitionOwner"]

_INT32_MAX = np.iinfo(np.int32).max


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
    threads : int or None
        Threads of the owner's kernels (at most `graphrl.threads.team_size`); ``None``: that many.
        Several owners on one host share its cores: 1 each keeps them from waiting on each other.
    manifest : str or None
        The manifest sha256 of the book its samplers route by (`graphrl.partition.PartitionBook.digest`).

    Raises
    ------
    graphrl.partition.PartitionError
        A damaged folder (naming the file), a bad ``part``, a folder of another graph, or one written
        again since ``manifest``.
    """

    def __init__(self, folder: str, part: int, expect: str | None = None, threads: int | None = None,
                 manifest: str | None = None) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
        self.partition = load_partition(folder, part, expect, manifest)
        self.threads = threads
        p = self.partition
        self.folder = str(folder)
        deg = np.diff(p.indptr)
        counts = np.zeros(p.num_nodes, dtype=np.int64)
        counts[p.owned] = deg
        self.indptr = np.zeros(p.num_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=self.indptr[1:])
        self._loops: dict[tuple, object] = {}  # the core's layer loop per (kind, weighted, replace)
        self._derived: dict = {}  # the loops' one copy of the pairs and prefix sums (core.owner_loop)
        # replies in int32 where the graph's node ids, edge ids and counts fit it: half the bytes
        self._wide = max(p.num_nodes, int(p.edge_ids.max(initial=0)), p.indices.shape[0]) > _INT32_MAX
        self._busy = {"sample_s": 0.0, "sample_cpu_s": 0.0, "rows_s": 0.0, "requests": 0}

    def freeze_gc(self) -> None:
        """Exempt the objects alive now from Python's cyclic collector (`gc.freeze`), for an owner with
        a process to itself (`RayOwners` calls it on each actor): that process keeps the part, the
        engine and its libraries' modules for its whole life, and every full collection would walk them
        all again. Objects made by later requests are collected as usual."""
        gc.collect()
        gc.freeze()

    def _threads(self) -> int:
        return team_size() if self.threads is None else min(self.threads, team_size())

    def counters(self) -> dict:
        """Requests served, seconds spent in `sample` (wall and this process's CPU) and `rows`, and
        ``process_cpu_s``: the CPU seconds of this owner's process so far (the engine's work included)."""
        return {**self._busy, "process_cpu_s": time.process_time()}

    def info(self) -> dict:
        """Part, folder, fingerprint, manifest sha256, process id, owned node, edge and halo counts."""
        p = self.partition
        feats = None if p.features is None else [str(p.features.dtype), list(p.features.shape[1:])]
        return {"part": p.part, "folder": self.folder, "fingerprint": p.fingerprint, "manifest": p.digest,
                "pid": os.getpid(),
                "nodes": int(p.owned.shape[0]), "edges": int(p.indices.shape[0]),
                "halo": int(p.halo.shape[0]), "weighted": p.weights is not None, "features": feats,
                "labels": None if p.labels is None else str(p.labels.dtype)}

    def sample(self, request: np.ndarray) -> tuple:
        """`sample_rows` of one request packed by `samplers.distributed.assemble.pack_request` (uint8):
        an engine call then carries one array rather than eight arguments. Returns and raises as
        `sample_rows`."""
        return self.sample_rows(*unpack_request(request))

    def sample_rows(self, dst: np.ndarray, bounds: np.ndarray, fanout: int, replace: bool, keys: np.ndarray,
                    weighted: bool, kind: str = "neighbor", variate_keys: np.ndarray | None = None) -> tuple:
        """One layer's draws for owned rows of one or more batches, by the neighbour sampler's rules or
        LABOR-0's (``kind="labor"``).

        Parameters
        ----------
        dst : int32 or int64 [D], global ids, trusted owned: K batches' rows one after another
        bounds : int64 [K + 1], batch b's rows are ``dst[bounds[b]:bounds[b + 1]]``
        fanout : int; replace : bool; weighted : bool
        keys : uint64 [K], each batch's layer key; variate_keys : uint64 [K] or None (``keys``), the keys
            of LABOR's per-source variates

        Returns
        -------
        One buffer of `samplers.distributed.assemble.pack_reply` (int32 where the graph's ids and the
        counts fit it, else int64) and LABOR's edge weights (float32 [nnz], batches one after another)
        or None.

        Raises
        ------
        ValueError
            ``weighted`` on a part written without weights.
        """
        t0, c0 = time.perf_counter(), time.process_time()
        p = self.partition
        mode = (str(kind), bool(weighted), bool(replace))
        if mode not in self._loops:
            if weighted and p.weights is None:
                raise ValueError(f"weighted sampling asked of part {p.part}, whose folder holds no edge "
                                 "weights")
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
            self._loops[mode] = owner_loop(self.indptr, p.indices, p.edge_ids, p.num_nodes,
                                           p.weights if weighted else None, bool(replace), kind,
                                           self._derived)
        vkeys = keys if variate_keys is None else variate_keys
        dst = np.asarray(dst, dtype=np.int64)
        threads = self._threads()
        if kind == "neighbor" and not weighted and not self._wide and fanout <= _INT32_MAX:
            out = self._sample_into(self._loops[mode], dst, bounds, fanout, keys, threads)
            weights = None
        else:
            draws = [sample_owned_rows(self._loops[mode], dst[bounds[b]:bounds[b + 1]], fanout, int(keys[b]),
                                       int(vkeys[b]), threads) for b in range(len(keys))]
            out = pack_reply(draws, self._wide or fanout > _INT32_MAX)
            weights = None if not draws or draws[0][3] is None else np.concatenate([d[3] for d in draws])
        self._busy["sample_s"] += time.perf_counter() - t0
        self._busy["sample_cpu_s"] += time.process_time() - c0
        self._busy["requests"] += 1
        return out, weights

    def _sample_into(self, loop, dst: np.ndarray, bounds: np.ndarray, fanout: int, keys: np.ndarray,
                     threads: int) -> np.ndarray:
        """A uniform loop's int32 `pack_reply` buffer, each batch's sources and edge ids written in
        place by the kernel (`sample_owned_segments`: one set-up for the K batches): no int64 arrays to
        cast and copy."""
        box = []

        def into(nnz: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
            box.append(reply_buffer(np.diff(bounds), nnz, wide=False))
            return [(src, eids) for _, src, eids in box[0][1]]

        counts = sample_owned_segments(loop, dst, bounds, fanout, keys, threads, into)
        out, parts = box[0]
        for b, (row_counts, _, _) in enumerate(parts):
            row_counts[:] = counts[bounds[b]:bounds[b + 1]]
        return out

    def rows(self, ids: np.ndarray, name: str = "features") -> np.ndarray:
        """Rows of owned nodes ``ids`` (int64 [K], global) of ``"features"`` ([K, F]) or ``"labels"`` ([K]).

        Raises
        ------
        ValueError
            An unknown ``name``, a column the folder does not hold, or an id this part does not own.
        """
        t0 = time.perf_counter()
        if name not in ("features", "labels"):
            raise ValueError(f"name must be 'features' or 'labels', got {name!r}")
        data = getattr(self.partition, name)
        if data is None:
            raise ValueError(f"part {self.partition.part} of {self.folder} holds no {name}")
        out = data[self.partition.local_ids(ids)]
        self._busy["rows_s"] += time.perf_counter() - t0
        self._busy["requests"] += 1
        return out

    def hot_nodes(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` owned nodes of highest out-degree (int64, global ids; fewer when it owns fewer) and
        their out-degrees (int64), highest first: the nodes sampling draws as sources most often."""
        p = self.partition
        deg = p.out_degree
        top = np.argsort(-deg, kind="stable")[: max(int(k), 0)]
        return p.owned[top], deg[top]
