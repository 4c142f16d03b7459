"""The split copy of a large batch of transitions (`replay.transition_kernel.sample_transitions` above
``2 * SPLIT_BYTES``): drawn in one compiled call under the shard mutexes, copied by groups of rows that
the caller and the copy helpers (`replay.copy_helpers.CopyHelpers`) claim, then released and counted.
Byte for byte the batch of the one-call path, whoever copies which group; a helper that comes late writes
nothing; a copy that raises releases the mutexes and counts nothing; small batches keep the one call."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _forked import check_in_fork

import replay.copy_helpers as ch
import replay.transition_kernel as tk
from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.locked_draw import release

# a page-sized field (streamed, with the page prefetch) and small ones (the constant-size row copies)
SPEC = TrajectorySpec(
    {"pos": ((), "int64"), "img": ((4104,), "uint8"), "r": ((), "float32"), "done": ((), "bool")}
)


def image(p: np.ndarray) -> np.ndarray:
    return ((p[:, None] * 7 + np.arange(4104)) % 251).astype(np.uint8)


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    """``n`` steps whose every field is a function of ``pos``."""
    p = np.arange(start, start + n, dtype=np.int64)
    return {
        "pos": p,
        "img": image(p),
        "r": (p * 0.5).astype(np.float32),
        "done": p % 3 == 0,
    }


def make_store(mm, shards: int, prioritized: bool, seed: int = 11) -> ReplayStore:
    store = ReplayStore(
        SPEC, 160 * shards, shards, memory=mm, seed=seed, timeout=5.0,
        selector=Prioritized(0.6) if prioritized else Uniform(),
    )
    w = store.writer(chunk_steps=16)
    pos = 0
    for n in (40, 70, 33, 90, 61, 25) * shards:
        w.extend(steps(pos, n))
        w.end_episode()
        pos += n
    w.close()
    if prioritized:
        store.update_priorities(store.sample(8).keys, np.linspace(0.2, 3.0, 8))
    return store


def shards_free(store) -> bool:
    """Another thread takes and releases every shard mutex within 5 s."""

    def take() -> None:
        for sh in store.storage.shards:
            sh.acquire()
            sh.release()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(5.0)
    return not t.is_alive()


def force_split(monkeypatch, threads: int = 2, group_bytes: int = 3 * 4129) -> None:
    """Every batch takes the split path on ``threads`` threads, in groups of three rows."""
    monkeypatch.setattr(tk, "SPLIT_BYTES", 1)
    monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: threads)
    monkeypatch.setattr(tk, "idle_cores", lambda cores, own=0: cores - 1)
    monkeypatch.setattr(tk, "GROUP_BYTES", group_bytes)


def assert_same(a, b) -> None:
    for name in SPEC:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    np.testing.assert_array_equal(a.keys.numpy(), b.keys.numpy())
    np.testing.assert_array_equal(a.probabilities.numpy(), b.probabilities.numpy())
    np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())
    assert a.table_size == b.table_size and a.mask.numpy().all()
    p = a["pos"].numpy()[:, 0]  # every row is the whole step its pos names
    np.testing.assert_array_equal(a["img"].numpy()[:, 0], image(p))


@pytest.mark.parametrize("shards,prioritized", [(1, False), (2, True)])
def test_the_split_copy_equals_the_one_call(monkeypatch, shards, prioritized):
    with MemoryManager() as mm:
        split, one = make_store(mm, shards, prioritized), make_store(mm, shards, prioritized)
        copied = []
        batch = tk.copy_batch
        for b, threads in ((256, 2), (7, 2), (1, 2), (100, 2), (256, 1)):  # 1 thread: the one call
            with monkeypatch.context() as m:
                force_split(m, threads)
                m.setattr(tk, "copy_batch", lambda *a: copied.append(a[6]) or batch(*a))
                got = split.sample(b, 1, beta=0.4)
            want = one.sample(b, 1, beta=0.4)
            assert_same(got, want)
            got.release()
            want.release()
        assert copied == [86, 3, 1, 34]  # groups of 3 rows: the split path each time
        with monkeypatch.context() as m:  # commits pending: the held path (shard locks taken in Python)
            force_split(m)
            for s in (split, one):
                w = s.writer()
                w.extend(steps(10_000, 30))
                w.end_episode()
                w.close()
            got = split.sample(200, 1, beta=0.4)
        want = one.sample(200, 1, beta=0.4)
        assert_same(got, want)
        np.testing.assert_array_equal(split.table.state.times, one.table.state.times)
        assert split.counters() == one.counters()
        split.close()
        one.close()


def test_groups_copied_by_many_threads_at_once_make_the_same_batch():
    """The protocol itself: `_sample_locked` draws and leaves the copy; three compiled helpers and the
    caller claim groups of one row concurrently; the batch is closed, then `release` unlocks and counts.
    A helper that comes after the close writes nothing."""
    with MemoryManager() as mm:
        store, ref = make_store(mm, 2, True), make_store(mm, 2, True)
        table = store.table
        b = 120
        slot = store._sampler.staging.acquire(b, 1, None, None)
        keys, prob, weights = np.zeros(b, np.int64), np.zeros(b), np.zeros(b, np.float32)
        helpers = ch.CopyHelpers(idle_spins=0)
        try:
            with table.lock:
                bell = helpers.ring(3)
                assert len(helpers.threads) == 3 and helpers.ring(1) is None  # one batch at a time
                status, live, nbytes, died = tk._sample_locked(
                    table.plan, False, table._repairs, table._words, slot.addresses, 0, keys, prob,
                    slot.mask_flat, 0.4, weights, 0,
                )
                assert (status, nbytes, died) == (tk._COPYING, b * SPEC.step_bytes, 0)
                ch.copy_batch(helpers.ctl, bell, table.plan, keys, slot.addresses, 1, b)
                assert helpers.ctl[ch._C_DONE] == b  # every group copied once the caller returns
                helpers.close(bell)
                status, err, more = release(table.plan, False, b)
                assert (status, err, more) == (tk.DRAWN, 0, 0)
            want = ref.sample(b, 1, beta=0.4)
            for name in SPEC:
                np.testing.assert_array_equal(slot.fields[name].numpy()[:b], want[name].numpy())
            np.testing.assert_array_equal(keys, want.keys.numpy())
            np.testing.assert_array_equal(weights, want.weights.numpy())
            assert store.counters() == ref.counters()
            poison = np.full(b * SPEC.step_bytes, 0xAB, np.uint8)  # a late helper: nothing left to claim
            late = poison.ctypes.data + np.cumsum([0, b * 8, b * 4104, b * 4], dtype=np.int64)
            helpers.ctl[ch._C_DST] = late.ctypes.data
            assert ch._copy_claimed(helpers.ctl, bell, ch._C_MINE) == -1
            assert (poison == 0xAB).all()
            bell = helpers.ring(3)  # a batch closed before it was published: an empty one
            helpers.close(bell)
            assert ch._copy_claimed(helpers.ctl, bell, ch._C_MINE) == -1 and helpers.ring(1) == bell + 1
            helpers.close(bell + 1)
        finally:
            helpers.stop()
        assert helpers.threads == []
        slot.buffer.release()
        want.release()
        store.close()
        ref.close()




def test_a_batch_closed_midway_withdraws_the_groups_not_claimed():
    """`CopyHelpers.close` of a batch whose groups are partly claimed (the caller raised mid-copy) waits
    for the claimed ones only and withdraws the rest: a helper claiming after it gets nothing (it would
    copy the aborted batch's rows over the slot's next batch)."""
    helpers = ch.CopyHelpers()  # no thread started: the claims are this test's
    plan, keys, dst = np.zeros(8, np.int64), np.zeros(10, np.int64), np.zeros(1, np.int64)
    bell = helpers.ring(0)
    assert ch._claim(helpers.ctl, bell) == -2  # rung, not yet published
    ch._post(helpers.ctl, bell, plan, keys, dst, 1, 10)
    assert [ch._claim(helpers.ctl, bell) for _ in range(3)] == [0, 1, 2]
    helpers.ctl[ch._C_DONE] = 3  # the three claimed groups copied
    helpers.close(bell)
    assert ch._claim(helpers.ctl, bell) == -1 and ch._copy_claimed(helpers.ctl, bell, ch._C_MINE) == -1
    assert helpers.ctl[ch._C_HOLDER] == 0 and helpers.ring(0) == bell + 1
    helpers.close()
    assert helpers.ctl[ch._C_HOLDER] == 0

def test_a_signal_as_the_bell_rings_still_frees_the_helpers(monkeypatch):
    """A signal's exception raised as `CopyHelpers.ring` returns, its bell lost to the caller: the batch
    is still closed, so the helper goes back to sleep (not spinning on a batch never published) and the
    next batch gets the helpers (not the one call for good)."""
    force_split(monkeypatch)
    helpers = ch.CopyHelpers()
    monkeypatch.setattr(ch, "_HELPERS", helpers)
    ring, rung = ch.CopyHelpers.ring, []

    def ring_then_signal(self, n):
        ring(self, n)
        raise KeyboardInterrupt  # what the handler raises at the caller's next call

    try:
        with MemoryManager() as mm:
            store = make_store(mm, 2, True)
            with monkeypatch.context() as m:
                m.setattr(ch.CopyHelpers, "ring", ring_then_signal)
                with pytest.raises(KeyboardInterrupt):
                    store.sample(120, 1)
            assert shards_free(store)
            deadline = time.monotonic() + 5.0
            while helpers.ctl[ch._C_SLEEP] < 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            assert helpers.ctl[ch._C_SLEEP] == 1, "the helper spins on a batch that is never published"
            monkeypatch.setattr(ch.CopyHelpers, "ring", lambda s, n: rung.append(ring(s, n)) or rung[-1])
            store.sample(120, 1).release()
            assert rung and rung[0] is not None, "the helpers stay held by the interrupted batch"
            store.close()
    finally:
        helpers.stop()

def test_a_copy_that_raises_releases_the_shards_and_counts_nothing(monkeypatch):
    with MemoryManager() as mm:
        store = make_store(mm, 2, False)
        before = store.counters()

        def broken(*args):
            raise RuntimeError("copy failed")

        with monkeypatch.context() as m:
            force_split(m)
            m.setattr(tk, "copy_batch", broken)
            with pytest.raises(RuntimeError, match="copy failed"):
                store.sample(64, 1)
        assert store.counters()["samples"] == before["samples"]
        assert shards_free(store)
        batch = store.sample(64, 1)  # and the store samples on
        assert batch.mask.numpy().all()
        batch.release()
        assert store.counters()["samples"] == before["samples"] + 64
        store.close()


def test_only_batches_of_two_split_bytes_take_the_split_path(monkeypatch):
    """The threshold: the one compiled call below ``2 * SPLIT_BYTES`` of output, the split path from
    it (the one call, no team, when `graphrl.threads.threads_for` says one thread or no core is idle;
    helpers only on idle cores)."""
    calls, splits = [], []
    ring = ch.CopyHelpers.ring
    monkeypatch.setattr(ch.CopyHelpers, "ring", lambda self, n: calls.append(n) or ring(self, n))
    draw, once = tk._draw_held, tk._sample_locked  # the split path's draw, the one call
    by_call = tk._sample_call  # the one call with its fixed arrays by address (`slot_call`)
    monkeypatch.setattr(tk, "_draw_held", lambda *a: splits.append(a[11]) or draw(*a))
    monkeypatch.setattr(tk, "_sample_locked", lambda *a: splits.append(a[11]) or once(*a))
    monkeypatch.setattr(tk, "_sample_call", lambda *a: splits.append(tk._NO_SPLIT) or by_call(*a))
    with MemoryManager() as mm:
        store = make_store(mm, 1, False)
        rows = 2 * tk.SPLIT_BYTES // SPEC.step_bytes  # just under the threshold
        monkeypatch.setattr(tk, "SPLIT_BYTES", rows * SPEC.step_bytes // 2)
        store.sample(rows - 1, 1).release()
        assert calls == []
        monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: 1)
        store.sample(rows, 1).release()
        monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: 3)
        monkeypatch.setattr(tk, "idle_cores", lambda cores, own=0: 0)  # no idle core: one thread
        store.sample(rows, 1).release()
        monkeypatch.setattr(tk, "idle_cores", lambda cores, own=0: 1)  # helpers only on idle cores
        store.sample(rows, 1).release()
        assert calls == [1]  # one thread: the one call (draw and copy), no helper
        # the first sample ingests the commits first (its draw is called again, the shard locks held)
        assert splits == [tk._NO_SPLIT] * 4 + [2 * tk.SPLIT_BYTES]
        store.close()



@pytest.mark.parametrize("machine,byteorder", [("riscv64", "little"), ("x86_64", "big")])
def test_no_copy_helper_starts_without_a_known_futex(monkeypatch, machine, byteorder):
    """On a machine whose futex number (or the byte order of its word) is not known, the split batch
    takes the one-thread copy: no helper thread starts, the batch is the one call's, one warning."""
    import replay._sync as sync

    monkeypatch.setattr(sync.platform, "machine", lambda: machine)
    monkeypatch.setattr(sync.sys, "byteorder", byteorder)
    helpers = ch.CopyHelpers()
    monkeypatch.undo()
    monkeypatch.setattr(ch.platform, "machine", lambda: machine)
    monkeypatch.setattr(ch, "_HELPERS", helpers)
    draws = []
    draw, once = tk._draw_held, tk._sample_locked  # the split path's draw, the one call
    monkeypatch.setattr(tk, "_draw_held", lambda *a: draws.append(a[11]) or draw(*a))
    monkeypatch.setattr(tk, "_sample_locked", lambda *a: draws.append(a[11]) or once(*a))
    with MemoryManager() as mm:
        split, one = make_store(mm, 2, True), make_store(mm, 2, True)
        force_split(monkeypatch)
        with pytest.warns(RuntimeWarning, match=machine) as said:
            for _ in range(3):
                got, want = split.sample(120, 1, beta=0.4), one.sample(120, 1, beta=0.4)
                assert_same(got, want)
                got.release()
                want.release()
        assert len(said) == 1 and helpers.threads == [] and helpers.ctl[ch._C_HOLDER] == 0
        assert draws[-3:] == [tk._NO_SPLIT] * 3
        split.close()
        one.close()


