"""graphrl.memory.pool: a block a view still reads is never released upstream (close, trim, a budget), only
once its last view dies; and a freed block's reuse waits for events recorded on the freeing thread's streams
(or the streams named by ``Region.free(streams=...)``), whichever thread gives it back, never during a CUDA
graph capture. CUDA's events, streams and registrations are counted fakes here."""

from __future__ import annotations

import gc
import threading

import torch
from _memory_resources import SlowCapacity

from graphrl.memory import MemoryManager, PinnedResource, PoolResource, cudart
from graphrl.memory.backing import TensorBacking

JOIN_S = 30


class Counting:
    """A pinned-like upstream resource (blocks GPU work may use) that counts its releases."""

    def __init__(self) -> None:
        self.released = 0

    def allocate(self, shape, dtype, nbytes, name):
        return TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=True)

    def deallocate(self, backing):
        self.released += 1

    def capacity(self):
        return 2**40


def _stats(mm: MemoryManager) -> dict:
    return mm.stats()["pools"]["pinned"]


def test_close_while_a_view_lives_keeps_its_block_registered_until_the_view_dies(monkeypatch, managed):
    calls: list[tuple] = []
    monkeypatch.setattr(cudart, "host_register", lambda ptr, n: calls.append(("register", ptr)))
    monkeypatch.setattr(cudart, "host_unregister", lambda ptr: calls.append(("unregister", ptr)))
    mm = managed({"pinned": 2**20}, resources={"pinned": PinnedResource(cuda=True)})
    viewed = mm.allocate((64,), "int64", "pinned", owner="samplers.graph")
    plain = mm.allocate((32,), "int64", "pinned", owner="samplers.graph")
    ptr = viewed.data_ptr()
    view = viewed.tensor()[8:]  # what a UVA kernel array keeps
    viewed.free()
    plain.free()
    mm.close()
    unregistered = [c[1] for c in calls if c[0] == "unregister"]
    assert len(unregistered) == 1 and ptr not in unregistered  # the plain block only
    assert _stats(mm)["held_bytes"] == 64 * 8
    view[0] = 7  # still registered, still readable
    del view
    gc.collect()
    unregistered = [c[1] for c in calls if c[0] == "unregister"]
    assert sorted(unregistered) == sorted(c[1] for c in calls if c[0] == "register") and ptr in unregistered
    assert unregistered.count(ptr) == 1
    s = _stats(mm)
    assert s["held_bytes"] == 0 and s["unregistrations"] == s["registrations"] == 2


def test_trims_and_a_lower_limit_never_release_a_viewed_block():
    up = Counting()
    pool = PoolResource(up, tier="pinned")
    backing = pool.allocate((100,), torch.uint8, 100, "a")
    view = backing.tensor()[:10]
    pool.deallocate(backing)
    assert pool.trim() == 0 and up.released == 0
    pool.set_limit(0)
    assert up.released == 0 and pool.stats().held_bytes == 100 and pool.stats().idle_bytes == 0
    pool.set_limit(None)
    again = pool.allocate((100,), torch.uint8, 100, "c")  # a new block: the doomed one is not reused
    assert pool.stats().registrations == 2 and again.block is not backing.block
    del view
    gc.collect()
    assert up.released == 1 and pool.stats().held_bytes == 100  # the doomed block went when its view did
    pool.deallocate(again)
    assert pool.trim() == 100 and up.released == 2


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeEvent:
    recorded: list[str] = []

    def __init__(self) -> None:
        self.stream: str | None = None

    def record(self, stream: FakeStream) -> None:
        self.stream = stream.name
        FakeEvent.recorded.append(stream.name)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        raise AssertionError("a completed event is never waited for")


def _fake_cuda(monkeypatch) -> threading.local:
    """torch.cuda with a per-thread current stream (``local.stream``) and capture flag
    (``local.capturing``)."""
    local = threading.local()
    FakeEvent.recorded = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: getattr(local, "stream", FakeStream("main")))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: getattr(local, "capturing", False))
    return local


