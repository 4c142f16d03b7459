"""A validation split carved from a recommender's training interactions (never from its test set).

Model selection and early stopping need a held-out set the test split never sees: `holdout_validation`
moves a seeded, per-user fraction of each user's *training* interactions into a validation set and
rebuilds the training graph without them, so no propagation reads a validation edge.

Usage::

    split = holdout_validation(load_gowalla(), fraction=0.05, seed=0)
    split.dataset               # an InteractionDataset: train = the kept interactions, test unchanged
    split.val_users, split.val_items
    split.validation_csr()      # per-user CSR of the validation items, for evaluate_ranking

Every user keeps at least one training interaction; test interactions are untouched. The split depends
only on the interactions, ``fraction`` and ``seed`` (not on the order of earlier random calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset
from graphrl.graph import CSCGraph

__all__ = ["ValidationSplit", "holdout_validation"]


@dataclass(eq=False)
class ValidationSplit:
    """A data set whose training interactions lost a validation part, and that part.

    Attributes
    ----------
    dataset : InteractionDataset
        ``train_users``/``train_items`` the kept interactions (original order), ``graph`` rebuilt from
        them, test as in the source; ``extra["validation_fraction"]`` and ``extra["validation_seed"]``.
    val_users, val_items : torch.Tensor, int64, shape [M_val]
        Held-out interactions (item ids in ``0..I-1``), in the source's order.
    train_index, val_index : torch.Tensor, int64
        Positions of the kept and held-out interactions in the source's training arrays (disjoint,
        together ``0..M_train-1``).
    source : InteractionDataset or None
        The data set the split was carved from (all its training interactions), for a refit after model
        selection; None when unknown.
    """

    dataset: InteractionDataset
    val_users: torch.Tensor
    val_items: torch.Tensor
    train_index: torch.Tensor
    val_index: torch.Tensor
    source: InteractionDataset | None = None

    def validation_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """Validation items per user as CSR: ``(indptr int64 [U + 1], items int64 [M_val])``, sorted."""
        users, items = self.val_users.numpy(), self.val_items.numpy()
        order = np.lexsort((items, users))
        indptr = np.zeros(self.dataset.num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(users, minlength=self.dataset.num_users), out=indptr[1:])
        return indptr, items[order].astype(np.int64)


def holdout_validation(dataset: InteractionDataset, fraction: float = 0.05, seed: int = 0) -> ValidationSplit:
    """Hold out about ``fraction`` of every user's training interactions as a validation set.

    User u with n_u training interactions gives ``min(n_u - 1, floor(fraction * n_u + r_u))`` of them,
    r_u uniform in [0, 1) (stochastic rounding: the expected count is ``fraction * n_u``, the total is
    close to ``fraction * M``), chosen uniformly among its interactions. Users with one interaction
    keep it.

    Parameters
    ----------
    dataset : InteractionDataset
        The source; its test split is copied, never read for the choice.
    fraction : float
        In (0, 1).
    seed : int
        Seeds a private ``numpy.random.Generator``.

    Returns
    -------
    ValidationSplit

    Raises
    ------
    ValueError
        ``fraction`` not in (0, 1); a (user, item) pair repeated in the training interactions.

    References
    ----------
    The per-user random hold-out of the recommender benchmarks of RecBole (Zhao et al., CIKM 2021) and
    of "Are We Really Making Much Progress?" (Dacrema et al., RecSys 2019).
    """
    if not (isinstance(fraction, float | int) and 0.0 < float(fraction) < 1.0):
        raise ValueError(f"fraction must lie in (0, 1), got {fraction!r}")
    users = dataset.train_users.numpy().astype(np.int64, copy=False)
    m = users.size
    pairs = np.sort(users * dataset.num_items + dataset.train_items.numpy().astype(np.int64, copy=False))
    repeats = np.flatnonzero(pairs[1:] == pairs[:-1])  # one sort: each entry is one copy too many
    if repeats.size:
        first = int(pairs[repeats[0]])
        raise ValueError(f"dataset {dataset.name!r} repeats {repeats.size} training (user, "
                         f"item) pairs, e.g. user {first // dataset.num_items}, item "
                         f"{first % dataset.num_items}: a held-out copy would stay a training edge; "
                         "deduplicate the pairs first")
    rng = np.random.default_rng(seed)
    counts = np.bincount(users, minlength=dataset.num_users)
    quota = np.floor(fraction * counts + rng.random(dataset.num_users)).astype(np.int64)
    quota = np.minimum(quota, np.maximum(counts - 1, 0))
    # Rank each interaction within its user by a random key: the first quota[u] ranks are held out.
    key = rng.random(m)
    order = np.lexsort((key, users))
    starts = np.zeros(dataset.num_users, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m, dtype=np.int64) - np.repeat(starts, counts)
    is_val = rank < quota[users]
    val_index = np.flatnonzero(is_val)
    train_index = np.flatnonzero(~is_val)
    tr_u, tr_i = dataset.train_users[train_index], dataset.train_items[train_index]
    weights = None if dataset.train_weights is None else dataset.train_weights[train_index]
    graph = CSCGraph.bipartite(tr_u.numpy(), tr_i.numpy(), dataset.num_users, dataset.num_items,
                               weights=None if weights is None else weights.numpy())
    kept = InteractionDataset(
        name=dataset.name, num_users=dataset.num_users, num_items=dataset.num_items,
        train_users=tr_u, train_items=tr_i, test_users=dataset.test_users, test_items=dataset.test_items,
        graph=graph, train_weights=weights,
        extra={**dataset.extra, "validation_fraction": float(fraction), "validation_seed": int(seed)})
    return ValidationSplit(dataset=kept, val_users=dataset.train_users[val_index],
                           val_items=dataset.train_items[val_index],
                           train_index=torch.from_numpy(train_index), val_index=torch.from_numpy(val_index),
                           source=dataset)
