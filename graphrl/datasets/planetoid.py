"""Cora and CiteSeer citation graphs in the Planetoid format, with the standard split."""

from __future__ import annotations

import collections
import functools
import io
import os
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from graphrl.datasets.base import NodeDataset, data_root, require_file, verify_checksums
from graphrl.graph import CSCGraph

__all__ = ["ForbiddenGlobal", "load_planetoid", "RestrictedUnpickler", "restricted_load"]

_NAMES = ("cora", "citeseer")
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VAL = 500


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], object]:
    """The only globals the Planetoid pickles may name, mapped to the objects they resolve to (built once).

    Found by listing the GLOBAL opcodes of all 14 files (``pickletools.genops``): numpy arrays
    (``_reconstruct``, ``ndarray``, ``dtype``), scipy CSR matrices, and the adjacency dict
    (``defaultdict`` of ``list``). The Python 2 module names (``__builtin__``, ``numpy.core``,
    ``scipy.sparse.csr``) are resolved here to today's objects, so nothing is imported by name.
    """
    try:  # numpy >= 2 moved the implementation to numpy._core
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct
    return {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse", "csr_matrix"): sp.csr_matrix,
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
    }


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle named a global outside `RestrictedUnpickler`'s allow-list."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals the Planetoid files need; anything else is refused.

    Unpickling calls whatever callables a pickle names (``os.system``, ``builtins.eval``, ...), so a
    data file must never be loaded with plain `pickle.load`. This class overrides
    `pickle.Unpickler.find_class` with an allow-list of exact ``(module, name)`` pairs.

    Raises
    ------
    pickle.UnpicklingError
        The pickle names a global outside the allow-list; the message names it.

    References
    ----------
    "Restricting Globals", Python documentation of the `pickle` module.
    """

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle API
        try:
            return _allowed_globals()[(module, name)]
        except KeyError:
            raise ForbiddenGlobal(
                f"refusing to unpickle global {module}.{name}: only the numpy/scipy/collections classes "
                "of the Planetoid files are allowed") from None


def restricted_load(data: bytes | io.BufferedIOBase) -> object:
    """Unpickle ``data`` (bytes or a binary file) through `RestrictedUnpickler`, Python 2 strings as latin1.

    Raises
    ------
    pickle.UnpicklingError
        The pickle names a forbidden global, or is corrupt.
    """
    stream = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    return RestrictedUnpickler(stream, encoding="latin1").load()


def _remedy(name: str) -> str:
    return (f"put the Planetoid files ind.{name}.{{x,y,tx,ty,allx,ally,graph,test.index}} in "
            "<root>/cora_citeseer or set GRAPHRL_DATA to the folder that holds cora_citeseer/")


def _matrix_shape(matrix, part: str, path: Path) -> tuple[int, int]:
    """Shape of a 2-D sparse matrix or array, its sparse structure checked; ValueError naming the file."""
    if sp.issparse(matrix):
        try:
            matrix.check_format(full_check=True)  # unpickling skips scipy's checks of the indices
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {part} is a damaged sparse matrix ({exc})") from None
    elif not isinstance(matrix, np.ndarray):
        raise ValueError(f"{path}: expected a scipy sparse matrix or numpy array for {part}, "
                         f"got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise ValueError(f"{path}: {part} must be a 2-D matrix, got shape {matrix.shape}")
    if matrix.dtype.kind not in "biuf":
        raise ValueError(f"{path}: {part} must hold numbers, got dtype {matrix.dtype}")
    return int(matrix.shape[0]), int(matrix.shape[1])


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.todense()) if sp.issparse(matrix) else matrix


def _check_shapes(obj: dict, paths: dict[str, Path], num_tests: int, num_nodes: int) -> None:
    """The eight files agree: widths, row counts, the split inside the nodes; ValueError naming a file."""
    shape = {part: _matrix_shape(obj[part], part, paths[part]) for part in _PARTS if part != "graph"}
    for a, b in (("x", "tx"), ("x", "allx"), ("y", "ty"), ("y", "ally")):
        if shape[a][1] != shape[b][1]:
            raise ValueError(f"{paths[b]}: {b} has {shape[b][1]} columns, {a} ({paths[a].name}) "
                             f"{shape[a][1]}")
    for a, b in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        if shape[a][0] != shape[b][0]:
            raise ValueError(f"{paths[b]}: {b} has {shape[b][0]} rows, {a} ({paths[a].name}) {shape[a][0]}")
    if shape["tx"][0] != num_tests:
        raise ValueError(f"{paths['tx']}: {shape['tx'][0]} test feature rows for the {num_tests} ids of "
                         f"{paths['test.index'].name}")
    if shape["y"][0] + _NUM_VAL > shape["allx"][0]:
        raise ValueError(f"{paths['allx']}: {shape['allx'][0]} rows cannot hold the {shape['y'][0]} training "
                         f"and {_NUM_VAL} validation nodes")
    if shape["allx"][0] > num_nodes:
        raise ValueError(f"{paths['allx']}: {shape['allx'][0]} feature rows for the {num_nodes} nodes of "
                         f"{paths['graph'].name}")
    width = shape["x"][1]
    nonzeros = sum(obj[p].nnz if sp.issparse(obj[p]) else obj[p].size for p in ("x", "tx", "allx"))
    if width > max(nonzeros, 1):
        raise ValueError(f"{paths['allx']}: {width} feature columns but only {nonzeros} entries in x, tx and "
                         "allx (a damaged shape)")


def _is_id(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _adjacency_edges(adjacency: object, path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``(src, dst, num_nodes)`` of the adjacency dict, every id an integer below its number of keys."""
    if not isinstance(adjacency, dict):
        raise ValueError(f"{path}: expected a dict of adjacency lists, got {type(adjacency).__name__}")
    num_nodes = len(adjacency)
    for node, neighbours in adjacency.items():
        if not _is_id(node) or not 0 <= node < num_nodes:
            raise ValueError(f"{path}: the {num_nodes} keys must be the node ids 0..{num_nodes - 1}, "
                             f"found key {node!r}")
        if not isinstance(neighbours, list | tuple):
            raise ValueError(f"{path}: node {node} has a {type(neighbours).__name__}, not a list of "
                             "neighbours")
        for t in neighbours:
            if not _is_id(t):
                raise ValueError(f"{path}: neighbour {t!r} of node {node} is not an integer id")
            if not 0 <= t < num_nodes:
                raise ValueError(f"{path}: neighbour id {t} of node {node} is outside the {num_nodes} nodes "
                                 f"the file lists (0..{num_nodes - 1})")
    src = np.fromiter((k for k, v in adjacency.items() for _ in v), dtype=np.int64)
    dst = np.fromiter((t for v in adjacency.values() for t in v), dtype=np.int64)
    return src, dst, num_nodes


