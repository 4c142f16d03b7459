"""The Ray replay store's own arguments (what the local store does not take), checked before any actor starts.

`check_ray_args` validates ``max_restarts``, ``actor_options`` and ``prefetch`` and that Ray runs;
`check_shard_selector` rejects selectors that do not split over shards. The arguments both stores take
are checked by `replay._checks.check_store_args`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray

from replay._checks import MAX_INT64, check_int
from replay.selectors import Fifo, Lifo, MinHeap, Selector

__all__ = ["check_ray_args", "check_shard_selector"]


def check_shard_selector(selector: Selector, num_shards: int) -> None:
    """Raise ValueError for a selector whose draws no per-shard split makes equal to one table's.

    Uniform and Prioritized split exactly (a window's probability is ``P(shard) * P(window | shard)``);
    Fifo, Lifo and the heaps order items across the whole table, so they need ``num_shards=1``.
    """
    if isinstance(selector, (Fifo, Lifo, MinHeap)) and num_shards > 1:
        raise ValueError(
            f"selector={selector!r} with num_shards={num_shards}: Fifo, Lifo and the heaps have no "
            "per-shard split that equals one table; use num_shards=1 with RayReplayStore, or "
            "Uniform / Prioritized"
        )


def check_ray_args(
    max_restarts: Any, actor_options: Mapping[str, Any] | None, prefetch: Any
) -> tuple[int, dict[str, Any], int]:
    """``(max_restarts, ray.remote options of the shard actors, prefetch)``, checked.

    Raises
    ------
    ValueError
        ``max_restarts < -1``, ``prefetch`` not 0 or 1, restart options in ``actor_options``, or Ray
        not initialised (``ray.init()``).
    TypeError
        A non-int ``max_restarts`` or ``prefetch``, ``actor_options`` not a mapping.
    """
    max_restarts = check_int("max_restarts", max_restarts, -1, MAX_INT64)
    prefetch = check_int("prefetch", prefetch, 0, 1)
    options: dict[str, Any] = {"max_concurrency": 32}
    if actor_options is not None:
        if not isinstance(actor_options, Mapping):
            raise TypeError(
                f"actor_options must be a dict of ray.remote options, got {type(actor_options).__name__}"
            )
        bad = [k for k in actor_options if k in ("max_restarts", "max_task_retries")]
        if bad:
            raise ValueError(f"actor_options: set {bad[0]!r} with the max_restarts argument, not here")
        options.update(actor_options)
    if not ray.is_initialized():
        raise ValueError(
            "RayReplayStore needs a running Ray: call ray.init() (a local cluster) or "
            "ray.init(address='auto') (join a cluster) before making the store"
        )
    return max_restarts, options, prefetch
