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

from graphrl.datasets.base import NodeDataset, data_root, require_file
from graphrl.graph import CSCGraph

__all__ = ["load_planetoid", "RestrictedUnpickler", "restricted_load"]

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
            raise pickle.UnpicklingError(
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


def _dense(matrix, what: str, path: Path) -> np.ndarray:
    if sp.issparse(matrix):
        return np.asarray(matrix.todense())
    if isinstance(matrix, np.ndarray):
        return matrix
    raise ValueError(f"{path}: expected a scipy sparse matrix or numpy array for {what}, "
                     f"got {type(matrix).__name__}")


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
        ``name`` is not "cora" or "citeseer", or a file does not have the expected content.
    FileNotFoundError
        The data folder or one of the eight files is missing; the message names the path.
    pickle.UnpicklingError
        A file names a global other than the numpy/scipy classes these files use.

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
    folder = data_root(root) / "cora_citeseer"
    paths = {p: require_file(folder / f"ind.{name}.{p}", _remedy(name)) for p in (*_PARTS, "test.index")}
    obj = {}
    for part in _PARTS:
        with open(paths[part], "rb") as f:
            obj[part] = restricted_load(f)

    allx = _dense(obj["allx"], "allx", paths["allx"]).astype(np.float32)
    tx = _dense(obj["tx"], "tx", paths["tx"]).astype(np.float32)
    ally = _dense(obj["ally"], "ally", paths["ally"])
    ty = _dense(obj["ty"], "ty", paths["ty"])
    num_train = int(_dense(obj["y"], "y", paths["y"]).shape[0])
    adjacency = obj["graph"]
    if not isinstance(adjacency, dict):
        raise ValueError(f"{paths['graph']}: expected a dict of adjacency lists, "
                         f"got {type(adjacency).__name__}")
    try:
        test_index = np.loadtxt(paths["test.index"], dtype=np.int64, ndmin=1)
    except ValueError as exc:
        raise ValueError(f"{paths['test.index']}: expected one integer node id per line ({exc})") from None
    if tx.shape[0] != test_index.size or ty.shape[0] != test_index.size:
        raise ValueError(f"{paths['tx']}: {tx.shape[0]} test feature rows and {ty.shape[0]} label rows for "
                         f"{test_index.size} test ids")

    src = np.fromiter((k for k, v in adjacency.items() for _ in v), dtype=np.int64)
    dst = np.fromiter((t for v in adjacency.values() for t in v), dtype=np.int64)
    num_nodes = int(max(allx.shape[0], test_index.max() + 1, len(adjacency),
                        src.max(initial=-1) + 1, dst.max(initial=-1) + 1))
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
