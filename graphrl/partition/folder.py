"""The partition folder: P parts of a graph on disk, sealed with checksums, and its verified loading.

Layout of a folder written by `write_partitions`::

    folder/MANIFEST.json        format, version, graph fingerprint, P, method, seed, balance, feature and
                                label dtypes and shapes, per-part counts, and the size and sha256 of every
                                other file, sealed with the sha256 of its own content
    folder/node_part.npy        int32 [N]: the part that owns each node (the partition book)
    folder/part{p}/owned.npy    int64 [n_p]: global ids of the owned nodes, ascending (local id = position)
    folder/part{p}/indptr.npy   int64 [n_p + 1]: CSC of the owned destinations' in-edges
    folder/part{p}/indices.npy  int64 [e_p]: global source id of each in-edge, in the graph's CSC order
    folder/part{p}/edge_ids.npy int64 [e_p]: graph edge id of each in-edge
    folder/part{p}/weights.npy  float32 [e_p]: edge weights (weighted graphs only)
    folder/part{p}/halo.npy     int64 [h_p]: sources of owned in-edges owned elsewhere, ascending, distinct
    folder/part{p}/out_degree.npy int64 [n_p]: out-degree of each owned node (how often it is a source)
    folder/part{p}/features.npy [n_p, F], labels.npy [n_p]: rows of the owned nodes (when given)

Global -> local ids: ``node_part[v]`` names the part, ``searchsorted(owned, v)`` the row
(`Partition.local_ids`).
A folder is written under a temporary name and renamed into place, so a crash leaves no half folder.
`load_partition` verifies the manifest's seal and the part's files (and `verify` every file) before
anything is built from them, and refuses a damaged folder (`PartitionError` naming the file), a part
id outside [0, P), and a folder whose graph fingerprint differs from the one expected. See
docs/architecture.md#partitioned-graphs. DistDGL's partition folders follow the same plan (METIS
parts with halo ids and a JSON partition config).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.partition.assign import assign_parts, balance
from graphrl.partition.files import PartitionError, check_files, file_table, seal, unseal

__all__ = ["MANIFEST", "Partition", "PartitionBook", "graph_fingerprint", "load_book", "load_partition",
           "verify", "write_partitions"]

FORMAT = "graphrl.partition"
VERSION = 1
MANIFEST = "MANIFEST.json"
BOOK = "node_part.npy"
_PART_FILES = ("owned", "indptr", "indices", "edge_ids", "halo", "out_degree")


def graph_fingerprint(graph: CSCGraph) -> str:
    """sha256 (hex) of a graph's structure: N, E, ``indptr``, ``indices``, edge ids and weights.

    The arrays are hashed in one dtype each (indices int32 below 2^31 nodes, else int64; edge ids int64;
    weights float32), so the same graph held with int64 indices has the same fingerprint.
    """
    index = np.int32 if graph.num_nodes <= np.iinfo(np.int32).max else np.int64
    h = hashlib.sha256(f"{graph.num_nodes}:{graph.num_edges}:torch.{np.dtype(index).name}".encode())
    for t, dtype in ((graph.indptr, np.int64), (graph.indices, index), (graph.edge_ids, np.int64),
                     (graph.weights, np.float32)):
        h.update(b"|" if t is None else np.ascontiguousarray(t.numpy(), dtype=dtype).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class PartitionBook:
    """Which part owns each node, and what the folder holds.

    Attributes
    ----------
    folder : str; num_parts : int; num_nodes : int; num_edges : int
    node_part : np.ndarray, int32, shape [N]
    fingerprint : str
        `graph_fingerprint` of the partitioned graph.
    manifest : dict
        The verified manifest (method, seed, balance, feature and label dtypes, per-part counts).
    digest : str
        The manifest's sha256: which writing of the folder this is (`load_partition`'s ``manifest``).
    """

    folder: str
    num_parts: int
    num_nodes: int
    num_edges: int
    node_part: np.ndarray
    fingerprint: str
    manifest: dict
    digest: str


@dataclass(frozen=True)
class Partition:
    """One part of a partition folder (numpy arrays; see the module docstring for each).

    Attributes
    ----------
    part, num_parts, num_nodes : int
    owned : int64 [n_p]; indptr : int64 [n_p + 1]; indices : int64 [e_p]; edge_ids : int64 [e_p]
    weights : float32 [e_p] or None; halo : int64 [h_p]; out_degree : int64 [n_p]
    features : [n_p, F] or None; labels : [n_p] or None
    fingerprint : str
    digest : str
        The sha256 of the manifest the part was read under (`PartitionBook.digest`).
    """

    part: int
    num_parts: int
    num_nodes: int
    owned: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray
    weights: np.ndarray | None
    halo: np.ndarray
    out_degree: np.ndarray
    features: np.ndarray | None
    labels: np.ndarray | None
    fingerprint: str
    digest: str

    def local_ids(self, ids: np.ndarray) -> np.ndarray:
        """Local rows (int64) of global node ids this part owns.

        Raises
        ------
        ValueError
            An id this part does not own (names how many and the first).
        """
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self.owned, ids)
        bad = (pos >= self.owned.shape[0]) | (self.owned[np.minimum(pos, self.owned.shape[0] - 1)] != ids)
        if bad.any():
            raise ValueError(f"ids: {int(bad.sum())} of {ids.shape[0]} are not owned by part {self.part}, "
                             f"first {int(ids[bad][0])}")
        return pos


def _as_rows(name: str, value, n: int, ndim: int) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.complex32):
        raise TypeError(f"{name} of dtype {value.dtype} have no numpy dtype to be written in: convert them "
                        f"first ({name}.float())")
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if arr.dtype.kind not in "biuf":  # objects would need pickle to load, strings have no tensor
        raise TypeError(f"{name} must be of a bool, integer or float dtype, got {arr.dtype}")
    if arr.ndim != ndim or arr.shape[0] != n:
        want = "[N]" if ndim == 1 else "[N, F]"
        raise ValueError(f"{name} must have shape {want} with N={n}, got {tuple(arr.shape)}")
    return np.ascontiguousarray(arr)


def write_partitions(graph: CSCGraph, folder: str | os.PathLike[str], num_parts: int, method: str = "auto",
                     seed: int = 0, features=None, labels=None, owner: np.ndarray | None = None) -> dict:
    """Partition ``graph`` into ``num_parts`` parts and write them as a sealed partition folder.

    Parameters
    ----------
    graph : CSCGraph
    folder : path
        Created; must not exist yet (or be an empty folder).
    num_parts : int; method : {"auto", "metis", "ldg"}; seed : int
        As `graphrl.partition.assign_parts`.
    features : torch.Tensor or np.ndarray or None, shape [N, F], bool, integer or float (not bfloat16)
    labels : torch.Tensor or np.ndarray or None, shape [N], bool, integer or float
    owner : integer [N] or None
        A precomputed assignment (from `assign_parts`) instead of computing one.

    Returns
    -------
    dict
        The manifest's body: ``method`` used (``"metis"``, ``"ldg"``, or ``"given"`` with ``owner``),
        ``balance`` (see
        `graphrl.partition.balance`), ``fingerprint``, per-part counts.

    Raises
    ------
    ValueError
        ``folder`` exists and is not empty; features or labels of the wrong shape; ``owner`` of the wrong
        length or with ids outside [0, P); and as `assign_parts`.
    TypeError
        ``graph`` not a `CSCGraph`; features or labels of another dtype (object, strings, bfloat16);
        ``owner`` not of integers.
    """
    if not isinstance(graph, CSCGraph):
        raise TypeError(f"graph must be a CSCGraph (CSCGraph.from_edges(src, dst, num_nodes) or from_scipy), "
                        f"got {type(graph).__name__}")
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"folder {str(folder)!r} exists and is not an empty folder: choose a new path")
    n = graph.num_nodes
    feats = _as_rows("features", features, n, 2)
    labs = _as_rows("labels", labels, n, 1)
    from graphrl.partition.assign import metis_available

    used = "metis" if method == "metis" or (method == "auto" and metis_available()) else "ldg"
    if owner is None:
        owner = assign_parts(graph, num_parts, method, seed)
    else:
        used = "given"
    owner = np.asarray(owner)
    if owner.dtype.kind not in "iu":
        raise TypeError(f"owner must be an integer array (from assign_parts), got dtype {owner.dtype}")
    if owner.shape != (n,) or owner.min(initial=0) < 0 or owner.max(initial=0) >= num_parts:
        raise ValueError(f"owner must be int [N={n}] with values in [0, {num_parts}), got shape "
                         f"{owner.shape}, range [{owner.min(initial=0)}, {owner.max(initial=0)}]")
    owner = owner.astype(np.int32)
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        np.save(tmp / BOOK, owner)
        out_degree = np.bincount(graph.indices.numpy(), minlength=n).astype(np.int64)
        parts = [_write_part(graph, tmp, p, owner, out_degree, feats, labs) for p in range(num_parts)]
        body = {
            "format": FORMAT, "version": VERSION, "num_parts": int(num_parts), "num_nodes": n,
            "num_edges": graph.num_edges, "fingerprint": graph_fingerprint(graph), "method": used,
            "seed": int(seed), "weighted": graph.weights is not None,
            "features": None if feats is None else [str(feats.dtype), list(feats.shape[1:])],
            "labels": None if labs is None else str(labs.dtype), "parts": parts,
            "balance": balance(graph, owner, num_parts),
        }
        body["files"] = file_table(tmp)
        seal(tmp / MANIFEST, body)
        if folder.exists():
            folder.rmdir()
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return body


def _write_part(graph: CSCGraph, root: Path, p: int, owner: np.ndarray, out_degree: np.ndarray, feats,
                labs) -> dict:
    indptr = graph.indptr.numpy()
    owned = np.flatnonzero(owner == p).astype(np.int64)
    starts, ends = indptr[owned], indptr[owned + 1]
    deg = ends - starts
    local_indptr = np.zeros(owned.shape[0] + 1, dtype=np.int64)
    np.cumsum(deg, out=local_indptr[1:])
    # CSC positions of the owned rows, in order: each row's in-edges keep the graph's CSC order
    pos = np.repeat(starts - local_indptr[:-1], deg) + np.arange(local_indptr[-1], dtype=np.int64)
    indices = graph.indices.numpy()[pos].astype(np.int64)
    eids = pos if graph.edge_ids is None else graph.edge_ids.numpy()[pos]
    halo = np.unique(indices[owner[indices] != p])
    d = root / f"part{p}"
    d.mkdir()
    arrays = {"owned": owned, "indptr": local_indptr, "indices": indices, "edge_ids": eids.astype(np.int64),
              "halo": halo.astype(np.int64), "out_degree": out_degree[owned]}
    if graph.weights is not None:
        arrays["weights"] = graph.weights.numpy()[pos].astype(np.float32)
    if feats is not None:
        arrays["features"] = feats[owned]
    if labs is not None:
        arrays["labels"] = labs[owned]
    for name, arr in arrays.items():
        np.save(d / f"{name}.npy", arr)
    return {"nodes": int(owned.shape[0]), "edges": int(indices.shape[0]), "halo": int(halo.shape[0])}


_KEYS = ("num_parts", "num_nodes", "num_edges", "fingerprint", "weighted", "features", "labels", "files")


def _manifest(folder: Path) -> tuple[dict, str]:
    body, digest = unseal(folder / MANIFEST, str(folder))
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        raise PartitionError(f"partition folder {folder}: {MANIFEST} is format {body.get('format')!r} "
                             f"version {body.get('version')!r}, expected {FORMAT!r} version {VERSION}",
                             str(folder), (MANIFEST,))
    if missing := [k for k in _KEYS if k not in body]:
        raise PartitionError(f"partition folder {folder}: {MANIFEST} lacks {missing}", str(folder),
                             (MANIFEST,))
    return body, digest


def _check(folder: Path, body: dict, only: tuple[str, ...] | None, listing: bool = False) -> None:
    problems = check_files(folder, body["files"], only=only, skip=(MANIFEST,), listing=listing)
    if problems:
        files = tuple(p.split(":", 1)[0] for p in problems)
        raise PartitionError(f"partition folder {folder}: " + "; ".join(problems), str(folder), files)


def _expect(folder: Path, body: dict, expect: str | None) -> None:
    if expect is not None and not isinstance(expect, str):
        raise TypeError(f"expect must be a graph_fingerprint (str) or None, got {type(expect).__name__}")
    if expect is not None and body["fingerprint"] != expect:
        raise PartitionError(f"partition folder {folder} holds another graph (fingerprint "
                             f"{body['fingerprint'][:12]}..., expected {expect[:12]}...)", str(folder),
                             (MANIFEST,))


def verify(folder: str | os.PathLike[str], expect: str | None = None) -> dict:
    """Verify every file of a partition folder against its sealed manifest; return the manifest.

    Raises
    ------
    PartitionError
        A file missing, truncated, altered or unexpected (named), the manifest's seal broken, or the
        fingerprint not ``expect``.
    """
    folder = Path(folder)
    body, _ = _manifest(folder)
    _expect(folder, body, expect)
    _check(folder, body, None)
    return body


def load_book(folder: str | os.PathLike[str], expect: str | None = None) -> PartitionBook:
    """The partition book of a folder (its manifest and ``node_part.npy`` verified, and the folder's
    files exactly those the manifest lists, by name: the part files are read by their owners).

    Raises
    ------
    PartitionError
        As `verify`, for the manifest and ``node_part.npy``; a file missing or not in the manifest (named);
        a book that is not int32 [N] in [0, P).
    """
    folder = Path(folder)
    body, digest = _manifest(folder)
    _expect(folder, body, expect)
    _check(folder, body, (BOOK,), listing=True)
    node_part = np.load(folder / BOOK)
    n, parts = int(body["num_nodes"]), int(body["num_parts"])
    ok = node_part.dtype == np.int32 and node_part.shape == (n,)
    if not (ok and (n == 0 or (node_part.min() >= 0 and node_part.max() < parts))):
        raise PartitionError(f"partition folder {folder}: {BOOK} is not int32 [{n}] in [0, {parts}) as "
                             f"{MANIFEST} says", str(folder), (BOOK,))
    return PartitionBook(str(folder), parts, n, int(body["num_edges"]), node_part, body["fingerprint"], body,
                         digest)


def load_partition(folder: str | os.PathLike[str], part: int, expect: str | None = None,
                   manifest: str | None = None) -> Partition:
    """Load part ``part`` of a partition folder, verifying the manifest's seal and the part's files.

    Parameters
    ----------
    folder : path
    part : int, in [0, P)
    expect : str or None
        The `graph_fingerprint` the folder must hold (a folder of another graph is refused).
    manifest : str or None
        The manifest sha256 the part must be read under (`PartitionBook.digest`): a folder written again
        since its book was read (the same graph partitioned anew) is refused, as its parts own other nodes.

    Raises
    ------
    PartitionError
        A damaged folder (the file is named), a fingerprint other than ``expect``, a manifest other than
        ``manifest``.
    ValueError
        ``part`` outside [0, P) (a `PartitionError`).
    """
    folder = Path(folder)
    body, digest = _manifest(folder)
    _expect(folder, body, expect)
    if manifest is not None and digest != manifest:
        raise PartitionError(f"partition folder {folder} was written again since its partition book was read "
                             f"({MANIFEST} sha256 {digest[:12]}..., expected {manifest[:12]}...): its parts "
                             "own other nodes; start the owners and samplers again from the new folder",
                             str(folder), (MANIFEST,))
    num_parts = int(body["num_parts"])
    if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or not 0 <= int(part) < num_parts:
        raise PartitionError(f"part must be an int in [0, {num_parts}) for partition folder {folder}, got "
                             f"{part!r}", str(folder))
    part = int(part)
    names = [*_PART_FILES, *(["weights"] if body["weighted"] else []),
             *(["features"] if body["features"] is not None else []),
             *(["labels"] if body["labels"] is not None else [])]
    rels = tuple(f"part{part}/{name}.npy" for name in names)
    _check(folder, body, rels)
    arrays = {name: np.load(folder / rel) for name, rel in zip(names, rels, strict=True)}
    return Partition(part=part, num_parts=num_parts, num_nodes=int(body["num_nodes"]), owned=arrays["owned"],
                     indptr=arrays["indptr"], indices=arrays["indices"], edge_ids=arrays["edge_ids"],
                     weights=arrays.get("weights"), halo=arrays["halo"], out_degree=arrays["out_degree"],
                     features=arrays.get("features"),
                     labels=arrays.get("labels"), fingerprint=body["fingerprint"], digest=digest)
