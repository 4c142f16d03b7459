"""BatchAssembler: a `replay.batch.Batch` built from shards' replies in the Ray client's staging slots.

The slots are the local store's (`replay.batch_staging.BatchStaging`: one pool per batch shape, a few
shapes at a time, the slot released last handed out first). Each shard reply names its windows (keys,
probabilities, lengths, offsets) and the object-store refs of the ring runs that hold them
(`replay.distributed.transport`). `BatchAssembler.assemble` maps the runs zero-copy (``ray.get``),
copies every reply into its rows of one pinned staging slot (two replies at once in two threads: the
copy kernels release the GIL; codec fields are decompressed there), then builds the same `Batch` the
local store returns: keys carry the shard, probabilities are ``P(shard) * P(window | shard)`` and the
importance weights are the local store's (`replay.batch.importance_weights`) over the global table size
(Schaul et al., "Prioritized Experience Replay", 2016).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray
import torch

from graphrl import kernels
from graphrl.memory import MemoryManager
from replay.batch import Batch, importance_weights
from replay.batch_staging import BatchStaging
from replay.chunk_decode import free_zstd_context, new_zstd_context
from replay.distributed.errors import actor_errors, secs, shard_error
from replay.distributed.transport import place
from replay.spec import TrajectorySpec

__all__ = ["BatchAssembler"]


class BatchAssembler:
    """Staging slots (`replay.batch_staging.BatchStaging`, host) and the copy of replies into them.

    Parameters
    ----------
    spec : TrajectorySpec
        The store's spec.
    memory : MemoryManager
        Where the staging slots come from (tier ``pinned`` falling back to ``host``, owner
        ``replay.staging``).
    slots : int
        Batches of one shape that may be held at once.
    timeout : float or None
        Seconds a new pool's allocation may wait.
    prioritized : bool
        Importance weights from the probabilities (else all ones).
    max_restarts : int
        For the message of a shard whose runs could not be read.
    """

    def __init__(
        self,
        spec: TrajectorySpec,
        memory: MemoryManager,
        slots: int,
        timeout: float | None,
        prioritized: bool,
        max_restarts: int,
    ) -> None:
        self.spec = spec
        self.staging = BatchStaging(spec, memory, slots, timeout)
        self.prioritized = prioritized
        self.max_restarts = max_restarts
        self.row_bytes = np.array([f.row_bytes for f in spec.values()], dtype=np.int64)
        self._copy_pool: ThreadPoolExecutor | None = None
        self._zstd = any(f.codec == "zstd" for f in spec.values())
        self._local = threading.local()  # a zstd decompression context per copying thread
        self._contexts: list[int] = []
        self._lock = threading.Lock()

    def _dctx(self) -> int:
        """This thread's zstd decompression context (0 when no field is zstd)."""
        if not self._zstd:
            return 0
        ctx = getattr(self._local, "dctx", None)
        if ctx is None:
            ctx = self._local.dctx = new_zstd_context()
            with self._lock:
                self._contexts.append(ctx)
        return ctx

    def _copier(self) -> ThreadPoolExecutor:
        if self._copy_pool is None:
            self._copy_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="replay-copy")
        return self._copy_pool

    def assemble(
        self,
        pending: dict,
        replies: list,
        beta: float,
        left: float | None,
    ) -> tuple[Batch, float]:
        """Map the shards' runs (zero-copy ``ray.get``) and copy the windows into a staging slot (replies
        in parallel threads); return the Batch and the seconds ``ray.get`` took.

        ``pending``: the draw (``key`` (B, L, pad), ``calls`` (shard, method, args) per reply, ``share``
        [S] of each shard, ``table_size``); ``left``: seconds left of the caller's deadline.

        Raises
        ------
        ShardError
            A shard's runs could not be read (its actor died).
        TimeoutError
            The runs were not readable, or no staging slot was free, within ``left``.
        """
        b, length, _ = pending["key"]
        slot = self.staging.acquire(b, length, None, left)
        buf = slot.buffer
        try:
            outs = slot.flat
            mask_np = slot.mask_flat.reshape(b, length)
            keys = np.empty(b, np.int64)
            prob = np.empty(b, np.float64)
            lengths = np.empty(b, np.int64)
            get_s = 0.0
            jobs = []
            row = 0
            for (s, _, _), rep in zip(pending["calls"], replies, strict=True):
                c = len(rep["keys"])
                rows = slice(row, row + c)
                keys[rows] = rep["keys"] | s
                prob[rows] = rep["prob"] * pending["share"][s]
                lengths[rows] = rep["n"]
                t0 = time.perf_counter()
                try:  # views of the object store (same node), no copy
                    pieces = ray.get([part[0] for part in rep["parts"]], timeout=left)
                except (*actor_errors(), ray.exceptions.ObjectLostError) as exc:
                    raise shard_error(s, "sample() (reading its windows)", exc, self.max_restarts) from exc
                except ray.exceptions.GetTimeoutError as exc:
                    raise TimeoutError(
                        f"sample(): shard {s}'s windows were not readable within {secs(left)}"
                    ) from exc
                get_s += time.perf_counter() - t0
                jobs.append((rep, pieces, row))
                row += c
            stream = b * length * int(self.row_bytes.sum()) >= kernels.STREAM_THRESHOLD

            def copy(job: tuple[dict, list, int]) -> None:
                rep, pieces, row0 = job
                place(rep, pieces, outs, mask_np, self.row_bytes, row0, length, stream, self._dctx())

            if len(jobs) > 1:  # the kernels release the GIL: two threads copy two replies at once
                list(self._copier().map(copy, jobs))
            else:
                copy(jobs[0])
            del jobs
            table_size = pending["table_size"]
            weights = (
                importance_weights(prob, table_size, beta)
                if self.prioritized
                else torch.ones(b, dtype=torch.float32)
            )
            return Batch(
                slot.fields,
                slot.mask,
                torch.from_numpy(keys),
                torch.from_numpy(prob),
                weights,
                torch.from_numpy(lengths),
                table_size,
                buf,
            ), get_s
        except BaseException:
            buf.release()
            raise

    def close(self) -> None:
        """Wait for the copy threads and close the staging pools (batches still held keep their memory)."""
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=True)
            self._copy_pool = None
        self.staging.close()
        with self._lock:
            for ctx in self._contexts:
                free_zstd_context(ctx)
            self._contexts.clear()
        self._local = threading.local()
