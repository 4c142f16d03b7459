"""`DistNeighborSampler`: neighbour sampling over a partitioned graph, identical to `NeighborSampler`.

Each layer's frontier is split by owner (the partition book, `graphrl.partition.PartitionBook`), sent
as one request per owner per layer (`samplers.distributed.owners`), drawn there by the sampling core
(`samplers.distributed.core`), and put back in frontier order and relabelled in one pass
(`samplers.distributed.assemble`), as the whole-graph sampler relabels. Draws are keyed by (seed,
call, layer, global node id) and a row's CSC positions, which owners keep, so for the same seed the
n-th call returns the blocks `NeighborSampler`'s n-th call returns on the whole graph (uniform or
weighted, with or without replacement). `sample_many` keeps several batches in flight, so owners draw
one batch while the trainer assembles another. A call that fails (an owner died) does not advance the
call counter: after `restart` the same batch comes again. See docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import torch

from samplers._checks import check_fanouts, check_seed_and_replace, check_seeds
from samplers.block import Block, Blocks
from samplers.distributed.assemble import assemble_layer, group_by_owner, pack_request, unpack_reply
from samplers.distributed.core import Workspace, layer_key
from samplers.distributed.owners import OwnerCall, check_owners

__all__ = ["DistNeighborSampler", "SampleProfile"]

_INT32_MAX = np.iinfo(np.int32).max


@dataclass
class SampleProfile:
    """Where a sampler's calls spent their time (seconds, summed over calls).

    ``wait_s``: waiting for the owners' answers (their kernels, the transfers, the engine's round
    trips); ``assemble_s``: splitting frontiers by owner, and putting the answers back in frontier
    order and relabelling them (one pass); ``calls``: batches sampled (`DistNeighborSampler.sample`
    calls and batches of `DistNeighborSampler.sample_many`). With batches in flight at once, the
    seconds of one overlap another's.
    """

    wait_s: float = 0.0
    assemble_s: float = 0.0
    calls: int = 0

    def add(self, other: SampleProfile) -> None:
        """Add ``other``'s seconds and calls to these."""
        self.wait_s += other.wait_s
        self.assemble_s += other.assemble_s
        self.calls += other.calls


@dataclass
class _Group:
    """Batches sampled together by `DistNeighborSampler.sample_many`: their layers (a `_wave` generator),
    the owners' call in flight, and the blocks or the error once finished."""

    wave: Generator
    profile: SampleProfile
    call: OwnerCall | None = None
    blocks: list | None = None
    error: BaseException | None = field(default=None)

    @property
    def finished(self) -> bool:
        return self.blocks is not None or self.error is not None


