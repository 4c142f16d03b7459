"""Plain records that the dataset loaders return."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from graphrl.graph import CSCGraph

__all__ = ["CHECKSUMS", "InteractionDataset", "NodeDataset", "data_root", "require_file", "verify_checksums"]

DATA_ENV = "GRAPHRL_DATA"
CHECKSUMS = "SHA256SUMS"
"""The data folder's checksum list (``sha256sum`` format: ``<hex digest>  <path under the folder>``)."""

logger = logging.getLogger(__name__)


def verify_checksums(root: Path, paths: Sequence[Path]) -> None:
    """Check each file of ``paths`` that ``root/SHA256SUMS`` lists against its SHA-256 digest.

    Files the list does not name are not checked; without a list (a hand-made folder) nothing is
    checked and that is logged (INFO). Read back, not trusted: a truncated, edited or swapped file
    is refused before it is parsed.

    Parameters
    ----------
    root : pathlib.Path
        The data folder (`data_root`).
    paths : sequence of pathlib.Path
        Files under ``root`` about to be read.

    Raises
    ------
    ValueError
        A listed file's digest differs; the message names the file, both digests and the list.
    """
    sums_path = root / CHECKSUMS
    if not sums_path.is_file():
        logger.info("%s has no %s: its files are read without a checksum check", root, CHECKSUMS)
        return
    listed = {}
    for line in sums_path.read_text().splitlines():
        parts = line.split(None, 1)  # "<digest>  <name>", or "<digest> *<name>" (binary mode)
        if len(parts) == 2:
            listed[parts[1].removeprefix("*")] = parts[0].lower()
    for path in paths:
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue  # not under root
        expected = listed.get(rel)
        if expected is None:
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != expected:
            raise ValueError(
                f"{path}: SHA-256 {h.hexdigest()} differs from {expected} listed in {sums_path}: the "
                "file is damaged or not the one the data README describes; restore it from the shared data"
            )


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve a data folder: ``root`` if given, else ``$GRAPHRL_DATA``.

    Parameters
    ----------
    root : str or os.PathLike or None
        The folder holding ``gowalla/``, ``cora_citeseer/`` and ``lastfm/``; None reads the
        ``GRAPHRL_DATA`` environment variable (the tests and CI set it to ``../shared/data``).

    Returns
    -------
    pathlib.Path
        The folder, ``~`` expanded.

    Raises
    ------
    FileNotFoundError
        Neither is set, or the folder does not exist; the message says what to set.
    """
    if root is None:
        env = os.environ.get(DATA_ENV)
        if not env:
            raise FileNotFoundError(
                f"no data folder: pass root=... or set {DATA_ENV} to the shared data folder "
                "(e.g. export GRAPHRL_DATA=../shared/data)")
        root = env
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data folder {path} does not exist: pass root=... or set {DATA_ENV} "
                                "to the folder holding gowalla/, cora_citeseer/ and lastfm/")
    return path


def require_file(path: Path, remedy: str) -> Path:
    """Return ``path`` if it is a file, else raise FileNotFoundError naming it and ``remedy``.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist; the message is ``"<path> not found: <remedy>"``.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {remedy}")
    return path


@dataclass(eq=False)
class InteractionDataset:
    """A user-item implicit-feedback data set with a train/test split (Gowalla, LastFM, synthetic).

    Node ids of ``graph``: users ``0..U-1``, items ``U..U+I-1``. Item ids in ``train_items`` /
    ``test_items`` are *item* ids in ``0..I-1`` (add ``num_users`` for node ids).

    Attributes
    ----------
    name : str
    num_users, num_items : int
        U and I.
    train_users, train_items : torch.Tensor, int64, shape [M_train]
        Training interactions (user, item), in file order.
    test_users, test_items : torch.Tensor, int64, shape [M_test]
        Test interactions.
    graph : CSCGraph
        Bipartite training graph with both directions (`CSCGraph.bipartite`): interaction ``i`` is
        edge ``i`` (user -> item) and edge ``i + M_train`` (item -> user).
    train_weights : torch.Tensor or None, float32, shape [M_train]
        Interaction weights where the source has them (LastFM listening counts).
    extra : dict
        Further graphs or arrays specific to a data set (LastFM: ``"friends"``, a user-user CSCGraph,
        and ``"test_weights"``; synthetic: the generator's arguments).
    """

    name: str
    num_users: int
    num_items: int
    train_users: torch.Tensor
    train_items: torch.Tensor
    test_users: torch.Tensor
    test_items: torch.Tensor
    graph: CSCGraph
    train_weights: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        """U + I."""
        return self.num_users + self.num_items

    @property
    def num_train(self) -> int:
        """Number of training interactions."""
        return int(self.train_users.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test interactions."""
        return int(self.test_users.shape[0])

    def user_item_csr(self, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """Items of each user as CSR: ``(indptr int64 [U + 1], items int64 [M])``, items sorted per user.

        Raises
        ------
        ValueError
            ``split`` is not "train" or "test".
        """
        if split == "train":
            users, items = self.train_users.numpy(), self.train_items.numpy()
        elif split == "test":
            users, items = self.test_users.numpy(), self.test_items.numpy()
        else:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        order = np.lexsort((items, users))
        indptr = np.zeros(self.num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(users, minlength=self.num_users), out=indptr[1:])
        return indptr, items[order].astype(np.int64)


@dataclass(eq=False)
class NodeDataset:
    """A node-classification data set with the standard split (Cora, CiteSeer).

    Attributes
    ----------
    name : str
    graph : CSCGraph
        Undirected graph stored with both directions.
    features : torch.Tensor, float32, shape [N, F]
    labels : torch.Tensor, int64, shape [N]
    train_mask, val_mask, test_mask : torch.Tensor, bool, shape [N]
    num_classes : int
    extra : dict
        Facts specific to a data set (Planetoid: ``"self_loop_entries"``, ``"self_loop_nodes"``,
        ``"padded_nodes"``; see `graphrl.datasets.load_planetoid`).
    """

    name: str
    graph: CSCGraph
    features: torch.Tensor
    labels: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    extra: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        """N."""
        return self.graph.num_nodes

    @property
    def num_features(self) -> int:
        """F."""
        return int(self.features.shape[1])
