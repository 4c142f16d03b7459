"""ReplayStore.sample(device="cuda"): the GPU gather path (pinned rings read in place by a numba.cuda kernel)
run under numba's CUDA simulator in a subprocess (the simulator must be chosen before numba.cuda is first
imported), compared byte for byte with the CPU path; and the clear error without CUDA."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec

COMMON = textwrap.dedent(
    """
    import gc
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from graphrl.memory import MemoryManager
    from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform

    # int64, float32 [2, 3], bool, and 3-byte rows (the kernel's byte path next to its 8-byte words)
    SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32"), "done": ((), "bool"),
                           "rgb": ((3,), "uint8")})

    def cols(start, n):
        pos = np.arange(start, start + n, dtype=np.int64)
        obs = (pos[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
        rgb = (pos[:, None] * 7 + np.arange(3)).astype(np.uint8)
        return {"pos": pos, "obs": obs, "done": pos % 3 == 0, "rgb": rgb}

    def filled(mm, selector, shards=2, capacity=40):
        # rings of 20 steps a shard, written ~2.5 times over (wrapped), the last episodes left open
        store = ReplayStore(SPEC, capacity, shards, selector=selector, memory=mm, seed=7, timeout=5.0,
                            staging_slots=2)
        store.device_gather_min_bytes = 0  # every batch through the GPU kernel, however small
        rng = np.random.default_rng(3)
        writers = [store.writer() for _ in range(shards)]
        start = 0
        for i in range(24):
            n = int(rng.integers(1, 9))
            w = writers[i % shards]
            w.extend(cols(start, n))
            start += n
            if i < 24 - shards:
                w.end_episode()
            else:
                w.flush()  # committed, episode still open: windows stop at the write cursor
        return store, writers
    """
)

EQUAL = COMMON + textwrap.dedent(
    """
    def same(a, b):
        assert set(a) == set(b)
        for name in a:
            x, y = a[name], b[name]
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert np.array_equal(x.numpy().view(np.uint8), y.numpy().view(np.uint8)), name
        for attr in ("mask", "keys", "probabilities", "weights", "lengths"):
            x, y = getattr(a, attr), getattr(b, attr)
            assert x.dtype == y.dtype and torch.equal(x, y), attr
        assert a.table_size == b.table_size

    checked = 0
    for selector in (Uniform(), Prioritized(0.6)):
        for shards in (1, 3):
            mm_cpu, mm_gpu = MemoryManager(), MemoryManager()
            cpu, _ = filled(mm_cpu, selector, shards, capacity=20 * shards)
            gpu, _ = filled(mm_gpu, selector, shards, capacity=20 * shards)
            assert cpu.storage.shards[0].write_pos > cpu.shard_capacity  # the rings wrapped
            # two slots a shape, reused with the other padding: stale bytes must not survive in padding
            plan = [(5, 4, p) for p in ("tail", "tail", "head", "head", "tail")]
            plan += [(3, 9, p) for p in ("head", "head", "tail", "tail", "head")]
            for b, length, pad in plan:
                x = cpu.sample(b, window=length, pad=pad, beta=0.4)
                y = gpu.sample(b, window=length, pad=pad, beta=0.4, device="cuda")
                assert not x.mask.all() and x.mask.any(), "padding was exercised"
                same(x, y)
                # the GPU batch is a slot of the device staging pool, not a host staging slot or a copy
                assert y._buffer is not None and y._buffer._pool.owner == "replay.device_staging"
                x.release(); y.release()
                checked += 1
            stats = mm_gpu.stats()
            assert stats["pinned"]["replay.uva"]["regions"] == shards * len(SPEC)  # rings registered once
            assert "replay.uva" not in mm_cpu.stats()["pinned"]
            gpu.close()
            assert mm_gpu.stats()["pinned"].get("replay.uva", {"regions": 0})["regions"] == 0  # unregistered
            cpu.close(); mm_cpu.close(); mm_gpu.close()

    # device slots follow the host pool's rule: held until the batch is released (or collected)
    mm = MemoryManager()
    store, _ = filled(mm, Uniform())
    held = [store.sample(4, window=3, device="cuda", timeout=0.1) for _ in range(2)]
    try:
        store.sample(4, window=3, device="cuda", timeout=0.05)
        raise AssertionError("a third batch while both slots are held must wait, then time out")
    except TimeoutError:
        pass
    held[0].release()
    again = store.sample(4, window=3, device="cuda", timeout=0.1)
    del held, again
    gc.collect()
    assert store.sample(4, window=3, device="cuda", timeout=0.1).batch_size == 4
    store.close(); mm.close()
    print("OK", checked)
    """
)

STALE = COMMON + textwrap.dedent(
    """
    import replay.cuda as rc
    real = rc.gather_fields_cuda
    mixed = 0
    for seed in range(6):
        mm = MemoryManager()
        store = ReplayStore(SPEC, 10, 1, memory=mm, seed=seed, timeout=5.0)
        store.device_gather_min_bytes = 0
        w = store.writer()
        w.extend(cols(0, 10)); w.end_episode()
        calls, stale = [], []

        def overwrite_then_gather(*args, **kwargs):
            if not calls:  # a writer commits while the kernel reads the ring (no lock held during the copy)
                w.extend(cols(100, 6)); w.end_episode()  # positions 10..15 overwrite slots 0..5
            calls.append(1)
            return real(*args, **kwargs)

        real_stale = store.storage.stale

        def spy(*args):
            out = real_stale(*args)
            stale.append(out.copy())
            return out

        rc.gather_fields_cuda = overwrite_then_gather
        store.storage.stale = spy
        b = store.sample(4, window=3, device="cuda")
        rc.gather_fields_cuda = real
        assert stale[0].any() and len(calls) >= 2, (stale, calls)  # stale windows found and drawn again
        mixed += bool((~stale[0]).any())  # ... while the good ones were kept (compacted to the front)
        for i in range(4):
            pos = np.asarray(b["pos"][i][b.mask[i]].tolist())
            assert (np.diff(pos) == 1).all() and (pos >= 6).all(), pos  # nothing from overwritten slots
            assert (pos < 10).all() or (pos >= 100).all(), pos  # never across the episode boundary
            assert (b["rgb"][i][b.mask[i]].numpy() == (pos[:, None] * 7 + np.arange(3)) % 256).all()
            assert (b["obs"][i][~b.mask[i]] == 0).all()
        assert int(store.counters()["samples"]) == int(b.lengths.sum())  # only the kept windows count
        store.close(); mm.close()
    assert mixed, "no seed drew a batch with both stale and good windows"
    print("OK", mixed)
    """
)


RULE = COMMON + textwrap.dedent(
    """
    import replay.cuda as rc
    from replay.sampler import DEVICE_GATHER_MIN_BYTES
    real = rc.gather_fields_cuda
    launched = []

    def counting(*args, **kwargs):
        launched.append(1)
        return real(*args, **kwargs)

    rc.gather_fields_cuda = counting
    step = sum(f.row_bytes for f in SPEC.values())  # 36 bytes
    mm_a, mm_b = MemoryManager(), MemoryManager()
    a, _ = filled(mm_a, Uniform())
    b, _ = filled(mm_b, Uniform())
    a.device_gather_min_bytes = DEVICE_GATHER_MIN_BYTES
    assert a.device_gather_min_bytes == DEVICE_GATHER_MIN_BYTES > 0
    x = a.sample(5, window=4, device="cuda")  # 720 bytes: below the crossover, gathered on the host
    assert not launched and x._buffer is None and x._source._buffer._pool.owner == "replay.staging"
    b.device_gather_min_bytes = 0
    y = b.sample(5, window=4, device="cuda")
    assert launched and y._buffer._pool.owner == "replay.device_staging"
    for name in SPEC:
        assert torch.equal(x[name], y[name]), name
    for attr in ("mask", "keys", "probabilities", "weights", "lengths"):
        assert torch.equal(getattr(x, attr), getattr(y, attr)), attr
    n = len(launched)
    a.device_gather_min_bytes = 5 * 4 * step  # exactly the batch's bytes: on the device
    a.sample(5, window=4, device="cuda").release()
    assert len(launched) > n  # one launch a shard drawn from
    n = len(launched)
    a.device_gather_min_bytes = 5 * 4 * step + 1
    a.sample(5, window=4, device="cuda").release()
    assert len(launched) == n
    for bad in (-1, 1.5, "8"):
        try:
            a.device_gather_min_bytes = bad
            raise AssertionError(bad)
        except ValueError as exc:
            assert "device_gather_min_bytes" in str(exc)
    x.release(); y.release()
    a.close(); b.close(); mm_a.close(); mm_b.close()
    print("OK")
    """
)


def run(part) -> str:
    """A script's output, stripped, once it ran to its end."""
    assert part.ok, part.output
    return part.output.strip()


@pytest.mark.slow
@pytest.mark.simulated(EQUAL)
def test_simulated_gpu_batches_equal_the_cpu_batches_byte_for_byte(simulated_part):
    assert run(simulated_part).startswith("OK 40")


@pytest.mark.slow
@pytest.mark.simulated(STALE, patches=True)  # replay.cuda.gather_fields_cuda (restored) and a store's stale
def test_simulated_gpu_gather_redraws_windows_overwritten_during_the_copy(simulated_part):
    assert run(simulated_part).startswith("OK")


@pytest.mark.simulated(RULE, patches=True)  # leaves replay.cuda.gather_fields_cuda wrapped
def test_small_gpu_batches_are_gathered_on_the_host_and_copied_up(simulated_part):
    """`replay.sampler.gathers_on_device`: below ``device_gather_min_bytes`` no kernel is launched and the
    batch (the same bytes) comes from a host slot copied up; from it on, the GPU kernel gathers."""
    assert run(simulated_part).startswith("OK")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_sample_to_cuda_without_cuda_names_the_argument():
    from numba import config

    if config.ENABLE_CUDASIM:
        pytest.skip("this process runs numba's CUDA simulator")
    with MemoryManager() as mm:
        store = ReplayStore(TrajectorySpec({"x": ((), "int64")}), 8, 1, memory=mm, timeout=1.0)
        w = store.writer()
        w.extend({"x": np.arange(5)})
        w.end_episode()
        with pytest.raises(ValueError, match=r"device='cuda'.*torch.cuda.is_available\(\) is False"):
            store.sample(2, window=2, device="cuda")
        with pytest.raises(ValueError, match="device must be"):
            store.sample(2, window=2, device="nonsense")
        assert store.sample(2, window=2, device="cpu").batch_size == 2  # unchanged
        assert store.sample(2, window=2, device=None).batch_size == 2
        assert "replay.uva" not in mm.stats()["pinned"]  # nothing was registered
        store.close()
