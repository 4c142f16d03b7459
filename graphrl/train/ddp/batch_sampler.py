"""Seeds split by rank: this rank's batches of an index range, `torch.utils.data.DistributedSampler`'s split.

`DistributedBatchSampler` draws the same seeded permutation on every rank (rank r takes positions r,
r + W, ...) and cuts this rank's share into batches. Every rank gets the same number of batches of
the same sizes, so collectives never wait for a rank that has run out, and a DDP step on equal-sized
rank batches equals a step on their union.

The drop/pad rule
-----------------
As ``DistributedSampler``: with ``drop_last=False`` (default) the shuffled index list is padded by
repeating its first ``ceil(M / W) * W - M`` entries, so each of the W ranks gets ``ceil(M / W)`` indices
and the last batch of an epoch may be short (equally short on every rank); an epoch then visits every
index at least once and (when M >= W) fewer than W of them twice. With ``drop_last=True`` the last
``M mod W`` indices of the permutation (different ones each epoch) are dropped, each rank gets
``floor(M / W)`` and a short final batch is dropped too: every batch has ``batch_size`` indices and
no index is visited twice. When W divides M the shares are an exact partition either way.

References
----------
``torch.utils.data.DistributedSampler`` (whose split this is) and ``BatchSampler``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DistributedSampler

__all__ = ["DistributedBatchSampler"]


class DistributedBatchSampler:
    """This rank's batches of ``range(num_items)``: `torch.utils.data.DistributedSampler`'s split, batched.

    Each epoch, every rank draws the same permutation (seeded by ``seed + epoch``; call `set_epoch`),
    pads or trims it to a multiple of ``world_size`` (see the module's drop/pad rule) and takes
    positions ``rank, rank + world_size, ...``; the shares are disjoint up to the padding. The share is
    cut into batches of ``batch_size`` in order. Every rank has the same number of batches, of the
    same sizes.

    Parameters
    ----------
    num_items : int
        M, e.g. the number of training pairs of a `LinkSampler`.
    batch_size : int
        Indices per batch on this rank (the global batch is ``world_size`` times larger).
    rank, world_size : int
        This rank and the number of ranks.
    shuffle : bool
        A fresh permutation each epoch (else ``0..M-1`` in order).
    seed : int
        Seed of the permutation; must be the same on every rank.
    drop_last : bool
        False: pad to ``ceil(M / W)`` per rank and keep a short last batch. True: trim to
        ``floor(M / W)`` per rank and drop a short last batch.

    Raises
    ------
    ValueError
        ``num_items`` < 1, ``batch_size`` < 1, ``world_size`` < 1, or ``rank`` outside
        ``[0, world_size)``.

    References
    ----------
    ``torch.utils.data.DistributedSampler`` (whose split this is) and ``BatchSampler``.

    Examples
    --------
    >>> batches = DistributedBatchSampler(link.num_pairs, 4096, rank=ctx.rank, world_size=ctx.world_size)
    >>> batches.set_epoch(3)
    >>> for ids in batches:          # int64 tensors of pair indices
    ...     batch = link.sample(ids)
    """

    def __init__(self, num_items: int, batch_size: int, *, rank: int, world_size: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        for name, value, low in (("num_items", num_items, 1), ("batch_size", batch_size, 1),
                                 ("world_size", world_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        self.num_items = int(num_items)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self._split = DistributedSampler(range(self.num_items), num_replicas=self.world_size, rank=self.rank,
                                         shuffle=bool(shuffle), seed=int(seed), drop_last=self.drop_last)
        self.epoch = 0

    @property
    def num_per_rank(self) -> int:
        """Indices this rank visits per epoch, before dropping a short batch."""
        return len(self._split)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation (call with the same value on every rank)."""
        self.epoch = int(epoch)
        self._split.set_epoch(self.epoch)

    def indices(self) -> torch.Tensor:
        """This rank's share of the current epoch, in visiting order: int64, shape [num_per_rank]."""
        return torch.tensor(list(iter(self._split)), dtype=torch.int64)

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        n, b = self.num_per_rank, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[torch.Tensor]:
        """The current epoch's batches: int64 index tensors of shape [batch_size] (the last may be short)."""
        share = self.indices()
        for i in range(len(self)):
            yield share[i * self.batch_size:(i + 1) * self.batch_size]
