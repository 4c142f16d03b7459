"""Batches in flight between a loader's producer and its caller: the prefetch thread and its queue, the
staging leases a batch holds, one epoch's iterator, and the CUDA side-stream bookkeeping.

`samplers.loader` builds its loaders on these; the rules a loader's user sees (batches in order and equal
to ``prefetch=0``, an error raised at its batch, early exit stopping the thread, the staging reuse rule)
are stated in `samplers.loader`'s docstring, and kept here:

- `BatchIterator` runs one epoch: ``produce(i)`` makes batch i, in the caller's thread (``prefetch=0``)
  or in one background thread that fills a bounded queue of ``prefetch`` batches (and may be working on
  one more); an exception in the thread is queued in order and raised by ``next()`` at its batch. Each
  ``next()`` first gives back the batch handed out before when unused (its `BatchLease`: each staging
  buffer returns once no tensor views it, so a batch or tensor the user keeps is never overwritten).
  Closing (``close()``, a ``with`` block, dropping the iterator, the end of the epoch) stops the thread,
  joins it, gives back the last batch handed out when unused and releases the batches never handed out.
- `BatchLease` is the staging leases of one batch, given back once: at once by ``batch.release()`` (the
  user's word), or when unused by the iterator.
- `InFlight` is the CUDA side stream of a sampler on a CUDA device: batches are sampled on it, carry an
  event, and are delivered to the caller's stream (wait on the event, ``record_stream`` on the blocks'
  tensors); on the CPU and the simulator every step is a no-op.

References
----------
PyG's and DGL's loaders (a torch ``DataLoader`` whose workers prefetch ``prefetch_factor`` batches);
DGL's ``DataLoader(use_prefetch_thread=True, use_alternate_streams=True)`` (a thread and a side CUDA stream
in the training process), which this module follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from graphrl import cuda as gcuda
from samplers.staging import StagingLease

__all__ = ["BatchIterator", "BatchLease", "InFlight"]

logger = logging.getLogger(__name__)

_JOIN_SECONDS = 60.0


class BatchLease:
    """The staging leases of one batch (one per gathered store), given back once: by ``batch.release()``
    (at once) or by the loader (`release_when_unused`)."""

    __slots__ = ("leases",)

    def __init__(self, *leases: StagingLease) -> None:
        self.leases = leases

    def release(self) -> None:
        """Release every lease now (their buffers may be overwritten at once); idempotent."""
        leases, self.leases = self.leases, ()
        for lease in leases:
            lease.release()

    def release_when_unused(self) -> None:
        """Give every lease back once no tensor views its buffer (`StagingLease.release_when_unused`);
        idempotent."""
        leases, self.leases = self.leases, ()
        for lease in leases:
            lease.release_when_unused()

    def hold_until(self, event: Any) -> None:
        """Keep every lease's buffer from being reused before ``event`` completes, however the leases are
        given back (`StagingLease.hold_until`): a copy recorded before it may still read them."""
        for lease in self.leases:
            lease.hold_until(event)


class _Failure:
    """An exception raised while producing a batch, queued in its place."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class _Channel:
    """A bounded queue between the producer thread and the iterator; closing it wakes both sides."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[Any] = deque()
        self.cv = threading.Condition()
        self.closed = False

    def put(self, item: Any) -> bool:
        """Queue ``item``, waiting for room; False (item not queued) once the channel is closed."""
        with self.cv:
            self.cv.wait_for(lambda: self.closed or len(self.items) < self.capacity)
            if self.closed:
                return False
            self.items.append(item)
            self.cv.notify_all()
            return True

    def get(self) -> Any:
        with self.cv:
            self.cv.wait_for(lambda: self.items or self.closed)
            if not self.items:
                return _END
            item = self.items.popleft()
            self.cv.notify_all()
            return item

    def close(self) -> list[Any]:
        """Close and return what was still queued."""
        with self.cv:
            self.closed = True
            left = list(self.items)
            self.items.clear()
            self.cv.notify_all()
            return left


def _release(item: Any) -> None:
    """Release a batch never handed out (nothing of it can be in use)."""
    release = getattr(item, "release", None)
    if release is not None:
        release()


def _release_when_unused(item: Any) -> None:
    """Give back a batch handed out to the user: its buffers return once no tensor views them."""
    release = getattr(item, "release_when_unused", None)
    if release is not None:
        release()
    else:
        _release(item)


def _produce(produce: Callable[[int], Any], count: int, channel: _Channel) -> None:
    """The background thread: make batches 0..count-1 in order and queue them."""
    try:
        for i in range(count):
            if channel.closed:
                return
            item = produce(i)
            if not channel.put(item):
                _release(item)
                return
        channel.put(_END)
    except BaseException as err:  # delivered to the consumer in order
        channel.put(_Failure(err))


class _State:
    """What the iterator's finaliser needs (never the iterator itself)."""

    def __init__(self) -> None:
        self.channel: _Channel | None = None
        self.thread: threading.Thread | None = None
        self.current: Any = None
        self.closed = False

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        current, self.current = self.current, None
        if current is not None:
            _release_when_unused(current)
        if self.channel is not None:
            for item in self.channel.close():
                _release(item)
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_SECONDS)
            if thread.is_alive():  # pragma: no cover - a batch took over a minute
                logger.warning("loader thread %s still running after %.0f s", thread.name, _JOIN_SECONDS)
            if self.channel is not None:  # a batch finished while we waited
                for item in self.channel.close():
                    _release(item)


