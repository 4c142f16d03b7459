"""Device batches (``store.sample(B, L, device="cuda")``) follow the host slots' rule: a tensor taken from a
dropped batch keeps its slot (the device pool's slots have their own storages, ``count_views``), a dropped one
frees it, and a slot handed out for a gather on another stream than its last write's is ordered after the work
queued there (`graphrl.stream_order.SlotStreams`: one event and a GPU-side wait, never a host wait).

On the CPU: `SlotStreams` with fake streams and events, and the store's device path under numba's CUDA
simulator (its device pool in host memory) with fake streams, counting events, waits and synchronizations.
The ``gpu`` tests do the real thing: a kept ``["pos"]`` intact after many samples, and a read queued behind
``torch.cuda._sleep`` on one stream not overwritten by the next gather on another."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryManager
from graphrl.stream_order import SlotStreams, write_stream
from replay import ReplayStore, TrajectorySpec


class FakeStream:
    """A stream's ``wait_event``, counted (equal only to itself, as two different CUDA streams)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class FakeEvent:
    def __init__(self) -> None:
        self.recorded_on: list = []
        self.synchronized = 0

    def record(self, stream) -> None:
        self.recorded_on.append(stream)

    def synchronize(self) -> None:
        self.synchronized += 1


def test_a_write_on_the_slots_last_stream_records_nothing():
    events: list[FakeEvent] = []
    a = FakeStream("a")
    streams = SlotStreams(2, a, new_event=lambda: events.append(FakeEvent()) or events[-1])
    for _ in range(5):
        streams.write_on(0, a)
        streams.write_on(1, a)
    assert not events and not a.waited


def test_a_write_on_another_stream_waits_on_the_gpu_for_the_slots_last_stream():
    events: list[FakeEvent] = []
    streams = SlotStreams(2, new_event=lambda: events.append(FakeEvent()) or events[-1])
    a, b = FakeStream("a"), FakeStream("b")
    streams.write_on(0, a)
    streams.write_on(1, b)
    streams.write_on(0, b)  # slot 0 last written on a: b waits for an event recorded on a now
    assert len(events) == 1 and events[0].recorded_on == [a] and b.waited == [events[0]] and not a.waited
    streams.write_on(0, b)  # now b's: nothing more
    streams.write_on(1, b)
    assert len(events) == 1
    streams.write_on(1, a)  # slot 1 was b's
    assert len(events) == 2 and events[1].recorded_on == [b] and a.waited == [events[1]]
    assert all(e.synchronized == 0 for e in events)  # the host never waits


def test_writes_that_complete_on_return_are_not_ordered():
    events: list[FakeEvent] = []
    streams = SlotStreams(1, new_event=lambda: events.append(FakeEvent()) or events[-1])
    a = FakeStream("a")
    streams.write_on(0, a)
    streams.write_on(0, None)  # the CPU / the simulator (write_stream gives None)
    streams.write_on(0, a)
    assert not events and not a.waited
    assert write_stream(torch.device("cpu")) is None and write_stream(torch.device("meta")) is None


def test_the_first_write_on_another_stream_than_the_pools_fill_waits_for_it():
    events: list[FakeEvent] = []
    fill, b = FakeStream("fill"), FakeStream("b")
    streams = SlotStreams(2, fill, new_event=lambda: events.append(FakeEvent()) or events[-1])
    streams.write_on(1, b)
    assert len(events) == 1 and events[0].recorded_on == [fill] and b.waited == events
    streams.write_on(0, fill)
    assert len(events) == 1


