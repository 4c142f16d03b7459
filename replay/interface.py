"""ReplayStoreBase: the one interface both replay stores satisfy (local `replay.store.ReplayStore`, Ray's).

A learner written against it runs on either backend::

    def learn(store: ReplayStoreBase) -> None:
        with store:
            batch = store.sample(256, window=64)
            store.update_priorities(batch.keys, td_errors)

Follows DeepMind Reverb's table interface (sample, mutate priorities, insert through writers,
checkpoint) and TorchRL's ``ReplayBuffer`` (``sample``, ``update_priority``). See
docs/architecture.md#replay-composition.

Both stores take exactly these parameters (names, order, kinds, defaults: a test compares the
signatures); what one store adds is keyword-only and listed here:

- ``writer``: the Ray store's also takes ``shard`` (send every episode to one shard) and
  ``max_inflight`` (shipments in flight), keyword-only;
- ``restore``'s ``**kwargs``: the settings each store lets a restore change (the local store's
  ``tier``, ``timeout``, ``seed``, ``staging_slots``; the Ray store's also ``max_restarts`` and
  ``actor_options``).

`DEFAULT` is the default of every ``timeout`` parameter: the store's own ``timeout`` setting.

`ReplayLearnerBase` is what ``store.learner()`` returns on either backend (`replay.learner.StoreLearner`,
`replay.distributed.learner.RayLearner`): a picklable handle that samples, updates priorities and
reads stats from any process, as one of many learners of the store.
"""

from __future__ import annotations

import abc
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from graphrl.memory import MemoryManager
    from replay.rate_limiter import RateLimiter

__all__ = ["DEFAULT", "OwnerOnlyCalls", "ReplayLearnerBase", "ReplayStoreBase"]


class _Default:
    """The type of `DEFAULT` (one instance; its repr names it in signatures)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


class ReplayStoreBase(abc.ABC):
    """What a replay store offers a learner; a context manager whose exit calls `close`."""

    @abc.abstractmethod
    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Any:
        """Draw ``batch_size`` windows of ``window`` steps: a `replay.batch.Batch` (see
        `replay.store.ReplayStore.sample` for the parameters)."""

    @abc.abstractmethod
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys`` (``batch.keys``); return how many applied."""

    @abc.abstractmethod
    def writer(self, chunk_steps: int | None = None, timeout: float | None = DEFAULT) -> Any:
        """A new trajectory writer (one per thread or process)."""

    @abc.abstractmethod
    def checkpoint(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint under ``path`` atomically; return its folder."""

    @classmethod
    @abc.abstractmethod
    def restore(
        cls, path: str | os.PathLike[str], memory: MemoryManager | None = None,
        rate_limiter: RateLimiter | None = None, **kwargs: Any,
    ) -> ReplayStoreBase:
        """A new store holding the latest complete checkpoint under ``path``; ``memory`` for its
        buffers, ``rate_limiter`` the user's when the checkpoint's is a subclass
        (`replay.limiter_record.restored_limiter`), ``kwargs`` the settings to change."""

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


class ReplayLearnerBase(abc.ABC):
    """One of many learners of a store (``store.learner()``): picklable, usable in any process.

    Draws of all learners are draws of the store's one table; their samples count in its one rate
    limiter; a priority update from any is seen by the next draw of every other.
    """

    @abc.abstractmethod
    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Any:
        """A `replay.batch.Batch`, as `replay.store.ReplayStore.sample`."""

    @abc.abstractmethod
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys``; return how many applied."""

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """The store's stats, as `ReplayStoreBase.stats` (global counters)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release this process's resources of the learner (not the store's); idempotent."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Live steps stored."""

    def __enter__(self) -> ReplayLearnerBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OwnerOnlyCalls:
    """The calls a store attached by handle refuses: sampling, priority updates and checkpoints stay with
    the process that made the store (the selector's state lives there).

    A mixin of the write-only views (`replay.attach.AttachedStore`, `replay.distributed.RayAttachedStore`):
    each call raises ``ValueError`` naming it and ``owner_only_text``; a closed view says it is closed
    first (the subclass's ``_check_open``).
    """

    owner_only_text = (
        "runs in the store's owning process; this store was attached by handle and can only write "
        "(store.writer()) and count (len(store))"
    )

    def _check_open(self, call: str) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def owner_only(self, what: str) -> ValueError:
        """The error for ``what()`` called on this write-only view (raises first if it is closed)."""
        self._check_open(what)
        return ValueError(f"{what}() {self.owner_only_text}")

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """Raises ``ValueError``: only the owner samples."""
        raise self.owner_only("sample")

    def update_priorities(self, *args: Any, **kwargs: Any) -> int:
        """Raises ``ValueError``: only the owner updates priorities."""
        raise self.owner_only("update_priorities")

    def checkpoint(self, *args: Any, **kwargs: Any) -> str:
        """Raises ``ValueError``: only the owner checkpoints."""
        raise self.owner_only("checkpoint")

    def draw_windows(self, *args: Any, **kwargs: Any) -> Any:
        """Raises ``ValueError``: only the owner draws."""
        raise self.owner_only("draw_windows")

