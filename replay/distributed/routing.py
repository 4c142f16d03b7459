"""Which shard gets what in the Ray replay store: writes, draws, keys, the insert budget, seeds.

- writes: a writer sends each new episode to the shard it has sent the fewest steps to, ties broken
  from an offset (`least_loaded`); a new writer's offset is the next shard in a round robin over all
  the store's writers (a counter on shard 0's actor).
- draws: the client splits a batch over the shards by a multinomial with weights ``shares(mass)`` (a
  shard's priority mass, or its live count), so a window's probability is ``P(shard) * P(window |
  shard)`` and the batch is distributed as if drawn from one table; `split_calls` then cuts one
  shard's share into parallel calls.
- keys: a shard's local key (shard bits 0) or'ed with the shard's index (`replay.keys` layout);
  `split_keys` routes priority updates back by those bits.
- inserts: the store's rate limiter applies at the client with global counters; its own
  `replay.rate_limiter.RateLimiter.insert_headroom` (counted from its ``can_insert``, a subclass's
  included) turns them into the steps it admits now and `allowances` splits that evenly over the shards.
See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import numpy as np

from replay.keys import MAX_SHARDS
from replay.rate_limiter import RateLimiter

__all__ = ["allowances", "least_loaded", "shard_seed", "shares", "split_calls", "split_keys"]


def allowances(limiter: RateLimiter, stats: list[dict], samples: int) -> list[float]:
    """Each shard's insert allowance: its inserts plus an even share of the global headroom
    (`replay.rate_limiter.RateLimiter.insert_headroom` of the global counters)."""
    inserts = sum(st["inserts"] for st in stats)
    deletes = sum(st["deletes"] for st in stats)
    h = limiter.insert_headroom((inserts, samples, deletes)) / len(stats)
    return [st["inserts"] + h for st in stats]


def shard_seed(seed: int | None, s: int) -> int | None:
    """Shard ``s``'s selector seed, spawned from the store's (None stays None)."""
    if seed is None:
        return None
    return int(np.random.SeedSequence(seed).spawn(s + 1)[s].generate_state(1, np.uint32)[0])


def least_loaded(shard_steps: np.ndarray, offset: int) -> int:
    """The shard a writer has sent the fewest steps to (ties: the first from ``offset`` on)."""
    s = len(shard_steps)
    order = (np.arange(s) + offset) % s
    return int(order[np.argmin(shard_steps[order])])


def shares(mass: np.ndarray) -> np.ndarray:
    """Each shard's share of a draw from its mass (> 0 in total), robust to masses that overflow."""
    inf = np.isinf(mass)
    m = inf.astype(np.float64) if inf.any() else mass / mass.max()  # scaled: no overflow in the sum
    return m / m.sum()


def split_calls(k: int, num_shards: int) -> list[int]:
    """A shard's share of a batch in parallel calls: two halves with one shard (its actor's threads
    gather and serialise them at once), else one call per shard (the shards run in parallel)."""
    if k == 0:
        return []
    if num_shards == 1 and k >= 16:
        return [k - k // 2, k // 2]
    return [k]


def split_keys(keys: np.ndarray, num_shards: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(shard, rows, local keys)`` for each shard that ``keys`` (int64 [K], >= 0) name, in shard order.

    Raises
    ------
    ValueError
        A key names a shard the store does not have (nothing is routed).
    """
    shard = keys & (MAX_SHARDS - 1)
    negative = keys < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"key {int(keys[i])} is negative: keys are the >= 0 int64 values of batch.keys; "
            "nothing was changed"
        )
    bad = shard >= num_shards
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"key {int(keys[i])} names shard {int(shard[i])}, but the store has shards "
            f"0..{num_shards - 1}; nothing was changed"
        )
    local = keys & ~np.int64(MAX_SHARDS - 1)
    out = []
    for s in np.unique(shard):
        rows = shard == s
        out.append((int(s), rows, local[rows]))
    return out
