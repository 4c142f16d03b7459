"""One shard of the Ray replay store: a local one-shard `replay.store.ReplayStore` in a threaded Ray actor.

`ShardActor` owns its store's rings, selector and episode index and runs that store's own writer,
sampling, priority and checkpoint code; the client (`replay.distributed.client.RayReplayStore`) makes
it with ``ray.remote(ShardActor)`` and holds no step data. Writers ship numpy columns to `insert`
(admitted under the insert allowance the client pushes); `sample` draws windows with the local
selector (`replay.store.ReplayStore.draw_windows`) and puts the ring runs that hold them into Ray's
object store (`replay.distributed.transport`); a field with a codec is stored compressed
(`replay.chunk_codec.ChunkRing`, compressed here at insert) and travels compressed: the shard puts the
chunks its windows read, and the learner decompresses them (`replay.distributed.chunk_transport`).
`checkpoint` writes the local store's checkpoint.
When Ray restarts the actor (``max_restarts``) it starts empty and awaits the client's `load` of its
last checkpoint. See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
import uuid
from collections import deque
from typing import Any

import numpy as np
import ray

from graphrl.memory import MemoryBudgetError
from replay.distributed.chunk_transport import CODEC_KINDS, gather_chunks, pack_field
from replay.distributed.errors import AwaitingRestore, secs
from replay.distributed.routing import ShardAllowance, allowance_steps, explained_headroom
from replay.distributed.transport import concat_tables, ring_runs
from replay.rate_limiter import MinSize, rate_limiter_from_config
from replay.selectors import selector_from_config
from replay.spec import TrajectorySpec
from replay.storage import Episode
from replay.store import ReplayStore

__all__ = ["DRAW_CHUNK", "ShardActor"]

logger = logging.getLogger(__name__)

SHARD_SLOTS = 1  # staging slots of a shard's local store (it never gathers: see ShardActor.sample)
DRAW_CHUNK = 65536  # a shard draws (and puts) at most this many windows at a time, checking the deadline


def reconstructed() -> bool:
    """Whether this process is a Ray actor that Ray restarted (False outside an actor, e.g. in tests)."""
    ctx = ray.get_runtime_context()
    return ctx.get_actor_id() is not None and bool(ctx.was_current_actor_reconstructed)


class ShardActor:
    """One shard: a local one-shard `ReplayStore` inside a threaded Ray actor.

    Parameters
    ----------
    index : int
        The shard's index in the store (for messages and keys).
    config : dict
        spec, capacity (steps of this shard), selector, rate_limiter (the user's, its config),
        insert_headroom (its `replay.rate_limiter.RateLimiter.insert_headroom` of the counts
        insert_counts, optional, default (0, 0, 0): the insert allowance until the client pushes one),
        insert_why (optional: the limiter's explanation past that headroom,
        `replay.distributed.routing.explained_headroom`, computed by the client), limiter (optional: a
        limiter object explaining allowances pushed without their explanation, as in tests; default
        the built-in that rate_limiter describes; the client sends none), num_shards,
        max_times_sampled, seed, chunk_steps, tier, timeout, staging_slots;
        reseed (optional): a restore draws from ``seed``, not from the checkpoint's generator state.
    restore_from : str, optional
        A local checkpoint root to start from (`replay.distributed.RayReplayStore.restore`).

    When Ray restarts the actor (``max_restarts``), it starts empty and *awaiting restore*: inserts
    wait and other calls raise `AwaitingRestore` until the client calls `load`.
    """

    def __init__(self, index: int, config: dict, restore_from: str | None) -> None:
        self.index = index
        self.incarnation = uuid.uuid4().hex
        # explains an allowance pushed without its explanation (`explain_allowance`)
        limiter = config.get("limiter")
        self.limiter = rate_limiter_from_config(config["rate_limiter"]) if limiter is None else limiter
        i, s, d = config.get("insert_counts", (0, 0, 0))
        # the allowance until the client pushes one (and again after a reload): config time's
        self.first_allow = ShardAllowance(
            0.0, (int(i), int(s), int(d)), float(config["insert_headroom"]), config.get("insert_why")
        )
        self.num_shards = int(config["num_shards"])
        self.chunk_steps = int(config["chunk_steps"])
        folder = restore_from
        self.awaiting = restore_from is None and reconstructed()
        self.restored_from = folder
        kwargs = {
            "tier": config["tier"],
            "timeout": config["timeout"],
            "staging_slots": SHARD_SLOTS,
            "seed": config["seed"],
        }
        # a restore continues the checkpoint's sample stream unless the user gave a new seed
        self.kwargs = kwargs if config.get("reseed") else {k: v for k, v in kwargs.items() if k != "seed"}
        if folder is not None:
            self.store = ReplayStore.restore(folder, **self.kwargs)
        else:
            self.store = ReplayStore(
                TrajectorySpec.from_config(config["spec"]),
                int(config["capacity"]),
                1,
                selector=selector_from_config(config["selector"]),
                rate_limiter=MinSize(1),
                max_times_sampled=int(config["max_times_sampled"]),
                chunk_steps=self.chunk_steps,
                **kwargs,
            )
        self.spec = self.store.spec
        if folder is not None and self.spec != TrajectorySpec.from_config(config["spec"]):
            self.store.close()  # rows laid out in another field order would be read as garbage
            raise ValueError(
                f"shard {index}: its checkpoint {folder} holds fields {self.spec!r}, the store asked for "
                f"{TrajectorySpec.from_config(config['spec'])!r} (a manifest without its 'fields' order)"
            )
        self.cond = threading.Condition()
        self.allowance = self._first_allowance()
        self.paused = False
        self.active = 0
        self.woken: deque[str] = deque(maxlen=1024)
        self.open: dict[int, Any] = {}
        self.idle: list[Any] = []
        self.before_put: Any = None  # tests: called with the drawn WindowTable before its bytes are put
        self.writers = 0  # writers made so far (shard 0's count spreads new writers' first episodes)
        if folder is not None:
            logger.info("shard %d restored from %s", index, folder)

    # -- state
    def load(self, folder: str | None) -> None:
        """After a restart: reload the shard from ``folder`` (its last checkpoint; None: stay empty)."""
        with self.cond:
            if not self.awaiting:
                return
            if folder is not None:
                old = self.store
                self.store = ReplayStore.restore(folder, **self.kwargs)
                old.close()
                self.allowance = self._first_allowance()  # steps, counts and explanation together
            self.restored_from = folder
            self.awaiting = False
            self.cond.notify_all()
        logger.warning("shard %d restarted; reloaded %s", self.index, folder or "nothing (no checkpoint yet)")

    def _first_allowance(self) -> ShardAllowance:
        """The config-time allowance (its counts, headroom and explanation) over this store's inserts."""
        first = self.first_allow
        steps = allowance_steps(self.store.counters()["inserts"], first.headroom, self.num_shards, self.index)
        return ShardAllowance(steps, first.counts, first.headroom, first.why)

    def _ready(self) -> None:
        if self.awaiting:
            raise AwaitingRestore(f"shard {self.index} was restarted and awaits its checkpoint")

    def _counts(self) -> tuple[int, int]:
        c = self.store.counters()
        return c["inserts"], c["deletes"]

    def stats(self, allow: ShardAllowance | None = None) -> dict:
        """Live count, priority mass (Prioritized), counters; sets the insert allowance if given."""
        if allow is not None:
            self.set_allow(allow)
        live, wmass = self.store.selector_mass()
        inserts, deletes = self._counts()
        return {
            "live": live,
            "wmass": wmass,
            "inserts": inserts,
            "deletes": deletes,
            "steps": len(self.store),
            "incarnation": self.incarnation,
            "restored_from": self.restored_from,
            "awaiting": self.awaiting,
        }

    def set_allow(self, allow: ShardAllowance) -> None:
        """Take the insert allowance the client pushes (and the counts it comes from, for messages)."""
        with self.cond:
            self.allowance = allow
            self.cond.notify_all()

    def wait_inserts(self, known: int, token: str, timeout: float | None) -> int:
        """Return the insert count once it differs from ``known``, on `wake`, or after ``timeout``."""
        with self.cond:
            self.cond.wait_for(
                lambda: self.store.counters()["inserts"] != known or token in self.woken, timeout
            )
            return self.store.counters()["inserts"]

    def wake(self, token: str) -> None:
        with self.cond:
            self.woken.append(token)
            self.cond.notify_all()

    # -- writing
    def explain_allowance(self, inserts: int) -> str:
        """Why a shipment waits for its allowance: the allowance's share of the rate limiter's headroom,
        then the limiter's own explanation (`replay.rate_limiter.RateLimiter.explain_insert_block`, as
        the local store's ``TimeoutError`` gives it) at the counts one step past that headroom: all from
        the one `ShardAllowance` record the shard admits by (its headroom and explanation as the client's
        limiter computed them; the shard's limiter explains one pushed without them)."""
        allow = self.allowance
        i, s, d = allow.counts
        if allow.headroom is None or allow.why is None:
            headroom, why = explained_headroom(self.limiter, allow.counts)
        else:
            headroom, why = allow.headroom, allow.why
        return (
            f"this shard holds {inserts} inserted steps and its allowance is {allow.steps:.6g}: its share, "
            f"over {self.num_shards} shards, of the {headroom:.6g} steps the rate limiter admits at the "
            f"store's counts when the client set it (inserts={i}, samples={s}, deletes={d}), past which "
            f"{why}"
        )

    def insert(self, key: int, columns: dict, end: bool, timeout: float | None, first: bool = True) -> tuple:
        """Append ``columns`` ([T, ...] numpy arrays) to the episode ``key``; end it if ``end``.

        ``first``: this is the episode's first shipment. A later shipment of an episode this actor does
        not hold open (Ray restarted it since the earlier ones: they are lost) is stored as a separate
        record flagged ``continuation`` (as the local store flags a segment whose earlier part is a
        separate record: windows never reach back past its start), never as a whole episode.

        Returns
        -------
        tuple
            (steps stored, whether the episode's earlier part was lost).
        """
        start = time.monotonic()
        with self.cond:
            ok = self.cond.wait_for(
                lambda: (
                    not self.paused
                    and not self.awaiting
                    and self.store.counters()["inserts"] < self.allowance.steps
                ),
                timeout,
            )
            if not ok:
                inserts = self.store.counters()["inserts"]
                raise TimeoutError(
                    f"shard {self.index}: insert waited {secs(time.monotonic() - start)} "
                    f"(timeout={secs(timeout)}): "
                    + (
                        "a checkpoint is being written"
                        if self.paused
                        else "the shard was restarted and waits for the store's client to reload it"
                        if self.awaiting
                        else self.explain_allowance(inserts)
                    )
                    + "; nothing of this shipment was stored"
                )
            self.active += 1
            w = self.open.pop(key, None)
            lost = w is None and not first
            if w is None:
                w = self.idle.pop() if self.idle else None
        try:
            if w is None:
                w = self.store.writer(chunk_steps=self.chunk_steps)
            if lost:  # the local store starts a continuation record (windows stop at its start)
                w.begin_continuation()
            w.extend(columns)
            if end:
                w.end_episode()
            else:
                w.flush()
            n = len(next(iter(columns.values())))
        except MemoryBudgetError as exc:  # a codec field's arena is full: name this shard first
            w.close()
            if not exc.lead:
                raise
            raise MemoryBudgetError(
                exc.tier, exc.owner, exc.asked, exc.free, exc.budget, exc.attempts, exc.note,
                f"shard {self.index} of the RayReplayStore: {exc.lead}",
            ) from exc
        except BaseException:
            w.close()
            raise
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()
        w.release_thread()  # pooled: the next insert may run in another of the actor's threads
        with self.cond:
            if end:
                self.idle.append(w)
            else:
                self.open[key] = w
        return n, lost

    def pause(self, timeout: float | None) -> None:
        with self.cond:
            self.paused = True
            if not self.cond.wait_for(lambda: self.active == 0, timeout):
                self.paused = False
                self.cond.notify_all()
                raise TimeoutError(f"shard {self.index}: shipments still running after {secs(timeout)}")

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    # -- sampling
    def sample(
        self, k: int, window: int, pad: str, timeout: float | None, allow: ShardAllowance | None
    ) -> dict:
        """Draw ``k`` windows and put their ring bytes into Ray's object store; return the window table.

        The local store draws the windows (`replay.store.ReplayStore.draw_windows`: its selector,
        probabilities and keys); their runs of ring slots, merged where windows overlap or touch, go
        into the object store with one ``ray.put`` (a list of flat byte views of the rings, run-major:
        Ray copies ring -> object store here, while this method runs; a codec field's compressed
        chunks, `replay.distributed.chunk_transport`); then windows overwritten during
        that copy (`replay.store.ReplayStore.stale`) are dropped and drawn again, as the local `sample`
        does. The client copies each window out of the runs (`replay.distributed.transport.place`).
        A large ``k`` is drawn and put ``DRAW_CHUNK`` windows at a time; past ``timeout`` (the
        client's deadline: it has given up) the next chunk is not drawn, so an oversized batch does
        not keep the shard busy.

        Raises
        ------
        TimeoutError
            ``timeout`` passed after the first chunk.

        Returns
        -------
        dict
            ``keys`` (local, shard bits 0), ``prob``, ``n``, ``dst`` [k] of the kept windows in order;
            ``parts``: one per put, ``(ref, runs, segments, packs)``: the put holds the raw fields'
            runs (run-major, `replay.distributed.transport.ring_runs`), then one blob of compressed
            chunks per codec field, whose `replay.distributed.chunk_transport.FieldPack` is in
            ``packs``; ``counts`` (inserts, deletes); ``seconds`` (draw, put, total); ``redrawn``
            windows; ``faults`` (minor page faults of the puts); ``bytes`` put (and open-chunk rows).
        """
        self._ready()
        if allow is not None:
            self.set_allow(allow)
        t0 = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        store = self.store
        cap = store.shard_capacity
        sh = store.storage.shards[0]
        fields = list(self.spec.items())
        rings = [sh.columns[n].reshape(-1).view(np.uint8) for n, f in fields if not f.codec]
        row_bytes = [f.row_bytes for _, f in fields if not f.codec]
        coded = [(j, sh.chunks[n], CODEC_KINDS[f.codec]) for j, (n, f) in enumerate(fields) if f.codec]
        kept: list = []
        parts = []
        draw_s = put_s = 0.0
        faults = 0  # minor page faults of this process during the puts (fresh object-store pages)
        shipped = 0  # bytes put (and compressed chunks' open rows sent in the reply)
        need, row, redrawn = k, 0, 0
        while need:
            if (row or redrawn) and deadline is not None and time.monotonic() > deadline:
                # the client gave up on this call: stop (the selector's lock is free between draws)
                raise TimeoutError(
                    f"shard {self.index}: sample of {k} windows passed the caller's deadline "
                    f"({secs(timeout)}) after {row} windows; nothing was returned"
                )
            t = time.perf_counter()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            table = store.draw_windows(min(need, DRAW_CHUNK), window, pad=pad, timeout=left)
            if self.before_put is not None:
                self.before_put(table)
            runs, seg = ring_runs(table.slots, table.n, table.dst, cap)
            pieces = [ring[a * rb : b * rb] for a, b in runs.tolist()
                      for ring, rb in zip(rings, row_bytes, strict=True)]
            packs = []
            if coded:
                with sh:  # the chunk tables and open rows as the writers left them
                    packs = [pack_field(ring, j, kind, table.first, table.n, table.dst, window, self.index)
                             for j, ring, kind in coded]
                pieces += [gather_chunks(ring, pk) for (_, ring, _), pk in zip(coded, packs, strict=True)]
            t1 = time.perf_counter()
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ref = ray.put(pieces)  # ring (and compressed chunks) -> object store, no lock held
            shipped += sum(x.nbytes for x in pieces) + sum(pk.tail.nbytes for pk in packs)
            del pieces
            t2 = time.perf_counter()
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f1
            good = ~store.stale(table)
            draw_s += t1 - t
            put_s += t2 - t1
            got = int(good.sum())
            if got:
                order = np.cumsum(good) - 1 + row  # the row of each kept window (the stale ones: unused)
                keep = good[seg["window"]]
                seg = {name: a[keep] for name, a in seg.items()}
                seg["window"] = order[seg["window"]]
                packs = [pk.take(good, order, window, fields[pk.field][1].row_bytes) for pk in packs]
                parts.append((ref, len(runs), seg, packs))
                kept.append(table.take(good))
            redrawn += len(table) - got
            need -= got
            row += got
        out = kept[0] if len(kept) == 1 else concat_tables(kept)
        return {
            "keys": out.keys,
            "prob": out.probabilities,
            "n": out.n,
            "dst": out.dst,
            "parts": parts,
            "counts": self._counts(),
            "seconds": (draw_s, put_s, time.perf_counter() - t0),
            "redrawn": redrawn,
            "faults": faults,
            "bytes": shipped,
        }

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        self._ready()
        return self.store.update_priorities(keys, priorities)

    def episodes(self) -> list[Episode]:
        self._ready()
        out = self.store.episodes()
        for e in out:
            e.shard = self.index
        return out

    def checkpoint(self, path: str) -> str:
        self._ready()
        return self.store.checkpoint(path)

    def ping(self) -> str:
        return self.incarnation

    def next_writer(self) -> int:
        """A number for a new writer (0, 1, 2, ...): its first episode goes to shard ``number % S``."""
        with self.cond:
            self.writers += 1
            return self.writers - 1

    def close(self) -> None:
        self.store.close()