class DistNeighborSampler:
    """Sample blocks from a partitioned graph through its owners.

    Parameters
    ----------
    owners : samplers.distributed.LocalOwners or RayOwners
        The owners of the partition folder.
    fanouts : sequence of int
        As `NeighborSampler` (outermost layer first, -1 takes every in-neighbour).
    replace : bool
        As `NeighborSampler`.
    weighted : bool
        Draw by the edge weights the folder holds (as ``NeighborSampler(weights=True)``).
    seed : int or None
        Seed of the random stream; ``None`` draws one from the OS.

    Notes
    -----
    Requests per call: at most P per layer (`sample_many`: per group of batches). Bytes per batch: 4 per
    frontier node sent, 4 per row and 8 per sampled edge received (below 2^31 nodes and edges; 8, 8 and
    16 above), and per request a header of 8 (7 + 3K) bytes sent and 4K received (K batches a request).
    The trainer holds the book (4 bytes per node) and one relabelling map (4 bytes per node), which
    every batch in flight shares (each layer is relabelled in one pass on the calling thread).
    ``sampled_edges`` counts edges drawn; ``owners.stats`` the requests and bytes.

    Raises
    ------
    TypeError, ValueError
        Bad fanouts or seed (as `NeighborSampler`); ``weighted`` on a folder without weights; ``owners``
        not `LocalOwners` or `RayOwners`.

    Pickling (spawned ``DataLoader`` workers, ``mp.spawn``) keeps the owners, fanouts, seed and call
    counter, so a copy continues the stream; `RayOwners` refuse it (attach by name in each process).

    References
    ----------
    DistDGL (Zheng et al., IA3 2020): sampling requests routed to the partitions owning the frontier.
    """

    def __init__(self, owners, fanouts: Sequence[int], replace: bool = False, weighted: bool = False,
                 seed: int | None = None) -> None:
        check_owners(owners)
        fanouts = check_fanouts("fanouts", fanouts)
        check_seed_and_replace(seed, replace)
        if weighted and not owners.book.manifest["weighted"]:
            raise ValueError(f"weighted=True, but partition folder {owners.folder} holds no edge weights")
        self.owners = owners
        self.book = owners.book
        self.fanouts = [int(k) for k in fanouts]
        self.replace = bool(replace)
        self.weighted = bool(weighted)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.sampled_edges = 0
        self._calls = 0
        self.profile = SampleProfile()
        """Time spent per part of a call (`SampleProfile`); ``owners.stats`` has requests and bytes."""
        self.kind = "neighbor"
        """The owners' sampling rule (`samplers.distributed.core.KINDS`)."""
        self._ws = self._workspace()  # the relabelling map, shared by every batch in flight
        self._streaming = False
        self._lock = threading.Lock()

    def _workspace(self) -> Workspace:
        return Workspace(self.book.num_nodes, np.int32 if self.book.num_nodes <= _INT32_MAX else np.int64)

    def __getstate__(self) -> dict:
        """The sampler without its lock and relabelling map (rebuilt by `__setstate__`)."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"], state["_ws"]
        state["_streaming"] = False  # a stream being read stays with this sampler; the copy has none
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler (`__getstate__`)."""
        self.__dict__.update(state)
        self._ws = self._workspace()
        self._lock = threading.Lock()

    @property
    def num_layers(self) -> int:
        """Number of layers (blocks per sample)."""
        return len(self.fanouts)

    def sample(self, seeds) -> Blocks:
        """Sample blocks for ``seeds``, outermost layer first (as `NeighborSampler.sample`).

        Parameters
        ----------
        seeds : torch.Tensor, integer, shape [B], in [0, N); duplicates kept

        Returns
        -------
        Blocks
            ``len(fanouts)`` blocks, equal to `NeighborSampler`'s for the same seed and call.

        Raises
        ------
        TypeError, ValueError
            Bad ``seeds`` (as `NeighborSampler.sample`).
        samplers.distributed.OwnerError
            An owner died or failed; the call counter is not advanced.
        TimeoutError
            Owners did not answer within `RayOwners`' ``timeout_s``; the call counter is not advanced.
        RuntimeError
            A `sample_many` stream of this sampler is being read.
        """
        dst = check_seeds(seeds, self.book.num_nodes)
        with self._lock:
            if self._streaming:
                raise RuntimeError("sample() while a sample_many() stream of this sampler is being read: "
                                   "finish or close the stream first (they share the call counter)")
            (blocks,), profile = self._sample_group([dst], [self._calls])
            self.profile.add(profile)
            self._count(blocks)
        return blocks

    def _count(self, blocks: Blocks) -> None:
        self._calls += 1
        self.sampled_edges += sum(b.num_edges for b in blocks)

    def sample_many(self, batches: Iterable, batches_per_request: int = 4,
                    in_flight: int = 2) -> Iterator[Blocks]:
        """Blocks for each batch of seeds in turn, as successive `sample` calls give them, drawn
        ``batches_per_request`` batches at a time (one request per owner per layer carries them all, so
        the engine's cost per request is shared) with up to ``in_flight`` such groups at once (all on the
        calling thread: the owners draw one group while it assembles another's answers).

        Parameters
        ----------
        batches : iterable of torch.Tensor, integer, shape [B_k], in [0, N)
            Read up to ``batches_per_request * in_flight`` ahead of the blocks yielded.
        batches_per_request : int >= 1
            G: a batch costs L·P/G requests (L layers, P owners), and the engine's cost per request is
            most of a small group's CPU, so G should grow with P (docs/architecture.md#partitioned-graphs).
        in_flight : int >= 1

        Yields
        ------
        Blocks
            Batch k's blocks, equal to `NeighborSampler`'s (k + 1)-th call after this sampler's calls.

        Raises
        ------
        TypeError, ValueError
            ``batches`` not iterable, bad ``batches_per_request`` or ``in_flight`` (at the call), or a bad
            batch (in its turn: the batches before it are yielded; it is not counted).
        Exception
            What reading ``batches`` raised, in the failed batch's turn.
        samplers.distributed.OwnerError, TimeoutError
            As `sample`, when the failed batch's turn comes: the batches before it were yielded and
            counted, it and the ones after it are not (they come again from the next call).
        RuntimeError
            Another stream of this sampler is being read.

        The call counter advances by the batches yielded; `sample` refuses while the stream is read.
        """
        for name, v in (("batches_per_request", batches_per_request), ("in_flight", in_flight)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        try:
            batches = iter(batches)
        except TypeError:
            raise TypeError("batches must be an iterable of seed tensors, "
                            f"got {type(batches).__name__}") from None
        return self._read(batches, batches_per_request, in_flight)  # arguments checked now, not at next()

    def _read(self, batches: Iterator, per: int, in_flight: int) -> Iterator[Blocks]:
        with self._lock:
            if self._streaming:
                raise RuntimeError("sample_many() while another stream of this sampler is being read")
            self._streaming = True
        try:
            yield from self._stream(batches, per, in_flight)
        finally:
            with self._lock:
                self._streaming = False

    def _stream(self, batches: Iterator, per: int, in_flight: int) -> Iterator[Blocks]:
        groups: deque[_Group] = deque()
        next_call = self._calls
        failed: Exception | None = None  # reading a batch failed: raised in its turn, after those before it
        try:
            while True:
                while len(groups) < in_flight and failed is None:
                    dsts = []
                    try:
                        for seeds in islice(batches, per):
                            # copied: the caller may refill a batch's tensor before its blocks are drawn
                            dsts.append(check_seeds(seeds, self.book.num_nodes).copy())
                    except Exception as e:
                        failed = e
                    if not dsts:
                        break
                    calls = list(range(next_call, next_call + len(dsts)))
                    group = _Group(None, SampleProfile(calls=len(dsts)))
                    group.wave = self._wave(dsts, calls, group.profile)
                    groups.append(group)
                    self._step(group, None)
                    next_call += len(dsts)
                if not groups:
                    if failed is not None:
                        raise failed
                    return
                head = groups[0]
                while not head.finished:  # answers of any group in flight, as they come
                    self._advance(groups)
                groups.popleft()
                if head.error is not None:
                    raise head.error
                with self._lock:
                    self.profile.add(head.profile)
                for blocks in head.blocks:
                    with self._lock:
                        self._count(blocks)
                    yield blocks
        finally:
            for group in groups:  # abandoned between steps (no layer half assembled)
                group.wave.close()

    def _step(self, group: _Group, results: dict | None) -> None:
        """Give a group its owners' answers (None: start it) and send its next layer's requests."""
        group.call = None
        try:
            requests = next(group.wave) if results is None else group.wave.send(results)
            group.call = self.owners.start("sample", requests)
        except StopIteration as stop:
            group.blocks = stop.value
        except Exception as e:
            group.error = e

    def _advance(self, groups: Iterable[_Group]) -> None:
        """Wait for the answers of one group's call in flight and step that group."""
        live = [g for g in groups if g.call is not None]
        t0 = time.perf_counter()
        group = live[self.owners.wait_any([g.call for g in live])]
        group.profile.wait_s += time.perf_counter() - t0
        try:
            results = self.owners.finish(group.call)
        except Exception as e:
            group.call, group.error = None, e
            return
        self._step(group, results)

    def _sample_group(self, dsts: list[np.ndarray], calls: list[int]) -> tuple[list[Blocks], SampleProfile]:
        """The blocks of the batches ``dsts``, each layer's call waited for in turn."""
        profile = SampleProfile(calls=len(dsts))
        wave = self._wave(dsts, calls, profile)
        try:
            requests = next(wave)
            while True:
                t0 = time.perf_counter()
                results = self.owners.call("sample", requests)
                profile.wait_s += time.perf_counter() - t0
                requests = wave.send(results)
        except StopIteration as stop:
            return stop.value, profile

    def _keys(self, call: int, layer: int) -> tuple[int, int]:
        """The layer key of one layer of one call, and its per-source variates' key (LABOR)."""
        key = layer_key(self.seed, call, layer)
        return key, key

    def _returns_weights(self) -> bool:
        """Whether blocks carry ``edge_weights`` (LABOR with weights); neighbour sampling's do not."""
        return False

    def _wave(self, dsts: list[np.ndarray], calls: list[int],
              profile: SampleProfile) -> Generator[dict, dict, list[Blocks]]:
        """The blocks of the batches ``dsts`` (int64 [B_b]), calls ``calls``: yields each layer's requests
        (one per owner for them all) and takes the owners' answers; assembling time goes to ``profile``.
        Every layer of every batch is relabelled through the one map (``_ws``), each in one
        `assemble_layer` call: its entries are valid only during that call (`Workspace.reserve`)."""
        book, k = self.book, len(dsts)
        blocks = [Blocks() for _ in dsts]
        dsts = list(dsts)
        for layer in range(self.num_layers - 1, -1, -1):
            t0 = time.perf_counter()
            groups = [group_by_owner(d, book.node_part, book.num_parts) for d in dsts]
            rows = np.stack([np.diff(g[1]) for g in groups])  # [K, P]
            keys = np.array([self._keys(c, layer) for c in calls], dtype=np.uint64)  # [K, 2]
            tail = (self.fanouts[layer], self.replace, keys[:, 0], self.weighted, self.kind, keys[:, 1])
            requests = {}
            for p in np.flatnonzero(rows.sum(0)).tolist():
                bounds = np.zeros(k + 1, dtype=np.int64)
                np.cumsum(rows[:, p], out=bounds[1:])
                segs = [g[0][g[1][p]:g[1][p + 1]] for g in groups]
                requests[p] = (pack_request(segs[0] if k == 1 else np.concatenate(segs), bounds, *tail),)
            profile.assemble_s += time.perf_counter() - t0
            results = yield requests
            t2 = time.perf_counter()
            parts, weights = {}, {}
            for p, (reply, w) in results.items():
                parts[p], nnz = unpack_reply(reply, rows[:, p].tolist())
                if w is not None:
                    weights[p] = np.split(w, np.cumsum(nnz)[:-1])
            empty = np.empty(0, dtype=next(iter(results.values()))[0].dtype if results else np.int32)
            no_weights = np.empty(0, dtype=np.float32)
            for b in range(k):
                replies = [parts[p][b] if p in parts else empty for p in range(book.num_parts)]
                w_b = [weights[p][b] if p in weights else no_weights for p in range(book.num_parts)] \
                    if weights or self._returns_weights() else None  # no owner asked: an empty frontier
                layer_b = assemble_layer(dsts[b], groups[b][2], rows[b], replies, w_b, self._ws)
                out_indptr, src_nodes, local, eids, w = layer_b
                src_t = torch.from_numpy(src_nodes)
                blocks[b].append(Block(src_nodes=src_t, dst_nodes=src_t[: dsts[b].shape[0]],
                                       indptr=torch.from_numpy(out_indptr), indices=torch.from_numpy(local),
                                       edge_ids=torch.from_numpy(eids),
                                       edge_weights=None if w is None else torch.from_numpy(w)))
                dsts[b] = src_nodes
            profile.assemble_s += time.perf_counter() - t2
        for x in blocks:
            x.reverse()
        return blocks
