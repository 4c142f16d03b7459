"""Full-ranking evaluation split over the ranks: each ranks a share of the test users, one all-reduce.

`evaluate_ddp` keeps every W-th test user on each rank, calls the single-process metric
(`graphrl.train.evaluate_model` or `evaluate_popularity`) on that share and all-reduces the sums;
the result equals the single-process evaluation up to the order of floating-point sums. Exact
evaluation (`LightGCN.inference` and the metrics) runs on the CPU: evaluate a CPU model.

>>> evaluate_ddp(lambda t: evaluate_model(ddp.module, graph, U, train, t), test)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from graphrl.train.metrics import RankingResult

__all__ = ["evaluate_ddp"]


def evaluate_ddp(evaluate: Callable[[tuple[np.ndarray, np.ndarray]], RankingResult],
                 test: tuple[np.ndarray, np.ndarray], *,
                 group: dist.ProcessGroup | None = None) -> RankingResult:
    """Recall@K / NDCG@K over all test users, each rank ranking every W-th of them.

    Rank r keeps the test items of users ``users[r::W]`` (``users``: those with >= 1 test item, in id
    order) and calls ``evaluate`` with that reduced test split, so the single-process metric code (which
    skips users without test items) ranks only its share; the per-rank sums are then all-reduced. The
    result equals the single-process evaluation up to the order of floating-point sums. Every rank of
    ``group`` must call it (a collective).

    Parameters
    ----------
    evaluate : callable
        ``evaluate(test_share) -> RankingResult``, e.g. ``lambda t: evaluate_model(model, graph,
        num_users, train, t, k=20)`` or ``lambda t: evaluate_popularity(train, t, num_items)``.
    test : tuple[np.ndarray, np.ndarray]
        The whole test split as per-user CSR ``(indptr int64 [U + 1], item ids int64 [M])``.
    group : torch.distributed.ProcessGroup or None
        Default: the world (one process when no group exists).

    Returns
    -------
    RankingResult
        Means over all users with test items; ``num_users`` counts them all.

    Examples
    --------
    >>> evaluate_ddp(lambda t: evaluate_model(ddp.module, graph, U, train, t), test)  # doctest: +SKIP
    """
    indptr, items = (np.asarray(a) for a in test)
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    counts = np.diff(indptr)
    keep = np.zeros(counts.size, dtype=bool)
    keep[np.flatnonzero(counts > 0)[rank::world]] = True
    share_counts = np.where(keep, counts, 0)
    share_indptr = np.zeros_like(indptr)
    np.cumsum(share_counts, out=share_indptr[1:])
    share = (share_indptr, items[np.repeat(keep, counts)])
    result = evaluate(share)
    sums = torch.tensor([result.recall * result.num_users, result.ndcg * result.num_users, result.num_users],
                        dtype=torch.float64)
    if world > 1:
        if dist.get_backend(group) == "nccl":
            sums = sums.cuda()
        dist.all_reduce(sums, group=group)
    recall_sum, ndcg_sum, n = sums.tolist()
    return RankingResult(recall=recall_sum / n if n else 0.0, ndcg=ndcg_sum / n if n else 0.0, k=result.k,
                         num_users=int(round(n)))
