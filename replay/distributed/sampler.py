"""ShardSampler: a batch drawn over the Ray store's shards as from one table, with an optional prefetch.

`ShardSampler.sample` refreshes every shard's mass and counters (one round trip), waits for the rate
limiter (`replay.distributed.limiter.GlobalLimiter`), draws the per-shard counts from a multinomial
with weights `replay.distributed.routing.shares` of the masses (a shard's priority mass for
Prioritized, its live count when the whole table's mass is 0 and for Uniform), asks each shard for its
share in parallel (`replay.distributed.shard.ShardActor.sample`), and builds the `Batch` from the
replies (`replay.distributed.staging.BatchAssembler`). With ``prefetch=1`` the next draw is sent as a
batch is returned, as Reverb's samplers keep samples in flight. `last_profile` holds the seconds of
each stage of the last batch (what ``benchmarks/distributed.py`` reports).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from replay.batch import Batch
from replay.distributed.errors import ShardError
from replay.distributed.group import ShardGroup
from replay.distributed.limiter import GlobalLimiter, stats_timeout
from replay.distributed.routing import shares, split_calls
from replay.distributed.staging import BatchAssembler

__all__ = ["ShardSampler"]

logger = logging.getLogger(__name__)


class ShardSampler:
    """The Ray client's sampling: draws over ``shards``, admitted by ``limiter``, built by ``staging``.

    Parameters
    ----------
    shards, limiter, staging
        The client's `ShardGroup`, `GlobalLimiter` and `BatchAssembler`.
    rng : numpy.random.Generator
        Draws the per-shard counts (its state is checkpointed).
    prioritized : bool
        Split by priority mass (else by live count).
    prefetch : int
        1: send the next draw (same arguments) as a batch is returned.
    """

    def __init__(
        self,
        shards: ShardGroup,
        limiter: GlobalLimiter,
        staging: BatchAssembler,
        rng: np.random.Generator,
        prioritized: bool,
        prefetch: int,
    ) -> None:
        self.shards = shards
        self.limiter = limiter
        self.staging = staging
        self.rng = rng
        self.prioritized = prioritized
        self.prefetch = prefetch
        self.pending: dict | None = None
        self.last_profile: dict[str, float] = {}

    def sample(
        self, b: int, length: int, pad: str, beta: float, deadline: float | None, timeout: float | None
    ) -> Batch:
        """``b`` windows of ``length`` steps (arguments checked by `RayReplayStore.sample`)."""
        t0 = time.perf_counter()
        pending, self.pending = self.pending, None
        if pending is not None and pending["key"] != (b, length, pad):
            self.drop(pending)  # prefetched for other arguments: its draws are discarded
            pending = None
        if pending is None:
            pending = self.issue(b, length, pad, deadline, block=True, timeout=timeout)
        t1 = time.perf_counter()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        replies = self.shards.collect(pending["calls"], pending["refs"], "sample()", left)
        t2 = time.perf_counter()
        self.limiter.add_samples(int(sum(int(rep["n"].sum()) for rep in replies)))
        for (s, _, _), rep in zip(pending["calls"], replies, strict=True):
            self.shards.stats[s]["inserts"], self.shards.stats[s]["deletes"] = rep["counts"]
        if self.prefetch:  # the next batch is drawn and shipped while this one is copied and used
            try:
                self.pending = self.issue(b, length, pad, None, block=False)
            except (ShardError, TimeoutError) as exc:  # surfaces at the next call
                logger.debug("no prefetch: %s", exc)
        else:
            self.limiter.let_writers_in()
        batch, get_s = self.staging.assemble(pending, replies, beta, left)
        t3 = time.perf_counter()
        slowest = max(replies, key=lambda rep: rep["seconds"][2])["seconds"]
        self.last_profile = {
            "stats_s": t1 - t0 if "stats_s" not in pending else pending["stats_s"],
            "remote_s": t2 - t1,
            "shard_sample_s": slowest[2],
            "shard_draw_s": slowest[0],
            "shard_put_s": slowest[1],
            "transfer_s": max(0.0, (t2 - t1) - slowest[2]),
            "get_s": get_s,
            "copy_s": t3 - t2 - get_s,
            "total_s": t3 - t0,
            "redrawn": float(sum(rep["redrawn"] for rep in replies)),
            "shard_put_faults": float(sum(rep["faults"] for rep in replies)),
            "shard_put_bytes": float(sum(rep["bytes"] for rep in replies)),
        }
        return batch

    def issue(
        self, b: int, length: int, pad: str, deadline: float | None, block: bool, timeout: float | None = None
    ) -> dict | None:
        """Refresh the shards' masses, admit the draw (rate limiter) and send every shard its share.

        Returns the pending draw (calls, refs, shares), or None when ``block`` is False and the rate
        limiter does not admit it now.
        """
        t0 = time.perf_counter()
        self.limiter.refresh(stats_timeout(deadline), "sample()")
        if block:
            self.limiter.await_sample(deadline, timeout)
        elif not self.limiter.can_sample():
            return None
        stats = self.shards.stats
        live = np.array([st["live"] for st in stats], dtype=np.float64)
        wmass = np.array([st["wmass"] for st in stats], dtype=np.float64)
        mass = wmass if self.prioritized and wmass.sum() > 0 else live
        if mass.sum() <= 0:
            if not block:
                return None
            raise TimeoutError(f"no shard holds a sampleable window (live items per shard: {live.tolist()})")
        share = shares(mass)
        num_shards = len(self.shards)
        counts = self.rng.multinomial(b, share) if num_shards > 1 else np.array([b])
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        allow = self.limiter.allowances() if self.limiter.limited else None
        calls = [
            (s, "sample", (k, length, pad, left, None if allow is None else allow[s]))
            for s in range(num_shards)
            for k in split_calls(int(counts[s]), num_shards)
        ]
        return {
            "key": (b, length, pad),
            "calls": calls,
            "refs": self.shards.submit(calls),
            "share": share,
            "table_size": int(live.sum()),
            "stats_s": time.perf_counter() - t0,
        }

    def drop(self, pending: dict) -> None:
        """Wait for a prefetched draw that will not be used (so its shards' staging can be reused)."""
        try:
            self.shards.collect(pending["calls"], pending["refs"], "a dropped prefetch", None)
        except (ShardError, TimeoutError) as exc:
            logger.debug("dropped prefetch: %s", exc)


    def drop_pending(self) -> None:
        """Drop a prefetched draw (before a checkpoint: its windows may predate it)."""
        if self.pending is not None:
            self.drop(self.pending)
            self.pending = None
