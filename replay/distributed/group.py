"""ShardGroup: the client's calls to its shard actors, in parallel, with restart recovery and cached stats.

`call` runs one method on several shards at once and returns their results in order; a shard that
Ray restarted (``max_restarts``) is found (`replay.distributed.errors.AwaitingRestore` or an actor
error), has it reload the store's last checkpoint (`revive`) and its call retried once; a shard that
stays dead raises `replay.distributed.errors.ShardError` naming it. `refresh` reads every shard's
stats (live count, priority mass, counters) and pushes each its insert allowance; the last stats
stay in `stats` for the rate limiter and the routing of draws.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from replay._checks import check_int
from replay.distributed.errors import AwaitingRestore, ShardError, actor_errors, secs, shard_error
from replay.distributed.routing import ShardAllowance

__all__ = ["Call", "ShardGroup"]

logger = logging.getLogger(__name__)

Call = tuple[int, str, tuple]  # (shard, method, arguments)
KILL_WAIT = 10.0  # seconds `ShardGroup.kill` waits for Ray to report its actors dead
KILL_POLL = 0.002  # seconds between pings of an actor being killed


class ShardGroup:
    """The shard actors of one store (index = shard) and what the client last learnt of them.

    Parameters
    ----------
    actors : list of Ray actor handles
        `replay.distributed.shard.ShardActor` actors, one per shard.
    max_restarts : int
        Ray's restart budget of each actor (0: a dead shard stays dead).
    folders : dict of int to str, optional
        Each shard's last checkpoint (what a restarted shard reloads).
    reloads : bool
        Reload a restarted shard (the store's owner); False (a learner, which does not know the
        checkpoints): raise `ShardError` saying it awaits the owner.
    """

    def __init__(
        self,
        actors: list[Any],
        max_restarts: int,
        folders: dict[int, str] | None = None,
        reloads: bool = True,
    ) -> None:
        self.actors = list(actors)
        self.max_restarts = max_restarts
        self.reloads = reloads
        self.folders: dict[int, str] = dict(folders or {})
        self.stats: list[dict] = [{} for _ in self.actors]

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, calls: list[Call]) -> list:
        """Send ``actor[s].method(*args)`` for each call; return the object refs."""
        return [getattr(self.actors[s], m).remote(*a) for s, m, a in calls]

    def call(self, calls: list[Call], what: str, timeout: float | None = None) -> list:
        """Run the calls in parallel; return the results in order (see `collect`)."""
        return self.collect(calls, self.submit(calls), what, timeout)

    def episodes(self, shard: int | None = None) -> list:
        """Copies of the live episodes (`replay.storage.Episode`) of one shard or all, shard by shard.

        Raises
        ------
        TypeError, ValueError
            ``shard`` not an int index of a shard.
        """
        n = len(self.actors)
        shards = range(n) if shard is None else [check_int("shard", shard, 0, n - 1)]
        parts = self.call([(s, "episodes", ()) for s in shards], "episodes()")
        return [e for part in parts for e in part]

    def collect(self, calls: list[Call], refs: list, what: str, timeout: float | None) -> list:
        """The results of submitted calls, in order.

        A shard found restarted is reloaded from the last checkpoint and its call retried once.

        Raises
        ------
        ShardError
            A shard's actor died (and was not restarted, or died again).
        TimeoutError
            A shard did not answer within ``timeout``.
        """
        out = []
        for (s, m, a), ref in zip(calls, refs, strict=True):
            try:
                res = ray.get(ref, timeout=timeout)
            except (*actor_errors(), AwaitingRestore) as exc:
                if self.max_restarts == 0:
                    raise shard_error(s, what, exc, 0) from exc
                self.revive(s, timeout, what)
                try:
                    res = ray.get(getattr(self.actors[s], m).remote(*a), timeout=timeout)
                except (*actor_errors(), AwaitingRestore) as exc2:
                    raise shard_error(s, what, exc2, self.max_restarts) from exc2
            except ray.exceptions.GetTimeoutError as exc:
                raise TimeoutError(f"shard {s} did not answer {what} within {secs(timeout)}") from exc
            if m == "stats" and res["awaiting"]:  # restarted between two calls
                self.revive(s, timeout, what)
                res = ray.get(self.actors[s].stats.remote(*a), timeout=timeout)
            out.append(res)
        return out

    def revive(self, s: int, timeout: float | None, what: str) -> None:
        """Wait for Ray to restart shard s's actor, then have it reload the last checkpoint.

        Raises
        ------
        ShardError
            This group does not reload shards (a learner's): the owner's next call does.
        """
        if not self.reloads:
            raise ShardError(
                f"shard {s}: its Ray actor was restarted during {what} and awaits its checkpoint, which "
                "the store's owner reloads on its next call (RayReplayStore.stats(), sample()...); retry then"
            )
        actor = self.actors[s]
        try:  # a ping that Ray retries until the actor is back (or gives up for good)
            ray.get(actor.ping.options(max_task_retries=-1).remote(), timeout=timeout)
            ray.get(actor.load.remote(self.folders.get(s)), timeout=timeout)
        except actor_errors() as exc:
            raise shard_error(s, what, exc, self.max_restarts) from exc
        logger.warning(
            "shard %d was restarted by Ray and reloaded %s; %s retried",
            s,
            self.folders.get(s) or "nothing (no checkpoint yet)",
            what,
        )

    def refresh(
        self, allow: list[ShardAllowance | None], timeout: float | None = None, what: str = "a store call"
    ) -> list[dict]:
        """Fresh stats from every shard, pushing each its insert allowance ``allow[s]`` (None: keep)."""
        stats = self.call([(s, "stats", (allow[s],)) for s in range(len(self.actors))], what, timeout)
        for s, st in enumerate(stats):
            old = self.stats[s].get("incarnation")
            if old is not None and old != st["incarnation"]:
                logger.warning(
                    "shard %d was restarted from %s", s, st["restored_from"] or "nothing (no checkpoint)"
                )
        self.stats = stats
        return stats

    def totals(self) -> tuple[int, int]:
        """Inserts and deletes summed over the shards (as of the last stats)."""
        return sum(st["inserts"] for st in self.stats), sum(st["deletes"] for st in self.stats)

    def push_allowances(self, allow: list[ShardAllowance]) -> None:
        """Send every shard its insert allowance (fire and forget)."""
        for actor, a in zip(self.actors, allow, strict=True):
            actor.set_allow.remote(a)

    def kill(self, wait: float = KILL_WAIT) -> None:
        """Kill every actor for good (best effort: their data is gone) and wait until each is dead.

        ``ray.kill`` only asks Ray to kill: a call another process (a remote writer) makes just after
        it may still run on the live actor and store steps nobody can read. So each actor is pinged
        until Ray reports it dead, for at most ``wait`` seconds in all (then a debug log, no error).
        """
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                logger.debug("could not kill a shard actor: %s", exc)
        deadline = time.monotonic() + wait
        for s, a in enumerate(self.actors):
            while (left := deadline - time.monotonic()) > 0:
                try:
                    ray.get(a.ping.remote(), timeout=left)
                except actor_errors():
                    break  # dead: every later call on it fails
                except ray.exceptions.GetTimeoutError:
                    break
                time.sleep(KILL_POLL)  # alive still: the kill is on its way
            else:
                logger.debug("shard %d: not reported dead within %s of ray.kill", s, secs(wait))
