"""GlobalLimiter: the user's rate limiter applied to the whole Ray store, with global counters.

Inserts and deletes are the sums of the shards' counts (fresh from the stats round trip of every
`sample`); samples are counted in one `SampleCounter` actor that every sampling client adds to (the
store's own client and each of its learners, `replay.distributed.learner.RayLearner`), read in the same
round trip, so samples per insert is global over all learners. A sample waits (no polling: blocking
calls on the shards that return when a shard's insert count moves) until the limiter admits it. On the
insert side the client turns the global counters into a headroom of H steps (the limiter's own
`replay.rate_limiter.RateLimiter.insert_headroom`, from its ``can_insert``, a subclass's included), splits
it over the S shards in whole steps summing to H (`replay.distributed.routing.headroom_shares`: the first
``H % S`` shards one step more, but at least one each while H >= 1) and pushes each shard an allowance
(its inserts plus its share) with every call; a shard admits a shipment while its own inserts are below
its allowance, then charges all its steps, so fewer than ``H + S * m`` steps go in (m the largest
shipment; the local store: fewer than ``H + m``) and the global ratio holds to within the error buffer
plus one shipment per shard. The shards' local stores run ``MinSize(1)``. Reverb's rate limiters
(``reverb/cc/rate_limiter.cc``) are the model.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import ray

from replay.distributed.errors import ShardError, actor_errors, secs
from replay.distributed.group import ShardGroup
from replay.distributed.routing import ShardAllowance, shard_allowances
from replay.rate_limiter import RateLimiter

__all__ = ["GlobalLimiter", "SampleCounter", "stats_timeout"]

STATS_GRACE = 5.0  # seconds a sample's stats round trip may take past a shorter timeout (see stats_timeout)


def stats_timeout(deadline: float | None) -> float | None:
    """Seconds a stats round trip of `sample` may take: what is left of its deadline, but at least
    ``STATS_GRACE`` (a live shard answers in ms; even ``timeout=0`` must learn the counters to say
    why the rate limiter blocks, as the local store does)."""
    return None if deadline is None else max(STATS_GRACE, deadline - time.monotonic())


class SampleCounter:
    """The steps sampled from one Ray store by all its clients (a Ray actor, one call at a time).

    Calls from one client run in the order it sent them, so a client's `add` is in its next `total`.
    """

    def __init__(self, samples: int = 0) -> None:
        self.samples = int(samples)

    def add(self, n: int) -> int:
        self.samples += int(n)
        return self.samples

    def total(self) -> int:
        return self.samples


class GlobalLimiter:
    """``limiter`` over all the shards of ``shards``; ``counter`` the store's `SampleCounter` actor.

    ``samples`` is the counter's total as of the last `refresh` plus this client's samples since.
    """

    def __init__(self, limiter: RateLimiter, shards: ShardGroup, counter: Any) -> None:
        self.limiter = limiter
        self.shards = shards
        self.counter = counter
        self.samples = 0
        self.limited = not math.isinf(limiter.insert_headroom((0, 0, 0)))  # MinSize: inserts never wait

    def add_samples(self, n: int) -> None:
        """Count ``n`` sampled steps of this client (sent without waiting for the reply)."""
        self.samples += int(n)
        self.counter.add.remote(int(n))

    def counts(self) -> tuple[int, int, int]:
        """Global ``(inserts, samples, deletes)`` (as of the shards' last stats)."""
        inserts, deletes = self.shards.totals()
        return inserts, self.samples, deletes

    def allowances(self) -> list[ShardAllowance]:
        """Each shard's insert allowance now, with the global counts it comes from."""
        return shard_allowances(self.limiter, self.shards.stats, self.samples)

    def refresh(self, timeout: float | None = None, what: str = "a store call") -> list[dict]:
        """Fresh stats from every shard, pushing each its insert allowance."""
        total = self.counter.total.remote()
        allow = self.allowances() if self.shards.stats[0] else [None] * len(self.shards)
        stats = self.shards.refresh(allow, timeout, what)
        try:
            self.samples = int(ray.get(total, timeout=timeout))
        except actor_errors() as exc:
            raise ShardError(
                f"the store's sample counter actor died or is unreachable during {what} ({exc!r}); "
                "restore the store from a checkpoint (RayReplayStore.restore(path))"
            ) from exc
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(
                f"the store's sample counter did not answer {what} within {secs(timeout)}"
            ) from exc
        return stats

    def let_writers_in(self) -> None:
        """Push the shards their allowances (after samples moved them; nothing for MinSize)."""
        if self.limited:
            self.shards.push_allowances(self.allowances())

    def can_sample(self) -> bool:
        return self.limiter.can_sample(self.counts())

    def await_sample(self, deadline: float | None, timeout: float | None) -> None:
        """Refresh the counters until the rate limiter admits a sample (blocking calls, no polling).

        Raises
        ------
        TimeoutError
            Not admitted by ``deadline`` (the message says which side is ahead).
        """
        start = time.monotonic()
        while True:
            counts = self.counts()
            if self.limiter.can_sample(counts):
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"sample waited {secs(time.monotonic() - start)} (timeout={secs(timeout)}): "
                    f"{self.limiter.explain_sample_block(counts)}"
                )
            token = uuid.uuid4().hex
            self.shards.push_allowances(self.allowances())  # let the writers in while we wait
            actors = self.shards.actors
            refs = [
                a.wait_inserts.remote(st["inserts"], token, left)
                for a, st in zip(actors, self.shards.stats, strict=True)
            ]
            ray.wait(refs, num_returns=1, timeout=left)
            for a in actors:
                a.wake.remote(token)
            try:
                ray.get(refs)
            except actor_errors():
                pass  # the refresh below names the shard (or retries a restarted one)
            self.refresh(stats_timeout(deadline), "sample()")
