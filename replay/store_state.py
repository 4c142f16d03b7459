"""What a local store's checkpoint holds: its configuration and every part's ``state_dict()``.

`snapshot` yields the state of a store's parts with the table, every shard and the control block
locked (`replay.table.Table.quiesced`); `load_parts` loads such a state into the parts of a new store
built from its ``config``. `replay.store.ReplayStore.checkpoint` hands the snapshot to
`replay.checkpoint.save`, and ``ReplayStore.restore`` reads it back with `replay.checkpoint.load`
(docs/architecture.md#checkpoints).

>>> ckpt.save(path, snapshot(store.storage, store.table, store.selector, store.rate_limiter, 0))
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from replay.limiter_record import limiter_record
from replay.rate_limiter import RateLimiter
from replay.selectors import Selector
from replay.storage import TrajectoryStorage
from replay.table import Table

__all__ = ["load_parts", "snapshot"]


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


def load_parts(storage: TrajectoryStorage, table: Table, state: dict[str, Any]) -> None:
    """Load a `snapshot`'s shards, table (a new incarnation, see `replay.keys`) and control block."""
    for sh, shard_state in zip(storage.shards, state["shards"], strict=True):
        sh.load_state_dict(shard_state)
    table.load_state_dict(state["table"])
    storage.control.load_state_dict(state["control"])