def wait_asleep(helpers, n: int) -> None:
    deadline = time.monotonic() + 5.0
    while helpers.ctl[ch._C_SLEEP] < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert helpers.ctl[ch._C_SLEEP] == n


def test_a_ring_wakes_only_the_helpers_it_asks_for():
    """After a batch of three helpers, a batch of one wakes one: the other two sleep on (each woken
    helper counts the batch in its own word)."""
    helpers = ch.CopyHelpers(idle_spins=0)
    try:
        helpers.close(helpers.ring(3))  # started: a helper that read the bell after it rang waits on
        time.sleep(0.2)
        wait_asleep(helpers, 3)
        for n in (3, 1, 2, 1, 3, 0):  # from here every helper sleeps on the current bell before a ring
            before = helpers.woken()
            helpers.close(helpers.ring(n))
            deadline = time.monotonic() + 5.0
            while helpers.ctl[ch._C_TICKETS] and time.monotonic() < deadline:  # every ticket taken
                time.sleep(0.001)
            wait_asleep(helpers, 3)  # (a woken helper counts its batch before it sleeps again)
            assert sum(helpers.woken()) - sum(before) == n
    finally:
        helpers.stop()
    assert helpers.threads == []


def test_helpers_spinning_after_a_batch_count_as_awake_until_they_sleep():
    """`CopyHelpers.awake`: a helper spinning for the next batch is awake (its core is the process's), one
    asleep on the bell is not."""
    spinning = ch.CopyHelpers(idle_spins=1 << 62)  # spins between batches until stopped
    sleeping = ch.CopyHelpers(idle_spins=0)
    try:
        assert spinning.awake() == 0 and sleeping.awake() == 0  # none started
        spinning.close(spinning.ring(2))
        sleeping.close(sleeping.ring(2))
        wait_asleep(sleeping, 2)
        assert sleeping.awake() == 0
        time.sleep(0.05)
        assert spinning.ctl[ch._C_SLEEP] == 0 and spinning.awake() == 2
    finally:
        spinning.stop()
        sleeping.stop()
    assert spinning.awake() == 0 and sleeping.awake() == 0


