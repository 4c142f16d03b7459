"""The Ray replay store's own arguments (what the local store does not take), checked before any actor starts.

`check_ray_args` validates ``max_restarts``, ``actor_options`` and ``prefetch`` and that Ray runs; the
arguments both stores take are checked by the local store's checks. `DEFAULT` marks an argument left
to the store's setting (``timeout``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import ray

__all__ = ["DEFAULT", "SHARD_TIERS", "check_int", "check_ray_args"]

DEFAULT: Any = object()
SHARD_TIERS = ("shared", "host", "pinned")


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {value}")
    return int(value)


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
    max_restarts = check_int("max_restarts", max_restarts, -1)
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
            "backend='ray' needs a running Ray: call ray.init() (a local cluster) or "
            "ray.init(address='auto') (join a cluster) before making the store"
        )
    return max_restarts, options, prefetch
