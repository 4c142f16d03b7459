"""ReplayStoreBase: the one interface both replay stores satisfy (local `replay.store.ReplayStore`, Ray's).

A learner written against it runs on either backend::

    def learn(store: ReplayStoreBase) -> None:
        with store:
            batch = store.sample(256, window=64)
            store.update_priorities(batch.keys, td_errors)

Follows DeepMind Reverb's table interface (sample, mutate priorities, insert through writers,
checkpoint) and TorchRL's ``ReplayBuffer`` (``sample``, ``update_priority``). See
docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import abc
import os
from typing import Any

__all__ = ["ReplayStoreBase"]


class ReplayStoreBase(abc.ABC):
    """What a replay store offers a learner; a context manager whose exit calls `close`."""

    @abc.abstractmethod
    def sample(self, batch_size: int, window: int = 1, *args: Any, **kwargs: Any) -> Any:
        """Draw ``batch_size`` windows of ``window`` steps: a `replay.batch.Batch`."""

    @abc.abstractmethod
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys`` (``batch.keys``); return how many applied."""

    @abc.abstractmethod
    def writer(self, *args: Any, **kwargs: Any) -> Any:
        """A new trajectory writer (one per thread or process)."""

    @abc.abstractmethod
    def checkpoint(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint under ``path`` atomically; return its folder."""

    @classmethod
    @abc.abstractmethod
    def restore(cls, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> ReplayStoreBase:
        """A new store holding the latest complete checkpoint under ``path``."""

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """A snapshot dict: at least ``steps``, ``live``, ``priority_mass``, ``inserts``, ``samples``,
        ``deletes`` (see `replay.store.ReplayStore.stats`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every resource; idempotent. Waiters wake and raise ``ValueError``."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Live steps stored."""

    def __enter__(self) -> ReplayStoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
