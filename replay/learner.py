"""StoreLearner: one of many learner processes sampling one local replay store (torchrun ranks).

``store.learner()`` (`replay.store.ReplayStore.learner`) gives a small picklable `StoreLearner`; in
any process of the host (a torchrun rank, a spawned or forked worker, a late joiner) it samples,
updates priorities and reads stats of the owner's store::

    learner = store.learner()                       # rank 0 (the owner); broadcast it to the others
    batch = learner.sample(256, window=128, device=f"cuda:{local_rank}")
    learner.update_priorities(batch.keys, td_errors)

In its process a learner maps the store's regions (`replay.storage.TrajectoryStorage.attach`) and runs
the owner's own sampling loop, `replay.sampler.WindowSampler`, unchanged: its rate-limiter wait on the
control block's process-shared condition, its gather from the shared rings (lock-free, on the host or
a GPU), its stale check through the shards' generation counters and its own staging slots. Only the
draws and the priority updates go to the owner, through a `RemoteTable` (the protocol of
`replay.table.Table` that `WindowSampler` uses) connected to the owner's
`replay.table_service.TableService`. So every learner draws from the one table, every learner's
samples count in the one rate limiter, and ``max_times_sampled`` counts across learners.

Faults: a learner killed anywhere (waiting on the limiter, gathering, a request in flight) leaves no
lock held for the others: the control and shard mutexes are robust (`replay._sync`), the service holds
nothing between requests and a learner's staging slots are its own. A connection lost to the owner
(closed or gone) raises ``ValueError``.

References
----------
GEAR (Wang et al., ICML 2023): trainers sample shared trajectory memory; Reverb: many sampler clients
of one table (one rate limiter, one selector); TorchRL's replay buffers under DDP (pytorch/rl #1397).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrl.process_origin import ProcessOrigin, made_here
from replay._checks import (
    check_beta,
    check_device,
    check_gather_min_bytes,
    check_keys,
    check_sample_args,
    check_timeout,
)
from replay.interface import DEFAULT, ReplayLearnerBase
from replay.keys import encode_keys, issuer_applies, issuer_windows
from replay.owner_watch import owner_lost
from replay.rate_limiter import RateLimiterState
from replay.sampler import DEVICE_GATHER_MIN_BYTES, Deadline, WindowSampler
from replay.selectors import check_priorities
from replay.storage import StoreHandle, TrajectoryStorage
from replay.table import META_FIELDS

if TYPE_CHECKING:
    from replay.batch import Batch

__all__ = ["LearnerHandle", "RemoteTable", "StoreLearner"]


@dataclass(frozen=True)
class LearnerHandle:
    """What a learner process needs: the store's `StoreHandle`, the table service's socket and key.

    The ``authkey`` lets its holder sample the store: pass handles only to your own processes.
    """

    store: StoreHandle
    address: str
    authkey: bytes
    prioritized: bool
    staging_slots: int


class RemoteTable:
    """The owner's table seen from a learner process: the `replay.table.Table` calls that
    `replay.sampler.WindowSampler` makes (``draw``, ``keys``, ``prioritized``, ``incarnation``), sent
    to a `replay.table_service.TableService`, plus ``update_priorities`` and ``selector_mass``.

    Thread-safe (one request at a time on the connection).

    Raises
    ------
    ValueError
        On any call: the connection to the owner is lost (the store was closed, or its process ended).
    """

    def __init__(self, conn: Connection, prioritized: bool) -> None:
        self.conn = conn
        self.prioritized = prioritized
        self.lock = threading.Lock()
        hello = self.call("hello")
        self.incarnation = int(hello["incarnation"])
        self.max_times_sampled = int(hello["max_times_sampled"])
        self.store_id = int(hello["store_id"])  # the owner's: this learner's batches bear it
        self.fresh, self.stale = issuer_windows(self.store_id, tuple(int(i) for i in hello["lineage"]))
        self.priority_limit = float(hello["priority_limit"])  # the owner's (`replay.table.Table`)

    def call(self, op: str, *args: Any) -> Any:
        """Send one request and return its value (re-raising the owner's exception)."""
        with self.lock:
            try:
                self.conn.send((op, *args))
                status, value = self.conn.recv()
            except (EOFError, OSError) as exc:
                raise owner_lost(
                    "replay learner", None,
                    f"{op!r} failed ({exc!r}): the store was closed or its process ended",
                ) from exc
        if status == "error":
            raise value
        return value

    def draw(
        self, k: int, length: int, pad: str, row0: int, meta: dict[str, np.ndarray], prob: np.ndarray
    ) -> tuple[int, int, int]:
        """`replay.table.Table.draw` in the owner; its removals are already counted there (0 here)."""
        got, table_size, cols, p, incarnation = self.call("draw", k, length, pad)
        rows = slice(row0, row0 + got)
        for i, name in enumerate(META_FIELDS):
            meta[name][rows] = cols[i]
        prob[rows] = p
        self.incarnation = int(incarnation)
        return int(got), int(table_size), 0

    def keys(self, shard: np.ndarray, anchor: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The keys (int64 [B]) of windows, stamped with the owner's incarnation (as `Table.keys`)."""
        return encode_keys(shard, anchor, anchor - first, self.incarnation)

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """`replay.table.Table.update_priorities` in the owner: how many applied."""
        return int(self.call("update", np.asarray(keys), np.asarray(priorities)))

    def selector_mass(self) -> tuple[int, float]:
        """``(live items, priority mass)`` of the owner's table."""
        live, mass = self.call("mass")
        return int(live), float(mass)

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class _Attached:
    """A learner's per-process state: the mapped storage, the connection, the sampling loop; ``origin``:
    the process that made it, the only one that uses or closes it (a fork child remakes its own)."""

    def __init__(self, handle: LearnerHandle) -> None:
        self.origin = ProcessOrigin()
        self.storage = TrajectoryStorage.attach(handle.store)
        try:
            conn = Client(handle.address, family="AF_UNIX", authkey=handle.authkey)
        except (OSError, EOFError) as exc:
            self.storage.close()
            raise ValueError(
                f"replay learner: cannot reach the store's table service at {handle.address} ({exc!r}): "
                "the store was closed or its process ended"
            ) from exc
        control = self.storage.control
        owner = self.storage.owner  # a wait for the limiter ends when the owner's process has
        self.limiter = RateLimiterState(self.storage.limiter, control.counters, control.cond, owner)
        try:
            self.table = RemoteTable(conn, handle.prioritized)
            self.sampler = WindowSampler(self.storage, self.table, self.limiter, handle.staging_slots)
        except BaseException:
            conn.close()
            self.storage.close()
            raise

    def close(self) -> None:
        self.sampler.close()
        self.table.close()
        self.storage.close()


class StoreLearner(ReplayLearnerBase):
    """A learner's handle on a local `replay.store.ReplayStore`: sample, update priorities, stats.

    Made by ``store.learner()``. Picklable (it travels as its `LearnerHandle`: a few hundred bytes);
    it maps the store and connects to the owner on first use in each process (again after a fork).

    Parameters
    ----------
    handle : LearnerHandle

    Raises
    ------
    ValueError
        On any call once the store's owner closed it (``len`` and ``counters`` too), or is gone.
    FileNotFoundError
        On first use: the store's regions are gone.
    """

    def __init__(self, handle: LearnerHandle) -> None:
        self.handle = handle
        self._state: _Attached | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._gather_min_bytes = DEVICE_GATHER_MIN_BYTES

    @property
    def device_gather_min_bytes(self) -> int:
        """As `replay.store.ReplayStore.device_gather_min_bytes`, for this learner's GPU batches (not
        carried by pickling: each process starts at `replay.sampler.DEVICE_GATHER_MIN_BYTES`); settable.
        Raises ``ValueError`` on a negative or non-integer value."""
        return self._gather_min_bytes

    @device_gather_min_bytes.setter
    def device_gather_min_bytes(self, value: int) -> None:
        self._gather_min_bytes = check_gather_min_bytes(value)

    def __reduce__(self) -> tuple:
        return (StoreLearner, (self.handle,))

    def __repr__(self) -> str:
        h = self.handle.store
        fields = [f[0] for f in h.spec]
        return f"StoreLearner(shards={h.num_shards}, shard_capacity={h.capacity}, fields={fields})"

    def _attached(self, call: str) -> _Attached:
        if self._closed:
            raise ValueError(f"StoreLearner.{call}(): this learner is closed")
        with self._lock:
            if self._state is None or not made_here(self._state.origin):  # first use here, or a forked copy
                self._state = _Attached(self.handle)
            st = self._state
        if st.storage.control.closed:  # the mapping outlives the owner's close: never count freed regions
            raise ValueError(
                f"StoreLearner.{call}(): the store's owner closed the ReplayStore this learner samples"
            )
        return st

    @property
    def closed(self) -> bool:
        """Whether `close` ran here."""
        return self._closed

    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Batch:
        """Draw ``batch_size`` windows of ``window`` steps from the store's one table.

        Parameters, `replay.batch.Batch` and errors as `replay.store.ReplayStore.sample` (the draw runs
        in the owner, the gather here); also ``ValueError`` when the owner closed the store or is gone.
        """
        b, length = check_sample_args(batch_size, window, pad)
        beta = check_beta(beta)
        target = check_device(device)
        st = self._attached("sample")
        left = Deadline(st.storage.timeout if timeout is DEFAULT else check_timeout(timeout))
        st.sampler.device_gather_min_bytes = self._gather_min_bytes
        batch = st.sampler.sample(b, length, pad, beta, target, left)
        if target is None and device is not None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys`` in the owner's table; return how many
        applied (stale keys, whichever learner drew them, are ignored). Errors as
        `replay.store.ReplayStore.update_priorities`; nothing is changed on a bad argument."""
        st = self._attached("update_priorities")
        applies = issuer_applies(keys, st.table.fresh, st.table.stale, st.table.store_id)  # raises if foreign
        k = check_keys(keys)
        p = check_priorities(priorities, k.size, limit=st.table.priority_limit)  # the owner's, stale keys too
        return st.table.update_priorities(k, p) if applies else 0  # a stale issuer's keys: none apply

    def counters(self) -> dict[str, int]:
        """The store's rate-limiter counters (all learners' samples, all writers' inserts)."""
        return self._attached("counters").limiter.state()

    def stats(self) -> dict[str, Any]:
        """As `replay.store.ReplayStore.stats`: ``steps``, ``live``, ``priority_mass``, ``inserts``,
        ``samples``, ``deletes``, ``incarnation``."""
        st = self._attached("stats")
        live, mass = st.table.selector_mass()
        return {
            "steps": st.storage.live_steps(),
            "live": live,
            "priority_mass": mass,
            **st.limiter.state(),
            "incarnation": st.table.incarnation,
        }

    def __len__(self) -> int:
        """Live steps stored, over all shards."""
        return self._attached("__len__").storage.live_steps()

    def close(self) -> None:
        """Unmap the store and close the connection in this process; idempotent. The store and the
        other learners are not affected."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            st, self._state = self._state, None
        if st is not None and made_here(st.origin):
            st.close()