def test_the_split_asks_for_idle_cores_counting_its_awake_helpers(monkeypatch):
    """`sample_transitions` passes the helpers awake right now as `graphrl.threads.idle_cores`' ``own``:
    /proc/loadavg counts a helper spinning after the last batch as running, yet its core is the batch's."""
    asked = []
    force_split(monkeypatch)
    monkeypatch.setattr(tk, "idle_cores", lambda cores, own=0: asked.append((cores, own)) or cores - 1)
    monkeypatch.setattr(ch.CopyHelpers, "awake", lambda self: 7)
    with MemoryManager() as mm:
        store = make_store(mm, 1, False)
        store.sample(64, 1).release()
        store.close()
    assert asked and all(a == (2, 7) for a in asked)


def test_a_woken_helper_sleeps_while_the_draw_waits_for_a_shard_lock(monkeypatch):
    """A batch whose draw waits 0.3 s for a writer's shard lock: the helper rung before the draw spins
    about 50 us, then sleeps until the batch is published (it spun or yielded the whole wait: a core a
    writer on a small machine needs). The process's CPU time beyond the caller's stays small."""
    helpers = ch.CopyHelpers()
    monkeypatch.setattr(ch, "_HELPERS", helpers)
    try:
        with MemoryManager() as mm:
            store, ref = make_store(mm, 2, True), make_store(mm, 2, True)
            force_split(monkeypatch)
            store.sample(120, 1, beta=0.4).release()  # helper started, everything compiled
            ref.sample(120, 1, beta=0.4).release()
            taken = threading.Event()

            def writer() -> None:
                for sh in store.storage.shards:
                    sh.acquire()
                taken.set()
                time.sleep(0.3)
                for sh in store.storage.shards:
                    sh.release()

            t = threading.Thread(target=writer)
            t.start()
            taken.wait(5.0)
            woken = sum(helpers.woken())
            cpu, mine, start = time.process_time(), time.thread_time(), time.monotonic()
            got = store.sample(120, 1, beta=0.4)
            others = (time.process_time() - cpu) - (time.thread_time() - mine)
            waited = time.monotonic() - start
            t.join()
            assert waited >= 0.25 and sum(helpers.woken()) == woken + 1
            assert others < 0.1, f"{others:.3f} s of CPU beside the caller in a {waited:.3f} s wait"
            want = ref.sample(120, 1, beta=0.4)
            assert_same(got, want)
            got.release()
            want.release()
            store.close()
            ref.close()
    finally:
        helpers.stop()


