"""Full-ranking top-K metrics for recommendation (the LightGCN / NGCF protocol).

Every item is scored for every evaluated user; the user's training items are masked out; the top K
remaining items are compared with the user's test items. Ties in score are broken by the lower item
id, so results do not depend on how ``torch.topk`` orders equal values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["RankingResult", "concat_ranges", "csr_from_pairs", "merge_csr", "ndcg_recall_from_topk",
           "topk_items", "evaluate_ranking", "popularity_scores"]


@dataclass(frozen=True)
class RankingResult:
    """Mean recall@K and NDCG@K over the evaluated users (those with at least one test item).

    Attributes
    ----------
    recall, ndcg : float
        Means over ``num_users`` users.
    k : int
    num_users : int
        Users with >= 1 test item that were evaluated.
    """

    recall: float
    ndcg: float
    k: int
    num_users: int


def concat_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[j], ends[j])`` over j, vectorised.

    ``starts``, ``ends``: int64 [J] with ``ends >= starts``; returns int64 [sum(ends - starts)] (the
    positions of CSR rows ``j`` in their ``indices`` array, row after row).
    """
    counts = ends - starts
    total = int(counts.sum())
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(offsets - starts, counts)


def csr_from_pairs(users, items, num_users: int) -> tuple[np.ndarray, np.ndarray]:
    """Group (user, item) pairs by user: ``(indptr int64 [U + 1], items int64 [M])``, items sorted per user.

    Parameters
    ----------
    users, items : torch.Tensor or array-like, integer, shape [M]
        User ids in [0, num_users) and item ids (any integers, e.g. 0-based item ids).
    num_users : int

    Returns
    -------
    tuple[np.ndarray, np.ndarray]

    Raises
    ------
    ValueError
        Lengths differ or a user id is outside [0, num_users).
    """
    u = np.asarray(users, dtype=np.int64)
    it = np.asarray(items, dtype=np.int64)
    if u.shape != it.shape or u.ndim != 1:
        raise ValueError(f"users and items must be 1-D of the same length, got {u.shape} and {it.shape}")
    if u.size and (u.min() < 0 or u.max() >= num_users):
        raise ValueError(f"users: ids must lie in [0, num_users={num_users}), "
                         f"got range [{u.min()}, {u.max()}]")
    order = np.lexsort((it, u))
    indptr = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=num_users), out=indptr[1:])
    return indptr, it[order]


def merge_csr(*csrs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Union of per-user item CSRs of the same users: ``(indptr int64 [U + 1], items int64)``, sorted.

    What to mask when scoring the test split of a data set with a validation split: its training and
    its validation items. Duplicates are kept (masking twice is harmless).

    Parameters
    ----------
    *csrs : tuple[np.ndarray, np.ndarray]
        ``(indptr [U + 1], items)`` each (`csr_from_pairs`), all over the same U users.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]

    Raises
    ------
    ValueError
        No CSR, or the user counts differ.
    """
    if not csrs:
        raise ValueError("merge_csr needs at least one CSR")
    n = csrs[0][0].size - 1
    if any(indptr.size - 1 != n for indptr, _ in csrs):
        raise ValueError(f"all CSRs must cover the same users, got {[c[0].size - 1 for c in csrs]}")
    users = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr)) for indptr, _ in csrs])
    items = np.concatenate([np.asarray(items, dtype=np.int64) for _, items in csrs])
    return csr_from_pairs(users, items, n)


def topk_items(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest-scoring columns of each row, best first; equal scores rank the lower column first.

    Parameters
    ----------
    scores : torch.Tensor, float, shape [B, I]
        Masked entries should be ``-inf``. Requires ``k <= I``.
    k : int

    Returns
    -------
    torch.Tensor, int64, shape [B, k]
        Column ids in rank order.

    Raises
    ------
    ValueError
        ``k`` is not in [1, I].
    """
    b, n = scores.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, num_items={n}], got {k}")
    m = min(k + 1, n)
    vals, idx = torch.topk(scores, m, dim=1)
    idx = idx[:, :k]
    thresh = vals[:, k - 1:k]
    # A tie crosses the boundary only where the (k+1)-th value equals the k-th: fix those rows exactly.
    ambiguous = (vals[:, k] == vals[:, k - 1]) if m > k else torch.zeros(b, dtype=torch.bool)
    if ambiguous.any():
        rows = ambiguous.nonzero().squeeze(1)
        s = scores[rows]
        t = thresh[rows]
        e = s == t
        need = k - (s > t).sum(1, keepdim=True)
        chosen = (s > t) | (e & (e.cumsum(1) <= need))
        idx[rows] = chosen.nonzero()[:, 1].reshape(-1, k)  # ascending column id
    # Order the chosen columns by (score descending, column ascending): sort by id, then stable by score.
    idx, _ = idx.sort(dim=1)
    chosen_scores = scores.gather(1, idx)
    order = torch.sort(chosen_scores, dim=1, descending=True, stable=True).indices
    return idx.gather(1, order)


