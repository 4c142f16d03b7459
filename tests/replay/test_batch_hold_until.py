"""`replay.batch.Batch.to`: a non-blocking copy to a GPU holds its source's staging slot until the copies read
it (`graphrl.stream_order.copy_event`, `graphrl.tensors.StagingBuffer.hold_until`), however the batch is then
released (`release`, a ``with`` block, garbage collection), and nothing waits for it on the host: the pool
polls the event. On the CPU a fake event stands for the CUDA one (the copies go to the meta device); the
``gpu`` test does the real non-blocking copy behind a busy GPU and compares it with the host batch."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from _fakes import FakeEvent

import replay.batch
from graphrl.memory import MemoryManager
from graphrl.stream_order import copy_event
from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32")})


@pytest.fixture
def events(monkeypatch):
    """The events `Batch.to` records: a fake one for each copy to the meta device (no GPU here)."""
    made: list[FakeEvent] = []

    def fake(device: torch.device, non_blocking: bool):
        if device.type != "meta" or not non_blocking:
            return copy_event(device, non_blocking)
        made.append(FakeEvent())
        return made[-1]

    monkeypatch.setattr(replay.batch, "copy_event", fake)
    return made


def make_store(mm: MemoryManager, slots: int = 1) -> ReplayStore:
    store = ReplayStore(SPEC, 128, 1, memory=mm, seed=5, staging_slots=slots, timeout=5.0)
    with store.writer() as w:
        p = np.arange(1, 61, dtype=np.int64)
        obs = (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
        w.add_episode({"pos": p, "obs": obs})
    return store


def held(store: ReplayStore) -> bool:
    """Whether the store's only staging slot is held: a sample then times out."""
    try:
        store.sample(4, 3, timeout=0.02).release()
    except TimeoutError:
        return True
    return False


@pytest.mark.parametrize("how", ["release", "with", "copy_release", "drop"])
def test_a_copied_batch_holds_its_slot_until_the_copy_completes_however_released(events, how):
    with MemoryManager() as mm:
        store = make_store(mm)
        batch = store.sample(4, 3)
        ptr = batch["pos"].data_ptr()
        copy = batch.to("meta")
        assert len(events) == 1 and copy["pos"].device.type == "meta" and copy.mask.device.type == "meta"
        if how == "release":
            batch.release()
        elif how == "with":
            with copy:
                pass
        elif how == "copy_release":
            copy.release()  # a copy's release releases its source
        else:
            del batch, copy
            gc.collect()
        assert batch.released if how in ("release", "with", "copy_release") else True
        assert held(store)  # the copy may still read the slot: never handed out
        assert events[0].queries >= 1 and events[0].synchronized == 0  # polled, never waited for
        events[0].done = True
        again = store.sample(4, 3, timeout=0.02)
        assert again["pos"].data_ptr() == ptr  # the same slot, handed out once the copy completed
        again.release()
        store.close()


def test_release_never_waits_and_a_kept_tensor_still_holds_the_slot(events):
    with MemoryManager() as mm:
        store = make_store(mm)
        batch = store.sample(4, 3)
        pos = batch["pos"]
        want = pos.clone()
        batch.to("meta")  # the copy dropped at once
        del batch
        gc.collect()
        events[0].done = True  # the copy is over, but `pos` still views the slot
        assert held(store)
        assert torch.equal(pos, want)
        del pos
        assert not held(store)
        assert events[0].synchronized == 0
        store.close()


def test_a_blocking_copy_or_one_to_the_cpu_holds_nothing(events):
    with MemoryManager() as mm:
        store = make_store(mm)
        for device, non_blocking in (("meta", False), ("cpu", True)):
            batch = store.sample(4, 3)
            copy = batch.to(device, non_blocking=non_blocking)
            batch.release()
            assert not events and not held(store)
            if device == "cpu":  # a copy that owns its memory
                assert copy["pos"].data_ptr() != batch["pos"].data_ptr()
        store.close()


def test_a_copy_of_a_released_batch_holds_nothing(events):
    with MemoryManager() as mm:
        store = make_store(mm)
        batch = store.sample(4, 3)
        batch.release()
        batch.to("meta")
        assert len(events) == 1 and not held(store)  # the slot was given back before the copy
        store.close()


def test_close_waits_for_pending_copies(events):
    with MemoryManager() as mm:
        store = make_store(mm, slots=2)
        first, second = store.sample(4, 3), store.sample(4, 3)
        first.to("meta")
        second.to("meta")
        first.release()
        del second
        gc.collect()
        store.close()  # frees the pool's memory: the copies must have read it first
        assert [e.synchronized for e in events] == [1, 1]


def test_copy_event_records_only_for_a_non_blocking_copy_to_cuda():
    assert copy_event(torch.device("cpu"), True) is None
    assert copy_event(torch.device("meta"), True) is None
    assert copy_event(torch.device("cuda"), False) is None


@pytest.mark.gpu
def test_dropped_batches_copied_behind_a_busy_gpu_equal_the_host_batches():
    """Real non-blocking copies from pinned slots, queued behind ~20 ms of GPU sleep, their batches released
    or dropped at once: the next samples (one slot) must not overwrite the slot before the copy read it."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with MemoryManager() as mm:
        store = make_store(mm, slots=1)
        for how in ("release", "drop", "with"):
            for _ in range(3):
                batch = store.sample(16, 4)
                want = {n: batch[n].clone() for n in SPEC}
                torch.cuda._sleep(20_000_000)  # the copy waits behind this on the stream
                copy = batch.to("cuda")
                got = {n: copy[n] for n in SPEC}
                if how == "release":
                    batch.release()
                elif how == "with":
                    with batch:
                        pass
                del batch, copy  # dropped: released when unused (the copy kept its source till now)
                for _ in range(3):  # would overwrite the slot if it were handed out before the copy read it
                    store.sample(16, 4).release()
                for n in SPEC:
                    assert torch.equal(got[n].cpu(), want[n]), (how, n)
        store.close()