def test_a_compiled_helper_copies_groups_of_a_split_batch(monkeypatch):
    """On two threads (the caller and one helper), the helper, woken before the draw, copies groups of
    the batch (counted in its own word), and the batch is the one call's; each group copied once."""
    helpers = ch.CopyHelpers()
    monkeypatch.setattr(ch, "_HELPERS", helpers)
    try:
        with MemoryManager() as mm:
            split, one = make_store(mm, 2, True), make_store(mm, 2, True)
            force_split(monkeypatch, threads=2, group_bytes=4129)  # a group a row: 240 groups
            deadline = time.monotonic() + 10.0  # the helper is on another core only when the scheduler
            while True:  # says so: a busy moment of the machine (the suite's other processes) can last
                before, mine = sum(helpers.copied()), int(helpers.ctl[ch._C_MINE])
                got = split.sample(240, 1, beta=0.4)
                by_helper = sum(helpers.copied()) - before
                assert by_helper + int(helpers.ctl[ch._C_MINE]) - mine == 240
                with monkeypatch.context() as m:
                    m.setattr(tk, "threads_for", lambda work, chunk_work: 1)  # the one call
                    want = one.sample(240, 1, beta=0.4)
                assert_same(got, want)
                got.release()
                want.release()
                if by_helper > 0 or time.monotonic() > deadline:
                    break
            assert len(helpers.threads) == 1 and by_helper > 0, "no group copied by the helper in 10 s"
            split.close()
            one.close()
    finally:
        helpers.stop()