def ndcg_recall_from_topk(topk: torch.Tensor, test_indptr: np.ndarray, test_items: np.ndarray,
                          users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user recall@K and NDCG@K (binary relevance) of ranked item lists.

    recall = hits / |test items|; DCG = sum over hit ranks r (1-based) of 1 / log2(r + 1); IDCG is
    the DCG of min(|test items|, K) hits at the top.

    Parameters
    ----------
    topk : torch.Tensor, int64, shape [B, K]
        Ranked item ids of each user.
    test_indptr, test_items : np.ndarray, int64
        Test items per user as CSR (`csr_from_pairs`).
    users : torch.Tensor, int64, shape [B]
        The user of each row; each must have >= 1 test item.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        recall and NDCG, float64, shape [B] each.
    """
    b, k = topk.shape
    u = users.numpy()
    starts, ends = test_indptr[u], test_indptr[u + 1]
    counts = ends - starts
    rows = np.repeat(np.arange(b), counts)
    cols = test_items[concat_ranges(starts, ends)]
    num_items = int(max(int(topk.max()) if topk.numel() else 0, int(cols.max()) if cols.size else 0)) + 1
    key_test = torch.from_numpy(rows * num_items + cols)
    key_top = torch.arange(b).unsqueeze(1) * num_items + topk
    hit = torch.isin(key_top, key_test).to(torch.float64)  # [B, K]
    discount = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64))
    dcg = (hit * discount).sum(1)
    ideal_cum = torch.cumsum(discount, 0)
    n_rel = torch.from_numpy(np.minimum(counts, k)).clamp(min=1)
    idcg = ideal_cum[n_rel - 1]
    recall = hit.sum(1) / torch.from_numpy(counts).to(torch.float64)
    return recall, dcg / idcg


def evaluate_ranking(score_fn: Callable[[torch.Tensor], torch.Tensor], train: tuple[np.ndarray, np.ndarray],
                     test: tuple[np.ndarray, np.ndarray], k: int = 20, batch_size: int = 1024,
                     copy_scores: bool = True) -> RankingResult:
    """Full-ranking recall@K and NDCG@K, masking each user's training items (the LightGCN protocol).

    Parameters
    ----------
    score_fn : callable
        ``score_fn(users int64 [B]) -> float [B, I]``: scores of every item for those users.
    train, test : tuple[np.ndarray, np.ndarray]
        ``(indptr int64 [U + 1], items int64 [M])`` per split, item ids in [0, I) (`csr_from_pairs`).
        Training items are set to ``-inf`` before ranking.
    k : int
        K (20 in the paper).
    batch_size : int
        Users scored per step.
    copy_scores : bool
        Copy what ``score_fn`` returns before masking it in place. ``False`` saves a copy when
        ``score_fn`` returns a fresh tensor (a matmul result); never when it returns a view of data
        that must stay intact.

    Returns
    -------
    RankingResult
        Means over the users with >= 1 test item.

    Raises
    ------
    ValueError
        ``train`` and ``test`` have different user counts, or ``k``/``batch_size`` < 1.

    References
    ----------
    He et al., LightGCN (SIGIR 2020) and Wang et al., NGCF (SIGIR 2019): all-item ranking, recall@20 and
    NDCG@20 on the Gowalla split.
    """
    train_indptr, train_items = train
    test_indptr, test_items = test
    if train_indptr.shape != test_indptr.shape:
        raise ValueError(f"train and test must cover the same users, got {train_indptr.size - 1} and "
                         f"{test_indptr.size - 1}")
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    users = np.flatnonzero(np.diff(test_indptr) > 0)
    recall_sum = ndcg_sum = 0.0
    for start in range(0, users.size, batch_size):
        ub = users[start:start + batch_size]
        scores = score_fn(torch.from_numpy(ub))
        if copy_scores:
            scores = scores.clone()
        s, e = train_indptr[ub], train_indptr[ub + 1]
        rows = np.repeat(np.arange(ub.size), e - s)
        cols = train_items[concat_ranges(s, e)]
        scores[torch.from_numpy(rows), torch.from_numpy(cols)] = -math.inf
        top = topk_items(scores, k)
        rec, ndcg = ndcg_recall_from_topk(top, test_indptr, test_items, torch.from_numpy(ub))
        recall_sum += float(rec.sum())
        ndcg_sum += float(ndcg.sum())
    n = users.size
    return RankingResult(recall=recall_sum / n if n else 0.0, ndcg=ndcg_sum / n if n else 0.0, k=k,
                         num_users=int(n))


def popularity_scores(train_items, num_items: int) -> torch.Tensor:
    """Popularity of every item: its number of training interactions, float32 [I].

    Used as a score for every user, with `evaluate_ranking` masking the user's own items, it gives the
    popularity baseline (the K most-interacted training items the user has not interacted with).
    """
    counts = np.bincount(np.asarray(train_items, dtype=np.int64), minlength=num_items)
    return torch.from_numpy(counts.astype(np.float32))
