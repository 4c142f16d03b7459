"""Errors of the Ray replay store: `ShardError` and how a failed shard call becomes one.

`ShardError` names the shard ("shard 3: ...") and the remedy; `shard_error` turns Ray's actor errors
into it, telling a store its owner closed (a flag the owner sets in Ray's cluster-wide key-value store,
`mark_closed`) from an actor that died. `AwaitingRestore` is what a restarted shard actor raises until
the client has it reload its checkpoint. See docs/architecture.md#errors.
"""

from __future__ import annotations

import logging

import ray

__all__ = [
    "AwaitingRestore",
    "ShardError",
    "actor_errors",
    "closed_by_owner",
    "mark_closed",
    "secs",
    "shard_error",
]

logger = logging.getLogger(__name__)

CLOSED_KEY = b"graphrl.replay.closed."  # + the store's id, in Ray's internal KV once its owner closed it


class ShardError(RuntimeError):
    """A shard's Ray actor died (or could not be reached); the message names the shard ("shard 3")."""


class AwaitingRestore(RuntimeError):
    """Raised by a restarted shard actor until the client has it reload its last checkpoint."""


def secs(x: float | None) -> str:
    """Seconds for messages, rounded to ms ("2 s", "0.25 s", "no limit")."""
    return "no limit" if x is None else f"{round(float(x), 3):g} s"


def actor_errors() -> tuple[type[BaseException], ...]:
    """Ray's exceptions for a call that met a dead, restarting or unreachable actor."""
    errs: list[type[BaseException]] = [ray.exceptions.RayActorError]
    unavailable = getattr(ray.exceptions, "ActorUnavailableError", None)
    if unavailable is not None:
        errs.append(unavailable)
    return tuple(errs)


# Ray's public API has no cluster-wide key-value store (ray.util and ray.experimental expose none; Ray's
# own libraries use ray.experimental.internal_kv, whose functions are all underscore names). The flag
# must outlive the killed actors and be readable from any node, so these two calls are the exception.


def mark_closed(store_id: str) -> None:
    """Record in Ray's internal KV that the store's owner closed it (read by `closed_by_owner`)."""
    try:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(CLOSED_KEY + store_id.encode(), b"1")
    except Exception as exc:  # noqa: BLE001 - only a message detail
        logger.debug("could not set the closed flag: %s", exc)


def closed_by_owner(store_id: str) -> bool:
    """Whether the store's owner closed it (the flag `mark_closed` set)."""
    if not store_id:
        return False
    try:
        from ray.experimental import internal_kv

        return bool(internal_kv._internal_kv_exists(CLOSED_KEY + store_id.encode()))
    except Exception as exc:  # noqa: BLE001 - a message detail: never hide the real error behind this
        logger.debug("could not read the closed flag: %s", exc)
        return False


def shard_error(s: int, what: str, exc: BaseException, restarts: int, store_id: str = "") -> ShardError:
    """The `ShardError` for shard ``s``'s failed ``what`` (Ray's ``exc``), with the remedy."""
    if closed_by_owner(store_id):
        return ShardError(
            f"shard {s}: the store was closed by its owner (RayReplayStore.close()), so {what} was not "
            "stored; write to a store that is open"
        )
    remedy = (
        "it was not restarted (max_restarts=0): restore the store from a checkpoint "
        "(RayReplayStore.restore(path)) or make it with max_restarts >= 1"
        if restarts == 0
        else f"Ray gave up restarting it (max_restarts={restarts})"
    )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ShardError(f"shard {s}: its Ray actor died or is unreachable during {what} ({first}); {remedy}")