SIMULATED = textwrap.dedent(
    """
    import gc
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM
    import replay.batch_staging as bs
    from graphrl import cuda as gcuda
    from graphrl.memory import MemoryManager
    from replay import ReplayStore, TrajectorySpec

    SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32")})

    class FakeStream:
        def __init__(self, name):
            self.name, self.waited = name, []

        def wait_event(self, event):
            self.waited.append(event)

    class FakeEvent:
        made = []

        def __init__(self):
            self.recorded_on, self.synchronized = [], 0
            FakeEvent.made.append(self)

        def record(self, stream=None):
            self.recorded_on.append(stream)

        def synchronize(self):
            self.synchronized += 1

        def query(self):
            return True

    syncs = []
    torch.cuda.Event = FakeEvent
    torch.cuda.synchronize = lambda *a, **k: syncs.append("torch")
    real_sync = gcuda.synchronize
    gcuda.synchronize = lambda stream: (syncs.append(("stream", stream)), real_sync(stream))[1]
    current = [FakeStream("a")]
    bs.write_stream = lambda device: current[0]  # where the gather of this sample call would run

    # the device pool asks for counted views
    made = []
    real_pool = bs.StagingPool
    bs.StagingPool = lambda *a, **k: (made.append(k), real_pool(*a, **k))[1]

    mm = MemoryManager()
    store = ReplayStore(SPEC, 256, 1, memory=mm, seed=3, staging_slots=2, timeout=5.0)
    store.device_gather_min_bytes = 0  # every batch through the (simulated) GPU kernel
    with store.writer() as w:
        start = 0
        for n in (40, 50, 60):
            p = np.arange(start + 1, start + n + 1, dtype=np.int64)
            w.add_episode({"pos": p, "obs": (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(
                np.float32)})
            start += n

    calls = []

    def sample(**kw):
        calls.append(1)
        b = store.sample(8, 3, device="cuda", **kw)
        assert b._buffer._pool.owner == "replay.device_staging"
        return b

    first = sample()
    assert made and made[-1]["count_views"] is True and made[-1]["tier"] == "host"  # the simulator's stand-in
    pos = first["pos"]  # kept; the batch dropped
    want, ptr = pos.clone(), pos.data_ptr()
    del first
    gc.collect()
    ptrs = set()
    for _ in range(30):  # the other slot only: pos's is held
        b = sample(timeout=0.5)
        ptrs.add(b["pos"].data_ptr())
        b.release()
    assert ptr not in ptrs and len(ptrs) == 1 and torch.equal(pos, want)
    try:
        held = sample(timeout=0.0)
        other = sample(timeout=0.02)
        raise AssertionError("both slots handed out while pos views one")
    except TimeoutError:
        pass
    held.release()
    assert not FakeEvent.made and not current[0].waited  # one stream: stream order, nothing recorded
    del pos  # dropped: its slot comes back
    gc.collect()
    for _ in range(6):
        b = sample(timeout=0.5)
        ptrs.add(b["pos"].data_ptr())
        del b  # dropped, nothing kept: free again at once
    assert ptr in ptrs

    # another stream: each slot's first gather there waits (on the GPU) for an event on its last stream
    a, bstream = current[0], FakeStream("b")
    current[0] = bstream
    n = len(FakeEvent.made)
    for _ in range(10):
        sample(timeout=0.5).release()
    switched = FakeEvent.made[n:]
    assert 1 <= len(switched) <= 2, len(switched)  # at most once per slot
    assert all(e.recorded_on == [a] for e in switched) and bstream.waited == switched
    current[0] = a  # and back
    for _ in range(10):
        sample(timeout=0.5).release()
    assert len(FakeEvent.made) - n - len(switched) in (1, 2)
    assert all(e.synchronized == 0 for e in FakeEvent.made)
    assert all(s != "torch" for s in syncs)  # no device-wide synchronize
    # one wait for the gather's stream a sample (the staleness check's, as before), none added
    assert len(syncs) <= len(calls), (len(syncs), len(calls))
    store.close(); mm.close()
    print("OK", len(switched))
    """
)


@pytest.mark.simulated(SIMULATED, patches=True)  # torch.cuda.Event/synchronize, write_stream, StagingPool
def test_a_kept_device_tensor_keeps_its_slot_and_streams_are_ordered_without_host_waits(simulated_part):
    assert simulated_part.ok, simulated_part.output
    assert simulated_part.output.strip().startswith("OK")


# -- on a GPU ------------------------------------------------------------------------------------------------

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32")})


def _gpu_store(mm: MemoryManager, slots: int) -> ReplayStore:
    store = ReplayStore(SPEC, 4096, 1, memory=mm, seed=3, staging_slots=slots, timeout=10.0)
    store.device_gather_min_bytes = 0
    with store.writer() as w:
        p = np.arange(1, 4001, dtype=np.int64)
        obs = (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
        w.add_episode({"pos": p, "obs": obs})
    return store


@pytest.mark.gpu
def test_gpu_a_kept_device_tensor_keeps_its_slot(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    syncs = []
    real_sync, ev_sync = torch.cuda.synchronize, torch.cuda.Event.synchronize
    with MemoryManager() as mm:
        store = _gpu_store(mm, slots=2)
        pos = store.sample(256, 8, device="cuda")["pos"]  # the pool made, the rings registered: then count
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (syncs.append(1), real_sync(*a))[1])
        monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda e: (syncs.append(2), ev_sync(e))[1])
        assert pos.is_cuda
        want, ptr = pos.clone(), pos.data_ptr()
        ptrs = set()
        for _ in range(40):
            b = store.sample(256, 8, device="cuda", timeout=2.0)
            ptrs.add(b["pos"].data_ptr())
            b.release()
        assert ptr not in ptrs and torch.equal(pos, want)
        del pos
        for _ in range(4):
            b = store.sample(256, 8, device="cuda", timeout=2.0)
            ptrs.add(b["pos"].data_ptr())
            del b
        assert ptr in ptrs
        assert not syncs  # no device-wide or event synchronize per sample
        monkeypatch.undo()
        store.close()


@pytest.mark.gpu
def test_gpu_a_read_queued_on_another_stream_is_not_overwritten_by_the_next_gather():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with MemoryManager() as mm:
        store = _gpu_store(mm, slots=1)
        side = torch.cuda.Stream()
        for _ in range(3):
            with torch.cuda.stream(side):
                batch = store.sample(512, 8, device="cuda")  # gathered on `side`
                pos = batch["pos"]
                want = pos.clone()
                torch.cuda._sleep(50_000_000)  # the read below waits behind this on `side`
                got = pos.clone()
            del batch, pos  # the slot is free by its count while `side` has not read it yet
            store.sample(512, 8, device="cuda").release()  # the next gather, on the default stream
            torch.cuda.synchronize()
            assert torch.equal(got, want)
        store.close()
