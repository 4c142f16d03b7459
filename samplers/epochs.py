"""How an epoch is cut into batches: the one rule every loader and link sampler of `samplers` follows.

`num_batches` is the number of batches of an epoch of ``n`` items (`NeighborLoader`'s seeds, a link
sampler's positive pairs); `epoch_batches` yields one epoch's item ids, batch by batch, in a seeded random
order or in input order. Both cut at multiples of ``batch_size`` and, with ``drop_last``, drop the last,
shorter batch (as ``torch.utils.data.DataLoader``'s ``drop_last``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["epoch_batches", "epoch_order", "num_batches"]


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches of an epoch of ``n`` items: ``ceil(n / batch_size)``, or ``n // batch_size`` with
    ``drop_last`` (``n >= 0`` and ``batch_size >= 1``, checked by the caller)."""
    return n // batch_size if drop_last else -(-n // batch_size)


def epoch_order(rng: np.random.Generator, n: int, shuffle: bool) -> np.ndarray:
    """One epoch's order of the items ``[0, n)``: int64 [n], ``rng.permutation(n)`` (one draw of ``rng``)
    with ``shuffle``, else ``arange(n)``; batch j is ``order[j * batch_size:(j + 1) * batch_size]`` for j
    below `num_batches`."""
    return rng.permutation(n) if shuffle else np.arange(n, dtype=np.int64)


def epoch_batches(rng: np.random.Generator, n: int, batch_size: int, shuffle: bool,
                  drop_last: bool) -> Iterator[np.ndarray]:
    """One epoch's item ids, batch by batch: every id of ``[0, n)`` once, in ``rng.permutation(n)`` order
    (drawn at the first batch) or in input order without ``shuffle``; int64 [batch_size] each, the last
    shorter unless ``drop_last`` drops it (`num_batches` of them)."""
    order = epoch_order(rng, n, shuffle)
    for j in range(num_batches(n, batch_size, drop_last)):
        yield order[j * batch_size:(j + 1) * batch_size]