class BatchIterator(Iterator):
    """One epoch of a loader: batches 0..count-1, from a background thread when prefetching.

    Parameters
    ----------
    produce : callable int -> batch
        Makes batch i (called for i = 0, 1, ... in order, by one thread). A batch with a
        ``release_when_unused()`` method (a `BatchLease` holder) is given back by it when the next one is
        fetched or the iterator closes; batches never handed out are released (``release()``).
    count : int
        Batches in the epoch.
    prefetch : int
        Batches the background thread keeps ready; 0: no thread, ``produce`` runs in ``next()``.
    name : str
        The thread's name.
    deliver : callable batch -> None, or None
        Called in the caller's thread on each batch before it is returned (`InFlight.deliver`).

    Raises
    ------
    BaseException
        ``next()`` raises what ``produce`` raised, at that batch (the iterator is then closed).
    ValueError
        ``next()`` after `abort` (the loader closed, from any thread) with batches left.
    """

    def __init__(self, produce: Callable[[int], Any], count: int, prefetch: int, name: str,
                 deliver: Callable[[Any], Any] | None = None) -> None:
        self._produce = produce
        self._deliver = deliver
        self._count = count
        self._next = 0
        self._aborted = False  # closed by `abort`: next() raises while batches were left
        self._state = _State()
        self._finalizer = weakref.finalize(self, _State.shutdown, self._state)
        if prefetch > 0 and count > 0:
            channel = _Channel(prefetch)
            thread = threading.Thread(target=_produce, args=(produce, count, channel), name=name, daemon=True)
            self._state.channel, self._state.thread = channel, thread
            thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The background thread (None without prefetch)."""
        return self._state.thread

    def __len__(self) -> int:
        return self._count - self._next

    def __next__(self) -> Any:
        state = self._state
        current, state.current = state.current, None
        if current is not None:  # the staging reuse rule: its buffers return once nothing views them
            _release_when_unused(current)
            del current  # before the producer is woken: only the user's references may hold the buffers
        if state.closed and self._aborted and self._next < self._count:
            self._closed_early()
        if state.closed or self._next >= self._count:
            self.close()
            raise StopIteration
        if state.channel is None:
            try:
                item = self._produce(self._next)
            except BaseException:
                self.close()
                raise
        else:
            item = state.channel.get()
            if item is _END:
                if self._aborted and self._next < self._count:  # aborted while this call waited
                    self._closed_early()
                self.close()
                raise StopIteration
            if isinstance(item, _Failure):
                self.close()
                raise item.error
        self._next += 1
        state.current = item
        if self._deliver is not None:
            self._deliver(item)
        return item

    def _closed_early(self) -> None:
        raise ValueError(f"the loader was closed during the epoch after {self._next} of {self._count} "
                         "batches: the epoch is incomplete")

    def close(self) -> None:
        """Stop the background thread and release every batch this iterator holds; idempotent. A later
        ``next()`` raises StopIteration (the user's own close, or a new epoch's)."""
        self._finalizer()

    def abort(self) -> None:
        """`close` for the loader's own close (from any thread): a later ``next()`` raises ValueError
        while the epoch had batches left, not StopIteration, so a loop does not take a shortened epoch for
        a whole one."""
        self._aborted = True
        self._finalizer()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InFlight:
    """Batches in flight on CUDA: a sampler on a CUDA device samples on a side stream of its own, so
    the host steps of batch k+1 (and their read-backs, which wait only for that stream) run while the
    kernels the caller queued for batch k run on its stream; each batch carries an event, and
    `deliver` makes the caller's stream wait for it and marks the blocks' memory as used there
    (``record_stream``). Elsewhere (the CPU, the simulator) every step is a no-op."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    @classmethod
    def for_sampler(cls, sampler: Any) -> InFlight:
        """A side stream on ``sampler.device`` when it is a CUDA device and torch has CUDA, else none."""
        device = getattr(sampler, "device", None)
        on_cuda = isinstance(device, torch.device) and device.type == "cuda" and gcuda.has_cuda()
        return cls(torch.cuda.Stream(device) if on_cuda else None)

    def side(self) -> Any:
        """The context that makes the side stream current. It does not wait for the caller's stream:
        sampling reads only the graph (ready since the sampler was built) and host seeds, so the
        read-backs of batch k+1 never wait for the training kernels of batch k."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def mark(self) -> Any:
        """An event after the work queued on the side stream so far (None without one)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def deliver(self, batch: Any) -> None:
        """In the caller's thread: its stream waits for the batch; the blocks' tensors (per node type
        and relation in typed blocks) are recorded on it, so their memory is not reused while its
        kernels may still read them."""
        if batch.ready is None:
            return
        current = torch.cuda.current_stream(self.stream.device)
        current.wait_event(batch.ready)
        for block in batch.blocks:
            for field in dataclasses.fields(block) if dataclasses.is_dataclass(block) else ():
                value = getattr(block, field.name)
                for tensor in value.values() if isinstance(value, Mapping) else (value,):
                    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                        tensor.record_stream(current)
