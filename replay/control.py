"""Control: a replay store's control block: its mutex and condition, the writers' turnstile, the rate
limiter's counters, the global commit sequence, writers made, and per shard the steps assigned and the
episodes left open.

One region for the whole store (the shared tier by default, so that actor processes attach it by
name); `replay.storage.TrajectoryStorage` makes or maps it, and every commit takes its mutex twice
(admission and shard choice; counts and wake-up: the commit protocol of `replay.storage`), as does the
rate limiter's wait (`replay.rate_limiter.RateLimiterState` over ``counters`` and ``cond``).

The turnstile lets a checkpoint take the store from writers that commit back to back (a process-shared
mutex is not fair: a writer that unlocks and locks again wins over a waiter). `Control.hold_writers`
locks it and raises ``ctl[QUIESCE]`` in one call; a commit that finds ``QUIESCE`` raised at admission
(under the mutex) takes no lock and waits at the turnstile (`Control.pass_turnstile`) until
`Control.release_writers`. The turnstile is a robust mutex: if the holder dies, the next writer to
pass finds its holder dead, lowers ``QUIESCE`` and goes on.

>>> control = Control.create(memory, num_shards)
>>> with control.cond:
...     shard = control.choose_shard(writer_id)

References
----------
DeepMind Reverb: a table's rate limiter over insert and sample counts.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import numba as nb
import numpy as np

from graphrl.memory import MemoryManager, Region
from replay._sync import SLOT_BYTES, SharedCondition, SharedMutex
from replay.rate_limiter import CANCELLED, DELETES, INSERTS, SAMPLES
from replay.sync_kernels import mutex_lock_robust

__all__ = ["CTL_FIXED", "GSEQ", "QUIESCE", "WRITERS", "Control"]

logger = logging.getLogger(__name__)

# control fields (int64) after the rate limiter's four counters
GSEQ, WRITERS, QUIESCE = 4, 5, 6
CTL_FIXED = 8  # int64 words before the per-shard ``assigned`` and ``open``
_CTL_OFF = 3 * SLOT_BYTES  # the mutex, the condition, the turnstile


@nb.njit(cache=True, nogil=True)
def _close_turnstile(turnstile, ctl):  # pragma: no cover - numba
    """Lock the turnstile mutex at address ``turnstile`` and raise ``ctl[QUIESCE]``, in one call (no
    Python, so no wait for the GIL, between the two): 0, 1 when its holder had died, or -errno (not
    locked, nothing raised)."""
    rc = mutex_lock_robust(turnstile)
    if rc >= 0:
        ctl[QUIESCE] = 1
    return rc


class Control:
    """The store-wide control block: mutex and condition, rate-limiter counters, sequence, shard loads.

    Attributes
    ----------
    cond : SharedCondition
        Guards everything below; notified on every counter change.
    turnstile : SharedMutex
        Held by a checkpoint from before it takes the shard locks until it lets them go
        (`hold_writers`, `release_writers`); writers pass it while ``ctl[QUIESCE]`` is raised.
    counters : numpy.ndarray, int64 [4]
        The rate limiter's ``[inserts, samples, deletes, cancelled]``.
    ctl : numpy.ndarray, int64 [8 + 2 S]
        ``ctl[GSEQ]`` next global sequence number; ``ctl[WRITERS]`` writers ever made;
        ``ctl[QUIESCE]`` 1 while the turnstile's holder holds the writers (written by it alone);
        ``assigned`` (steps committed per shard, counted with the shard's lock held) and ``open``
        (open episodes per shard) follow.
    """

    def __init__(self, region: Region, num_shards: int, create: bool) -> None:
        self.region = region
        self.num_shards = num_shards
        raw = region.numpy()
        self.mutex = SharedMutex(raw[:SLOT_BYTES], create=create)
        self.cond = SharedCondition(raw[SLOT_BYTES : 2 * SLOT_BYTES], self.mutex, create=create)
        self.turnstile = SharedMutex(raw[2 * SLOT_BYTES : 3 * SLOT_BYTES], create=create)
        self.ctl = raw[_CTL_OFF : _CTL_OFF + 8 * (CTL_FIXED + 2 * num_shards)].view(np.int64)
        self.counters = self.ctl[:4]
        self.assigned = self.ctl[CTL_FIXED : CTL_FIXED + num_shards]
        self.open = self.ctl[CTL_FIXED + num_shards : CTL_FIXED + 2 * num_shards]
        if create:
            self.ctl[:] = 0

    def addresses(self) -> tuple[int, int, int]:
        """Addresses (in this process) of the mutex, the condition and the int64 words (``counters``
        first): the control words of a `replay.commit_kernel` plan.

        Returns
        -------
        (int, int, int)
            Byte addresses, valid while ``region`` is mapped in this process.
        """
        base = self.region.numpy().ctypes.data
        return base, base + SLOT_BYTES, base + _CTL_OFF

    @staticmethod
    def nbytes(num_shards: int) -> int:
        """Bytes of the control block of a store of ``num_shards`` shards (three sync slots, then
        ``CTL_FIXED + 2 * num_shards`` int64 words)."""
        return _CTL_OFF + 8 * (CTL_FIXED + 2 * num_shards)

    @classmethod
    def create(
        cls, memory: MemoryManager, num_shards: int, tier: str = "shared", fallback: tuple[str, ...] = ()
    ) -> Control:
        """Allocate and initialise a control block (counters zero, mutex and condition made).

        Parameters
        ----------
        memory : graphrl.memory.MemoryManager
            Where the region comes from.
        num_shards : int
            Shards of the store (one ``assigned`` and one ``open`` word each).
        tier : str
            The memory tier; ``"shared"`` lets other processes attach it by name.
        fallback : tuple of str
            Tiers to try, in order, when ``tier`` has no room.

        Returns
        -------
        Control

        Raises
        ------
        MemoryBudgetError
            No tier of ``tier`` and ``fallback`` has room (`graphrl.memory.MemoryManager.allocate`).
        """
        region = memory.allocate(
            (cls.nbytes(num_shards),), "uint8", tier, owner="replay.control", fallback=fallback
        )
        return cls(region, num_shards, create=True)

    def choose_shard(self, writer_id: int) -> int:
        """The shard for a new episode (mutex held): fewest open episodes, then fewest steps assigned."""
        s = self.num_shards
        if s == 1:
            return 0
        order = (np.arange(s) + writer_id) % s  # rotate ties between writers
        best = min(order, key=lambda i: (int(self.open[i]), int(self.assigned[i])))
        return int(best)

    def count_deletes(self, n: int) -> None:
        """Count ``n`` deleted items (the rate limiter's ``deletes``) and wake waiters; callers may hold
        a shard lock (the order is a shard lock, then this mutex)."""
        with self.cond:
            self.counters[DELETES] += int(n)
            self.cond.notify_all()

    # -- the writers' turnstile (lock order: turnstile, shard locks, this mutex)
    def hold_writers(self) -> None:
        """Lock the turnstile and raise ``ctl[QUIESCE]``: from their next admission on, writers wait at
        the turnstile (`pass_turnstile`) holding no lock, until `release_writers`. A writer's commit
        already admitted finishes. Call it holding no shard lock or this mutex.

        Raises
        ------
        OSError
            The lock call failed (nothing held).
        """
        rc = _close_turnstile(self.turnstile.pointer.value, self.ctl)
        if rc < 0:
            raise OSError(-rc, f"locking the writers' turnstile failed: {errno.errorcode.get(-rc, -rc)}")
        if rc == 1:
            self.turnstile.owner_died += 1
            logger.warning("a process died while holding a replay store's writers; recovering the turnstile")

    def release_writers(self) -> None:
        """Lower ``ctl[QUIESCE]`` and unlock the turnstile (after `hold_writers`, in the same thread)."""
        self.ctl[QUIESCE] = 0
        self.turnstile.release()

    @property
    def writers_held(self) -> bool:
        """Whether a checkpoint holds the writers (``ctl[QUIESCE]``; read without the mutex: a hint)."""
        return bool(self.ctl[QUIESCE])

    def pass_turnstile(self, timeout: float) -> bool:
        """Wait, holding no lock, until no checkpoint holds the writers: lock and unlock the turnstile.

        Parameters
        ----------
        timeout : float
            Seconds to wait at most.

        Returns
        -------
        bool
            Passed (False: the turnstile stayed held ``timeout`` seconds). A holder that died is
            recovered: ``ctl[QUIESCE]`` is lowered and the writer passes.
        """
        died = self.turnstile.acquire_within(timeout)
        if died is None:
            return False
        if died:
            self.ctl[QUIESCE] = 0  # its holder is gone, so nothing holds the writers
        self.turnstile.release()
        return True

    @property
    def closed(self) -> bool:
        """Whether the store was closed (the rate limiter's ``cancelled`` counter is set)."""
        return bool(self.counters[CANCELLED])

    def free(self) -> None:
        """Free the region (once; later calls do nothing)."""
        if not self.region.freed:
            self.region.free()

    # -- checkpoints (mutex held)
    def state_dict(self) -> dict[str, Any]:
        """Rate-limiter counters, the global sequence, writers made and steps assigned per shard."""
        return {
            "counters": {
                "inserts": int(self.counters[INSERTS]),
                "samples": int(self.counters[SAMPLES]),
                "deletes": int(self.counters[DELETES]),
            },
            "global_seq": int(self.ctl[GSEQ]),
            "writers": int(self.ctl[WRITERS]),
            "assigned": [int(x) for x in self.assigned],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back `state_dict`; no episode is open afterwards (the writers that held them are gone)."""
        with self.cond:
            c = state["counters"]
            self.counters[INSERTS], self.counters[SAMPLES], self.counters[DELETES] = (
                int(c["inserts"]),
                int(c["samples"]),
                int(c["deletes"]),
            )
            self.ctl[GSEQ] = int(state["global_seq"])
            self.ctl[WRITERS] = int(state["writers"])
            self.assigned[:] = state["assigned"]
            self.open[:] = 0
            self.cond.notify_all()
