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
  included) turns them into the steps it admits now and `headroom_shares` splits that over the shards in
  whole steps (`allowance_steps`: each shard's inserts plus its share; the client pushes it as a
  `ShardAllowance` with the global counts it comes from, their headroom and the limiter's explanation past
  it, `explained_headroom`, which a refusal's message gives). A shard
  admits a shipment while its inserts are below its allowance, then charges all its steps, as the local
  store admits a call while its limiter admits one step. So a headroom H admits fewer than ``H + S * m``
  steps in all (S shards, m the largest shipment), where the local store admits fewer than ``H + m``: at
  most one shipment per shard goes past, not one in all; one-step shipments with ``H >= S`` are admitted
  exactly as in the local store. Equality in general would need a round trip per shipment: with H = 1 and
  two writers shipping to two shards at once, each shard must admit (either could be the only one with a
  writer waiting, whom the local store would admit), so both go past.
See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replay.keys import MAX_SHARDS
from replay.rate_limiter import RateLimiter

__all__ = [
    "ShardAllowance", "allowance_steps", "allowances", "explained_headroom", "headroom_shares",
    "least_loaded", "shard_allowances", "shard_seed", "shares", "split_calls", "split_keys",
]


@dataclass(frozen=True)
class ShardAllowance:
    """What the client pushes a shard: its insert allowance and the global counts it was computed from.

    One record, so a refusal's message always pairs an allowance with the counts, headroom and
    explanation it came from (`replay.distributed.shard.ShardActor.insert`).

    Attributes
    ----------
    steps : float
        The shard admits a shipment while its inserts are below it (`allowance_steps`; ``math.inf``:
        always).
    counts : (int, int, int)
        The store's ``(inserts, samples, deletes)`` whose `replay.rate_limiter.RateLimiter.insert_headroom`
        the shard has its share of.
    headroom : float or None
        That headroom, and ``why`` the limiter's ``explain_insert_block`` one step past it
        (`explained_headroom`), computed by the client's limiter object when it made the allowance (the
        shard holds no copy of a user's limiter that could be stale). None (an allowance made without
        them, as in tests): the shard explains ``counts`` with the limiter its config names.
    why : str or None
        See ``headroom``.
    """

    steps: float
    counts: tuple[int, int, int]
    headroom: float | None = None
    why: str | None = None


def explained_headroom(limiter: RateLimiter, counts: tuple[int, int, int]) -> tuple[float, str]:
    """``limiter.insert_headroom(counts)`` and the limiter's ``explain_insert_block`` at the counts one step
    past that headroom (at ``counts`` when it is unbounded): why a shipment past an allowance waits.

    ``counts`` is the global (inserts, samples, deletes), in steps. Returns (headroom, why): the headroom in
    steps (a whole number, or ``math.inf`` when the limiter bounds nothing) and the explanation text."""
    headroom = limiter.insert_headroom(counts)
    i, s, d = counts
    past = (i + int(headroom), s, d) if math.isfinite(headroom) else counts
    return headroom, limiter.explain_insert_block(past)


def headroom_shares(headroom: float, num_shards: int) -> list[float]:
    """The global insert headroom (steps, ``math.inf`` unbounded) split over ``num_shards`` shards.

    Whole steps summing to ``floor(headroom)``, the first ``floor(headroom) % num_shards`` shards one
    more, so one-step shipments are admitted exactly as the local store admits them; but every shard at
    least one step while ``headroom >= 1`` (fewer steps than shards: each shard may take one shipment,
    else a writer waiting on a shard without a share would wait while the local store admits it);
    ``math.inf`` each when unbounded, 0 each when ``headroom < 1``.
    """
    if math.isinf(headroom) and headroom > 0:
        return [math.inf] * num_shards
    h = max(0, math.floor(headroom))
    if h == 0:
        return [0.0] * num_shards
    if h < num_shards:
        return [1.0] * num_shards
    base, extra = divmod(h, num_shards)
    return [float(base + (s < extra)) for s in range(num_shards)]


def allowance_steps(inserts: int, headroom: float, num_shards: int, index: int) -> float:
    """Shard ``index``'s insert allowance: its ``inserts`` plus its `headroom_shares` share of the global
    ``headroom``."""
    return inserts + headroom_shares(headroom, num_shards)[index]


def shard_allowances(limiter: RateLimiter, stats: list[dict], samples: int) -> list[ShardAllowance]:
    """Each shard's `ShardAllowance`: `allowance_steps` of the global headroom
    (`replay.rate_limiter.RateLimiter.insert_headroom` of the global counters, summed once here from the
    shards' ``stats`` and ``samples``), with those counts and `explained_headroom`'s explanation."""
    counts = (sum(st["inserts"] for st in stats), int(samples), sum(st["deletes"] for st in stats))
    headroom, why = explained_headroom(limiter, counts)
    shares = headroom_shares(headroom, len(stats))  # once, not once per shard (`allowance_steps`' rule)
    return [ShardAllowance(st["inserts"] + share, counts, headroom, why)
            for st, share in zip(stats, shares, strict=True)]


def allowances(limiter: RateLimiter, stats: list[dict], samples: int) -> list[float]:
    """The steps of `shard_allowances`: each shard's inserts plus its share of the global headroom."""
    return [a.steps for a in shard_allowances(limiter, stats, samples)]


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
