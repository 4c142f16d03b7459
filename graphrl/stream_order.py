"""When staging memory may be written again after asynchronous GPU work read it (no host waits).

Two rules for the `graphrl.tensors.StagingPool` slots that engines hand out as batches:

- `copy_event`: after a batch's tensors were copied with ``.to(device, non_blocking=...)``, the event
  after which the copies have read their sources (None when they completed on return). The copier
  passes it to `graphrl.tensors.StagingBuffer.hold_until`, so the source slot is not handed out again
  before the copy read it, however the batch is then released.
- `SlotStreams`: a device pool's slots, each written by a kernel on the stream current when it was
  handed out (docs/architecture.md#the-stream-rule). Before the next write into a slot runs on another
  stream, that stream waits (on the GPU, `Stream.wait_event`) for an event recorded then on the slot's
  previous stream. Work that read the slot was queued on that stream before its tensors were released
  or dropped, hence before the slot was seen free and handed out again, so the event comes after it.
  On the same stream, stream order already does this: nothing is recorded. This is the rule of torch's
  caching allocator (a block is reused on the stream it was allocated on; ``record_stream`` for others).
  Work on a third stream is not seen: order it yourself (synchronise, or ``clone()`` first).

>>> streams = SlotStreams(slots=4, stream=write_stream(device))  # after the pool's zero fill
>>> streams.write_on(buffer.slot, write_stream(device))  # then launch the gather on that stream
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SlotStreams", "copy_event", "write_stream"]


def copy_event(device: torch.device, non_blocking: bool) -> Any:
    """The event after which copies just queued to ``device`` have read their sources.

    Returns
    -------
    torch.cuda.Event or None
        For a non-blocking copy to a CUDA device, an event recorded on ``device``'s current stream (the
        copies' stream); else None: the copies completed on return.
    """
    if not non_blocking or device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def write_stream(device: torch.device) -> Any:
    """The stream a kernel writing staging memory on ``device`` runs on: torch's current stream of a CUDA
    device (`graphrl.cuda.launch_stream`'s, docs/architecture.md#the-stream-rule); None for another device
    (the CPU, numba's simulator: writes that complete on return)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class SlotStreams:
    """Per slot of a device staging pool, the stream its last write ran on (see the module docstring).

    The pool gives a slot to one holder at a time, so each slot's entry is read and written by its holder
    only: no lock.

    Parameters
    ----------
    slots : int
        The pool's slots.
    stream : torch.cuda.Stream or None
        The stream that wrote the slots last (the pool's zero fill, `write_stream` where it was made).
    new_event : callable, optional
        Makes an event with ``record(stream)``; default ``torch.cuda.Event`` (looked up at each use).
    """

    def __init__(self, slots: int, stream: Any = None, new_event: Callable[[], Any] | None = None) -> None:
        self._streams: list[Any] = [stream] * slots
        self._new_event = new_event

    def write_on(self, slot: int, stream: Any) -> None:
        """Order a write into ``slot`` on ``stream`` after the work queued so far on the stream of the
        slot's last write (``stream`` waits for an event recorded there; never the host), and make
        ``stream`` the slot's. Call it once a slot is handed out, before anything writes it.

        ``stream``: a ``torch.cuda.Stream`` (compared with ``==``; needs ``wait_event``), or None for
        writes that complete on return (`write_stream` of a non-CUDA device): nothing to order."""
        last = self._streams[slot]
        if last is not None and stream is not None and last != stream:
            event = (self._new_event or torch.cuda.Event)()
            event.record(last)
            stream.wait_event(event)
        self._streams[slot] = stream
