"""What a local store's checkpoint holds: its configuration and every part's ``state_dict()``.

`snapshot` yields the state of a store's parts with the table, every shard and the control block
locked (`replay.table.Table.quiesced`); `restore_arguments` reads its ``config`` back into the
arguments of a new store (`RESTORE_KEYWORDS`: the ones a restore may change), and `load_parts` loads
the state into that store's parts. `replay.store.ReplayStore.checkpoint` hands the snapshot to
`replay.checkpoint.save`, and ``ReplayStore.restore`` reads it back with `replay.checkpoint.load`
(docs/architecture.md#checkpoints).

>>> ckpt.save(path, snapshot(store.storage, store.table, store.selector, store.rate_limiter, 0))
>>> args, kwargs = restore_arguments(ckpt.load(path), {"seed": 1}, None)   # ReplayStore(*args, **kwargs)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from replay.limiter_record import limiter_record, restored_limiter
from replay.rate_limiter import RateLimiter
from replay.selectors import Selector, selector_from_config
from replay.spec import TrajectorySpec
from replay.storage import TrajectoryStorage
from replay.table import Table

__all__ = ["RESTORE_KEYWORDS", "load_parts", "restore_arguments", "snapshot"]

# the `ReplayStore` keywords a restore may change; the others are fixed by the checkpoint's config
RESTORE_KEYWORDS = ("tier", "timeout", "seed", "staging_slots", "chunk_steps", "max_times_sampled")


@contextmanager
def snapshot(
    storage: TrajectoryStorage,
    table: Table,
    selector: Selector,
    rate_limiter: RateLimiter,
    max_times_sampled: int,
) -> Iterator[dict[str, Any]]:
    """The state of every part (``config``, ``control``, ``shards``, ``table``), all of them locked.

    The rate limiter is recorded by `replay.limiter_record.limiter_record`: its settings, and a
    subclass's class name (``restore`` then needs the user's limiter)."""
    with table.quiesced():
        yield {
            "config": {
                "spec": storage.spec.to_config(),
                "capacity": storage.capacity,
                "num_shards": storage.num_shards,
                "selector": selector.to_config(),
                "rate_limiter": limiter_record(rate_limiter),
                "max_times_sampled": max_times_sampled,
                "chunk_steps": storage.chunk_steps,
                "timeout": storage.timeout,
            },
            "control": storage.control.state_dict(),
            "shards": [sh.state_dict() for sh in storage.shards],
            "table": table.state_dict(),
        }


def restore_arguments(
    state: dict[str, Any], changes: dict[str, Any], rate_limiter: RateLimiter | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`replay.store.ReplayStore`'s positional and keyword arguments from a `snapshot`'s ``config``.

    ``changes`` (keywords of `RESTORE_KEYWORDS`, checked by the caller) override the checkpoint's
    ``max_times_sampled``, ``chunk_steps`` and ``timeout``. With ``seed`` among them, the table's
    generator state is dropped from ``state`` (``state["table"]["rng"] = None``: draws start from the
    seed); else the checkpoint's sample stream goes on. The rate limiter: a built-in one rebuilt from
    the recorded settings, or ``rate_limiter`` checked against them
    (`replay.limiter_record.restored_limiter`). ``memory`` is not among the keywords returned.

    Raises
    ------
    ValueError
        A subclass's limiter recorded and ``rate_limiter`` not given, or not of its class and settings.
    """
    cfg = state["config"]
    kwargs: dict[str, Any] = {
        "max_times_sampled": int(cfg["max_times_sampled"]),
        "chunk_steps": int(cfg["chunk_steps"]),
        "timeout": cfg["timeout"],
    }
    kwargs.update(changes)
    args = (
        TrajectorySpec.from_config(cfg["spec"]),
        int(cfg["capacity"]) * int(cfg["num_shards"]),
        int(cfg["num_shards"]),
    )
    kwargs["selector"] = selector_from_config(cfg["selector"])
    kwargs["rate_limiter"] = restored_limiter(cfg["rate_limiter"], rate_limiter, "ReplayStore.restore")
    if "seed" in changes:
        state["table"]["rng"] = None  # None: the seed's
    return args, kwargs


def load_parts(storage: TrajectoryStorage, table: Table, state: dict[str, Any]) -> None:
    """Load a `snapshot`'s shards, table (a new incarnation, see `replay.keys`) and control block."""
    for sh, shard_state in zip(storage.shards, state["shards"], strict=True):
        sh.load_state_dict(shard_state)
    table.load_state_dict(state["table"])
    storage.control.load_state_dict(state["control"])
