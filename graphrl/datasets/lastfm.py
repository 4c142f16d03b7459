"""LastFM (HetRec 2011): user-artist listening counts plus a user-user friendship graph."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset, data_root, require_file, verify_checksums
from graphrl.graph import CSCGraph

__all__ = ["load_lastfm"]

_REMEDY = ("put the HetRec 2011 LastFM files (data1.txt, test1.txt, trustnetwork.txt) in <root>/lastfm "
           "or set GRAPHRL_DATA to the folder that holds lastfm/")


def _read_table(path: Path, columns: int) -> np.ndarray:
    """Whitespace table of ``columns`` numbers per row, float64 [rows, columns]; ValueError names the file."""
    try:
        table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: expected {columns} whitespace-separated numbers per line "
                         f"({exc})") from None
    if table.size == 0:
        return np.empty((0, columns), dtype=np.float64)
    if table.shape[1] != columns:
        raise ValueError(f"{path}: expected {columns} columns per line, got {table.shape[1]}")
    return table


def _one_based_ids(path: Path, column: np.ndarray, what: str) -> np.ndarray:
    """1-based integer ids in a float column -> 0-based int64; ValueError naming the file otherwise."""
    with np.errstate(invalid="ignore"):  # NaN, inf and huge values cast to garbage, refused below
        ids = column.astype(np.int64)
    bad = (ids != column) | (ids < 1)
    if bad.any():
        raise ValueError(f"{path}: {what} ids must be integers >= 1 (1-based), "
                         f"{int(bad.sum())} are not, first {float(column[np.argmax(bad)])!r}")
    return ids - 1


def _count(what: str, columns: list[tuple[Path, np.ndarray]]) -> int:
    """One more than the largest 0-based id, checked before anything is sized by it.

    The ids are those of HetRec's lists (1..N, each in use), so they cannot outnumber the times ids
    are written: a larger id is a damaged file, refused naming it.
    """
    written = sum(ids.size for _, ids in columns)
    for path, ids in columns:
        largest = int(ids.max(initial=-1))
        if largest >= written:
            raise ValueError(f"{path}: {what} id {largest + 1} is beyond the {written} {what} ids the files "
                             f"write (ids are 1..N, each in use)")
    return int(max(ids.max(initial=-1) for _, ids in columns)) + 1


def load_lastfm(root: str | os.PathLike | None = None) -> InteractionDataset:
    """Load the LastFM user-artist graph (train/test split) and its user-user friendship graph.

    Files in ``<root>/lastfm``: ``data1.txt`` (train) and ``test1.txt`` (test), one ``user artist
    weight`` row per line, whitespace-separated, 1-based ids, weight = listening count (a few written
    in float notation such as ``3.2466e+05``); ``trustnetwork.txt``, ``user user`` rows, every
    friendship listed in both directions.

    Ids: 1-based ids are shifted to 0-based and kept otherwise (no compaction): ``num_users`` is the
    largest user id in any of the three files (1,892) and ``num_items`` the largest artist id in
    either split (4,489). Every artist id 1..4,489 occurs in train or test, and every user in the
    friendship graph, so no id is a phantom; 14 users have no training row (isolated in ``graph``).

    Parameters
    ----------
    root : str or os.PathLike or None
        Data folder holding ``lastfm/``; default ``$GRAPHRL_DATA`` (see `data_root`).

    Returns
    -------
    InteractionDataset
        ``name="lastfm"``; train int64 [42135] and test int64 [10533] (user, artist) pairs in file
        order; ``train_weights`` float32 [42135] listening counts (also the weights of ``graph``,
        both directions); ``extra["test_weights"]`` float32 [10533]; ``extra["friends"]`` a `CSCGraph`
        over the 1,892 users with 25,434 directed edges (12,717 friendships x 2), edge ``i`` being row
        ``i`` of ``trustnetwork.txt``.

    Raises
    ------
    FileNotFoundError
        The data folder or one of the three files is missing; the message names the path.
    ValueError
        A file is not a numeric table of the expected width, an id is not an integer >= 1, or an id
        is beyond the number of ids of its kind the files write (refused before anything is sized by
        it); the message names the file. Also a file whose SHA-256 differs from the data folder's
        ``SHA256SUMS`` (`verify_checksums`).

    References
    ----------
    Cantador, Brusilovsky and Kuflik, "2nd Workshop on Information Heterogeneity and Fusion in
    Recommender Systems (HetRec 2011)", RecSys 2011; data from Last.fm, distributed by GroupLens.
    """
    base = data_root(root)
    folder = base / "lastfm"
    train_path = require_file(folder / "data1.txt", _REMEDY)
    test_path = require_file(folder / "test1.txt", _REMEDY)
    trust_path = require_file(folder / "trustnetwork.txt", _REMEDY)
    verify_checksums(base, [train_path, test_path, trust_path])
    train = _read_table(train_path, 3)
    test = _read_table(test_path, 3)
    trust = _read_table(trust_path, 2)

    tr_u = _one_based_ids(train_path, train[:, 0], "user")
    tr_i = _one_based_ids(train_path, train[:, 1], "artist")
    te_u = _one_based_ids(test_path, test[:, 0], "user")
    te_i = _one_based_ids(test_path, test[:, 1], "artist")
    fr_a = _one_based_ids(trust_path, trust[:, 0], "user")
    fr_b = _one_based_ids(trust_path, trust[:, 1], "user")
    users = [(train_path, tr_u), (test_path, te_u), (trust_path, fr_a), (trust_path, fr_b)]
    num_users = _count("user", users)
    num_items = _count("artist", [(train_path, tr_i), (test_path, te_i)])
    for path, weights in ((train_path, train[:, 2]), (test_path, test[:, 2])):
        if not (np.isfinite(weights) & (weights >= 0)).all():
            raise ValueError(f"{path}: listening counts must be finite and >= 0")
    train_w = train[:, 2].astype(np.float32)
    test_w = test[:, 2].astype(np.float32)

    graph = CSCGraph.bipartite(tr_u, tr_i, num_users, num_items, weights=train_w)
    friends = CSCGraph.from_edges(fr_a, fr_b, num_users)
    return InteractionDataset(
        name="lastfm",
        num_users=num_users,
        num_items=num_items,
        train_users=torch.from_numpy(tr_u),
        train_items=torch.from_numpy(tr_i),
        test_users=torch.from_numpy(te_u),
        test_items=torch.from_numpy(te_i),
        graph=graph,
        train_weights=torch.from_numpy(train_w),
        extra={"friends": friends, "test_weights": torch.from_numpy(test_w)},
    )
