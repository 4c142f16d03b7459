"""Gowalla check-ins in the LightGCN split (user-item implicit feedback)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset, data_root, require_file, verify_checksums
from graphrl.graph import CSCGraph

__all__ = ["load_gowalla", "read_lightgcn_split"]

_REMEDY = ("put the LightGCN Gowalla split (train.txt, test.txt) in <root>/gowalla "
           "or set GRAPHRL_DATA to the folder that holds gowalla/")
_LISTS = {"user": "user_list.txt", "item": "item_list.txt"}


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
    if tokens.size and tokens.max() == np.iinfo(np.int64).max:  # the parser clamps larger values to this
        digits = (t for t in text.split() if t.lstrip("+").isdigit())
        big = max(digits, key=lambda t: (len(t.lstrip("+0")), t))
        raise ValueError(f"{path}: id {big} does not fit an int64 (ids must be below 2**63 - 1)")
    return tokens


def _read_split(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``(users, items, lines)``: the interactions and the number of lines that name a user."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file of ids ({exc})") from None
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
    return users, items, int(counts.size)


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
    users, items, _ = _read_split(Path(path))
    return users, items


def _stated_count(path: Path, what: str) -> int:
    """How many ids an id map (``org_id remap_id`` lines after a header) states; remap must be 0..n-1."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].split() != ["org_id", "remap_id"]:
        raise ValueError(f"{path}: expected the header 'org_id remap_id' of a {what} id map")
    rows = [line.split() for line in lines[1:]]
    if any(len(row) != 2 for row in rows):
        raise ValueError(f"{path}: expected two columns 'org_id remap_id' per line")
    try:
        remap = np.array([int(row[1]) for row in rows], dtype=np.int64)
    except (ValueError, OverflowError):
        raise ValueError(f"{path}: remap ids must be integers") from None
    if not np.array_equal(remap, np.arange(remap.size)):
        raise ValueError(f"{path}: remap ids must be 0, 1, 2, ... in order (one 'org_id remap_id' per line)")
    return int(remap.size)


def _count(what: str, folder: Path, splits: list[tuple[Path, np.ndarray]], occurrences: int) -> int:
    """Number of users or items: stated by the id map when present, else one more than the largest id.

    Ids are checked before anything sized by them exists: below the id map's count, or (without the
    map) not beyond ``occurrences`` (0-based contiguous ids cannot outnumber their occurrences).
    """
    id_map = folder / _LISTS[what]
    stated = _stated_count(id_map, what) if id_map.is_file() else None
    limit = stated if stated is not None else occurrences
    for path, ids in splits:
        largest = int(ids.max(initial=-1))
        if largest >= limit:
            why = (f"the {stated} {what}s {id_map.name} lists" if stated is not None else
                   f"the {occurrences} {what} ids written in train.txt and test.txt (ids are 0-based "
                   "and contiguous)")
            raise ValueError(f"{path}: {what} id {largest} is outside {why}")
    if stated is not None:
        return stated
    return int(max(ids.max(initial=-1) for _, ids in splits)) + 1


def load_gowalla(root: str | os.PathLike | None = None) -> InteractionDataset:
    """Load the Gowalla check-in graph with the train/test split of NGCF and LightGCN.

    Files ``<root>/gowalla/train.txt`` and ``test.txt``: one line per user, ``user item item ...``,
    0-based contiguous ids. ``num_users`` and ``num_items`` are the counts ``user_list.txt`` and
    ``item_list.txt`` state (``org_id remap_id`` lines after a header) when those id maps are there,
    and every id must be below them; without them, one more than the largest id in either split,
    which may not exceed the number of times such ids are written (29,858 users and 40,981 items for
    the published split).

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
        A file is not in the LightGCN text format, an id map is damaged, or an id is outside the
        count an id map states (or, without one, beyond the ids written); the message names the file.
        Also a file whose SHA-256 differs from the data folder's ``SHA256SUMS`` (`verify_checksums`).

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
    base = data_root(root)
    folder = base / "gowalla"
    train_path = require_file(folder / "train.txt", _REMEDY)
    test_path = require_file(folder / "test.txt", _REMEDY)
    lists = [folder / name for name in _LISTS.values() if (folder / name).is_file()]
    verify_checksums(base, [train_path, test_path, *lists])
    tr_u, tr_i, tr_lines = _read_split(train_path)
    te_u, te_i, te_lines = _read_split(test_path)
    num_users = _count("user", folder, [(train_path, tr_u), (test_path, te_u)], tr_lines + te_lines)
    num_items = _count("item", folder, [(train_path, tr_i), (test_path, te_i)], tr_i.size + te_i.size)
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
