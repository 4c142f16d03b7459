"""Gowalla check-ins in the LightGCN split (user-item implicit feedback)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset, data_root, require_file
from graphrl.graph import CSCGraph

__all__ = ["load_gowalla", "read_lightgcn_split"]

_REMEDY = ("put the LightGCN Gowalla split (train.txt, test.txt) in <root>/gowalla "
           "or set GRAPHRL_DATA to the folder that holds gowalla/")


def _parse_ints(text: str, expected: int, path: Path) -> np.ndarray:
    """All whitespace-separated integers of ``text``; ValueError naming ``path`` if any token is not one."""
    if expected == 0:
        return np.empty(0, dtype=np.int64)
    # np.fromstring(sep=" ") is the fast parser (docs/performance.md); it treats any whitespace as a
    # separator but only *warns* on a bad token, so warnings become errors and the count is checked
    # against the per-line token counts.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            tokens = np.fromstring(text, dtype=np.int64, sep=" ")
        except (DeprecationWarning, ValueError):
            tokens = None
    if tokens is None or tokens.size != expected:
        raise ValueError(f"{path}: expected whitespace-separated integers ('user item item ...' per line), "
                         "found a token that is not an integer")
    return tokens


def read_lightgcn_split(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one LightGCN-format split: one line per user, ``user item item ...``.

    A line holding only a user id (a user without interactions in this split) and blank lines are
    allowed and contribute nothing.

    Parameters
    ----------
    path : str or os.PathLike
        The text file (e.g. ``gowalla/train.txt``).

    Returns
    -------
    users, items : numpy.ndarray, int64, shape [M]
        One entry per interaction, in file order (line by line, items in the order written).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        A token is not a non-negative integer; the message names the file.
    """
    path = Path(path)
    text = path.read_text()
    lines = text.splitlines()
    counts = np.fromiter((len(line.split()) for line in lines), dtype=np.int64, count=len(lines))
    total = int(counts.sum())
    tokens = _parse_ints(text, total, path)
    if total and tokens.min() < 0:
        raise ValueError(f"{path}: ids must be non-negative, found {int(tokens.min())}")
    counts = counts[counts > 0]
    starts = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    is_user = np.zeros(total, dtype=bool)
    is_user[starts] = True
    users = np.repeat(tokens[starts], counts - 1)
    items = tokens[~is_user]
    return users, items


def load_gowalla(root: str | os.PathLike | None = None) -> InteractionDataset:
    """Load the Gowalla check-in graph with the train/test split of NGCF and LightGCN.

    Files ``<root>/gowalla/train.txt`` and ``test.txt``: one line per user, ``user item item ...``,
    0-based contiguous ids. ``num_users`` and ``num_items`` are one more than the largest id in either
    split (29,858 users and 40,981 items for the published split).

    Parameters
    ----------
    root : str or os.PathLike or None
        Data folder holding ``gowalla/``; default ``$GRAPHRL_DATA`` (see `data_root`).

    Returns
    -------
    InteractionDataset
        ``name="gowalla"``; ``train_users``/``train_items`` int64 [810128] and ``test_users``/
        ``test_items`` int64 [217242] in file order; ``graph`` the bipartite training graph
        (`CSCGraph.bipartite`, 70,839 nodes, 1,620,256 directed edges); ``train_weights`` None.

    Raises
    ------
    FileNotFoundError
        The data folder, ``train.txt`` or ``test.txt`` is missing; the message names the path and
        what to put there.
    ValueError
        A file is not in the LightGCN text format.

    References
    ----------
    Cho, Myers and Leskovec, "Friendship and Mobility: User Movement in Location-Based Social
    Networks", KDD 2011 (SNAP loc-Gowalla). Split by Wang et al., "Neural Graph Collaborative
    Filtering", SIGIR 2019, reused by He et al., "LightGCN", SIGIR 2020.

    Examples
    --------
    >>> ds = load_gowalla()                        # doctest: +SKIP
    >>> ds.num_users, ds.num_items, ds.num_train   # doctest: +SKIP
    (29858, 40981, 810128)
    """
    folder = data_root(root) / "gowalla"
    train_path = require_file(folder / "train.txt", _REMEDY)
    test_path = require_file(folder / "test.txt", _REMEDY)
    tr_u, tr_i = read_lightgcn_split(train_path)
    te_u, te_i = read_lightgcn_split(test_path)
    num_users = int(max(tr_u.max(initial=-1), te_u.max(initial=-1))) + 1
    num_items = int(max(tr_i.max(initial=-1), te_i.max(initial=-1))) + 1
    graph = CSCGraph.bipartite(tr_u, tr_i, num_users, num_items)
    return InteractionDataset(
        name="gowalla",
        num_users=num_users,
        num_items=num_items,
        train_users=torch.from_numpy(tr_u),
        train_items=torch.from_numpy(tr_i),
        test_users=torch.from_numpy(te_u),
        test_items=torch.from_numpy(te_i),
        graph=graph,
    )