def test_a_forked_child_gets_its_own_copy_helpers_made_once(monkeypatch):
    """Helper threads do not survive ``fork``: the child's process helpers (`replay.copy_helpers.
    process_helpers`) are new ones, made exactly once by the module's fork hook, none started and not
    held, and they start in the child (where the machine has a known futex); the parent's stay its own."""
    made = []

    class Counted(ch.CopyHelpers):
        def __init__(self, *args, **kwargs) -> None:
            made.append(1)
            super().__init__(*args, **kwargs)

    parent = ch.process_helpers()
    monkeypatch.setattr(ch, "CopyHelpers", Counted)

    def child() -> None:
        mine = ch.process_helpers()
        assert len(made) == 1, f"the fork hook made {len(made)} CopyHelpers"
        assert isinstance(mine, Counted) and mine is not parent
        assert mine.threads == [] and not mine.ctl.any()
        if not mine.supported:
            return
        try:
            bell = mine.ring(1)
            assert bell == 1 and len(mine.threads) == 1
            mine.close(bell)
            assert mine.ctl[ch._C_HOLDER] == 0
            wait_asleep(mine, 1)  # the helper runs in the child
        finally:
            mine.stop()

    check_in_fork(child)
    assert ch.process_helpers() is parent and made == []


def test_a_helper_that_reaches_its_loop_after_stop_rang_still_quits(monkeypatch):
    """`CopyHelpers.stop` right after `ring` on a loaded machine: the helper thread started, but reached
    its compiled loop only after stop's quit bell rang, so the first bell it read was that one. It must
    quit all the same (it waited for a next bell for good, and stop waited for it in ``join``)."""
    real, go = ch._helper_loop, threading.Event()

    class Late:  # the thread is scheduled late: the loop starts once stop has rung
        compile = staticmethod(real.compile)

        def __call__(self, ctl, idle_spins, me):
            go.wait(5.0)
            real(ctl, idle_spins, me)

    monkeypatch.setattr(ch, "_helper_loop", Late())
    helpers = ch.CopyHelpers(idle_spins=0)
    helpers.close(helpers.ring(1))
    stopper = threading.Thread(target=helpers.stop, daemon=True)
    stopper.start()
    deadline = time.monotonic() + 5.0
    while helpers.ctl[ch._C_BELL] < 2 and time.monotonic() < deadline:  # stop's quit bell rang
        time.sleep(0.001)
    go.set()
    stopper.join(5.0)
    assert not stopper.is_alive(), "stop waits for a helper that never saw the quit"
    assert helpers.threads == []
