"""Rate limiters with an insert rule of their own (a ``can_insert`` override of `replay.MinSize`, whose own
admits every insert), for the tests of headroom and admission (local, routed and Ray stores), and a filler
that says when a store refuses. Imported as ``from _limiters import Cap, CapAboveSamples`` (``tests/`` holds
the root conftest, so pytest puts it on ``sys.path``); a Ray test registers this module with
``ray.cloudpickle.register_pickle_by_value`` so the shards and clients get the classes by value."""

from __future__ import annotations

import numpy as np

from replay import MinSize, ReplayStore


class Cap(MinSize):
    """At most ``cap`` steps ever inserted: an insert rule of its own (no samples move it)."""

    def __init__(self, cap: int) -> None:
        super().__init__(1)
        self.cap = cap

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= self.cap


class CapAboveSamples(MinSize):
    """Inserts at most ``cap`` steps ahead of samples: an admission rule of its own."""

    def __init__(self, cap: int) -> None:
        super().__init__(1)
        self.cap = cap

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= self.cap + int(counts[1])


def fill_until_refused(store: ReplayStore, steps: int, wait_s: float) -> str | None:
    """Episodes of one step (``{"id": [k]}``, k = 0, 1, ...) into ``store``, at most ``steps``, until one is
    refused (no room within ``wait_s`` seconds): that TimeoutError's message (None if all were admitted)."""
    for k in range(steps):
        w = store.writer(timeout=wait_s)
        w.extend({"id": np.array([k])})
        try:
            w.end_episode()
            w.close()
        except TimeoutError as exc:
            return str(exc)
    return None