def _read_test_index(path: Path, num_nodes: int, num_rows: int) -> np.ndarray:
    """The test ids: integers, distinct, past the ``num_rows`` rows of allx and below ``num_nodes``."""
    text = path.read_text()
    try:
        test_index = np.array([int(tok) for tok in text.split()], dtype=np.int64)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{path}: expected one integer node id per line ({exc})") from None
    bad = (test_index < num_rows) | (test_index >= num_nodes)
    if bad.any():
        raise ValueError(f"{path}: test ids must lie in {num_rows}..{num_nodes - 1} (past the rows of allx, "
                         f"inside the nodes of the graph file); {int(bad.sum())} do not, first "
                         f"{int(test_index[np.argmax(bad)])}")
    if np.unique(test_index).size != test_index.size:
        raise ValueError(f"{path}: a test id is listed twice")
    return test_index


def load_planetoid(name: str, root: str | os.PathLike | None = None) -> NodeDataset:
    """Load Cora or CiteSeer with bag-of-words features, labels and the standard Planetoid split.

    Reads ``<root>/cora_citeseer/ind.NAME.{x,y,tx,ty,allx,ally,graph,test.index}``: Python 2 pickles
    unpickled through `RestrictedUnpickler`, and a text list of test node ids.

    Construction (as in Kipf and Welling's ``load_data`` and PyG's ``read_planetoid_data``):

    - node ``i < len(allx)`` has features ``allx[i]`` and label ``argmax(ally[i])``; the ``j``-th
      test node, ``test.index[j]``, has ``tx[j]`` and ``argmax(ty[j])`` (this is the reference
      loaders' "reorder by sorted test index");
    - split: train = nodes ``0 .. len(y)-1`` (20 per class: 140 Cora, 120 CiteSeer), val = the next
      500 nodes, test = the 1,000 ids of ``test.index``;
    - CiteSeer has 15 ids inside the test range with no feature or label row (they do have 1-2
      citations; ids 2407 ... 3309), which are not in ``test.index`` either: they get
      all-zero features like in the reference loaders and label ``-1`` (PyG gives them 0, the argmax
      of a zero row). They are in no mask, so accuracy on the split is unaffected, while any use of
      their label outside the masks fails loudly instead of training on a made-up class. Their ids are
      ``extra["padded_nodes"]``;
    - graph: the adjacency lists made undirected (both directions stored), duplicates removed and
      self-loops dropped, as PyG does (GCN adds its own). So ``graph.num_edges`` is twice the number
      of undirected edges: Cora 2 x 5,278 = 10,556, CiteSeer 2 x 4,552 = 9,104. CiteSeer's lists hold
      248 self-loop entries (124 nodes, each listed twice): ``extra["self_loop_entries"]`` (int) and
      ``extra["self_loop_nodes"]`` (int64 tensor) record them. Edge ``i`` is the ``i``-th distinct
      directed pair ``(u, v)`` in lexicographic order.

    Parameters
    ----------
    name : str
        ``"cora"`` or ``"citeseer"`` (case-insensitive).
    root : str or os.PathLike or None
        Data folder holding ``cora_citeseer/``; default ``$GRAPHRL_DATA`` (see `data_root`).

    Returns
    -------
    NodeDataset
        ``features`` float32 [N, F] dense (Cora 2708 x 1433, CiteSeer 3327 x 3703, 0/1 word
        indicators); ``labels`` int64 [N]; ``train_mask``/``val_mask``/``test_mask`` bool [N];
        ``num_classes`` 7 / 6; ``graph`` a `CSCGraph` with both directions of every edge.

    Raises
    ------
    ValueError
        ``name`` is not "cora" or "citeseer", or a file does not have the expected content: the
        message names the file and what is wrong. Checked before anything is allocated: the graph
        file's keys are the node ids 0..N-1 (N, the number of keys, is the node count) and every
        neighbour an integer id below N; test ids are distinct integers past the rows of ``allx`` and
        below N; widths and row counts agree (x/tx/allx, y/ty/ally, tx/ty/test.index, allx/ally),
        ``allx`` holds the training and validation nodes and at most N rows; sparse matrices pass
        scipy's full format check. Also a truncated or damaged pickle, and a file whose SHA-256
        differs from the data folder's ``SHA256SUMS`` (`verify_checksums`).
    FileNotFoundError
        The data folder or one of the eight files is missing; the message names the path.
    pickle.UnpicklingError
        A file names a global other than the numpy/scipy classes these files use (`ForbiddenGlobal`).

    References
    ----------
    Sen et al., "Collective Classification in Network Data", AI Magazine 2008 (data); Yang, Cohen and
    Salakhutdinov, "Revisiting Semi-Supervised Learning with Graph Embeddings" (Planetoid), ICML 2016
    (split and files); Kipf and Welling, "Semi-Supervised Classification with Graph Convolutional
    Networks", ICLR 2017 (loader); PyG ``torch_geometric.io.planetoid.read_planetoid_data``.
    """
    if not isinstance(name, str) or name.lower() not in _NAMES:
        raise ValueError(f"name must be 'cora' or 'citeseer', got {name!r}")
    name = name.lower()
    base = data_root(root)
    folder = base / "cora_citeseer"
    paths = {p: require_file(folder / f"ind.{name}.{p}", _remedy(name)) for p in (*_PARTS, "test.index")}
    verify_checksums(base, list(paths.values()))
    obj = {}
    for part in _PARTS:
        with open(paths[part], "rb") as f:
            try:
                obj[part] = restricted_load(f)
            except ForbiddenGlobal:
                raise
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
                    KeyError) as exc:
                raise ValueError(f"{paths[part]}: not a Planetoid pickle (truncated or damaged: "
                                 f"{type(exc).__name__}: {exc})") from exc
    # everything is checked before anything sized by the files is allocated
    src, dst, num_nodes = _adjacency_edges(obj["graph"], paths["graph"])
    num_rows = _matrix_shape(obj["allx"], "allx", paths["allx"])[0]
    test_index = _read_test_index(paths["test.index"], num_nodes, num_rows)
    _check_shapes(obj, paths, test_index.size, num_nodes)

    allx = _dense(obj["allx"]).astype(np.float32)
    tx = _dense(obj["tx"]).astype(np.float32)
    ally = _dense(obj["ally"])
    ty = _dense(obj["ty"])
    num_train = int(obj["y"].shape[0])
    num_features = allx.shape[1]

    features = np.zeros((num_nodes, num_features), dtype=np.float32)
    labels = np.full(num_nodes, -1, dtype=np.int64)
    features[: allx.shape[0]] = allx
    labels[: ally.shape[0]] = np.where(ally.any(1), ally.argmax(1), -1)
    features[test_index] = tx
    labels[test_index] = np.where(ty.any(1), ty.argmax(1), -1)
    covered = np.zeros(num_nodes, dtype=bool)
    covered[: allx.shape[0]] = True
    covered[test_index] = True
    padded = np.flatnonzero(~covered)

    train_mask = np.zeros(num_nodes, dtype=bool)
    train_mask[:num_train] = True
    val_mask = np.zeros(num_nodes, dtype=bool)
    val_mask[num_train: num_train + _NUM_VAL] = True
    test_mask = np.zeros(num_nodes, dtype=bool)
    test_mask[test_index] = True

    self_loops = src == dst
    keys = np.unique(np.concatenate([src * num_nodes + dst, dst * num_nodes + src])[
        ~np.concatenate([self_loops, self_loops])])
    graph = CSCGraph.from_edges(keys // num_nodes, keys % num_nodes, num_nodes)

    return NodeDataset(
        name=name,
        graph=graph,
        features=torch.from_numpy(features),
        labels=torch.from_numpy(labels),
        train_mask=torch.from_numpy(train_mask),
        val_mask=torch.from_numpy(val_mask),
        test_mask=torch.from_numpy(test_mask),
        num_classes=int(ally.shape[1]),
        extra={
            "self_loop_entries": int(self_loops.sum()),
            "self_loop_nodes": torch.from_numpy(np.unique(src[self_loops])),
            "padded_nodes": torch.from_numpy(padded.astype(np.int64)),
        },
    )