def test_a_deferred_free_records_its_event_on_the_freeing_threads_stream(monkeypatch, managed):
    """A side-stream thread's finalizer free that another thread (on the main stream) gives back: the
    block's reuse waits for the side stream, not the main one."""
    local = _fake_cuda(monkeypatch)
    slow = SlowCapacity(JOIN_S)  # its capacity() is asked with the manager's lock held
    holding, release = slow.holding, slow.release

    pool = PoolResource(Counting(), tier="pinned")
    mm = managed(resources={"pinned": pool, "shared": slow}, reclaim=False)
    region = mm.allocate((64,), "uint8", "pinned", owner="x")
    holder = threading.Thread(target=lambda: mm.budget("shared"), daemon=True)  # on the main stream
    holder.start()
    assert holding.wait(JOIN_S)

    def side_free() -> None:
        local.stream = FakeStream("side")
        region.free_soon()  # the lock is held: given back by the holder

    t = threading.Thread(target=side_free)
    t.start()
    t.join(JOIN_S)
    assert FakeEvent.recorded == ["side"]  # recorded here, on the freeing thread, before the holder frees
    release.set()
    holder.join(JOIN_S)
    assert _stats(mm)["idle_bytes"] == 64 and FakeEvent.recorded == ["side"]
    mm.close()


def test_free_with_streams_records_on_each_and_reuse_waits_for_them(monkeypatch, managed):
    _fake_cuda(monkeypatch)
    waited: list[str] = []
    own = FakeEvent.query
    monkeypatch.setattr(FakeEvent, "query", lambda self: (waited.append(self.stream), own(self))[1])
    mm = managed(resources={"pinned": PoolResource(Counting(), tier="pinned")})
    region = mm.allocate((64,), "uint8", "pinned", owner="x")
    region.free(streams=(FakeStream("a"), FakeStream("b")))
    assert FakeEvent.recorded == ["a", "b"]
    again = mm.allocate((64,), "uint8", "pinned", owner="x")  # the same block: the host waits for a and b
    assert sorted(waited) == ["a", "b"] and _stats(mm)["pool_hits"] == 1
    again.free()
    mm.close()


def test_a_free_during_a_capture_records_no_event_and_is_not_reused_in_the_capture(monkeypatch, managed):
    local = _fake_cuda(monkeypatch)
    mm = managed(resources={"pinned": PoolResource(Counting(), tier="pinned")})
    region = mm.allocate((64,), "uint8", "pinned", owner="x")
    local.capturing = True
    region.free_soon(streams=(FakeStream("ws"),))
    assert FakeEvent.recorded == []
    during = mm.allocate((64,), "uint8", "pinned", owner="x")  # not the captured-free block: a new one
    assert _stats(mm)["pool_hits"] == 0 and _stats(mm)["registrations"] == 2
    local.capturing = False
    after = mm.allocate((64,), "uint8", "pinned", owner="x")  # now reused, its event recorded on ws first
    assert _stats(mm)["pool_hits"] == 1 and FakeEvent.recorded == ["ws"]
    during.free()
    after.free()
    mm.close()


def test_an_outgrown_device_block_goes_upstream_once_no_view_reads_it_and_pinned_ones_idle(managed):
    device_up, pinned_up = Counting(), Counting()
    mm = managed(device="cpu", resources={"device": PoolResource(device_up, tier="device"),
                                          "pinned": PoolResource(pinned_up, tier="pinned")})
    small = mm.allocate((16,), "int64", "device", owner="samplers.workspace")
    small.free(reuse=False)  # no view: released at once
    assert device_up.released == 1 and mm.stats()["pools"]["device"]["held_bytes"] == 0
    viewed = mm.allocate((24,), "int64", "device", owner="samplers.workspace")
    view = viewed.tensor()[:4]
    viewed.free_soon(reuse=False)
    assert device_up.released == 1 and mm.stats()["pools"]["device"]["held_bytes"] == 24 * 8
    del view
    gc.collect()
    assert device_up.released == 2 and mm.stats()["pools"]["device"]["held_bytes"] == 0
    again = mm.allocate((16,), "int64", "device", owner="samplers.workspace")
    again.free()  # reuse=True (the default): idles for the next request of its size
    assert mm.stats()["pools"]["device"]["idle_bytes"] == 16 * 8 and device_up.released == 2
    staging = mm.allocate((16,), "int64", "pinned", owner="samplers.workspace")
    staging.free(reuse=False)  # pinned: kept (releasing would unregister, a sync of every GPU)
    assert pinned_up.released == 0 and _stats(mm)["idle_bytes"] == 16 * 8
    mm.close()
