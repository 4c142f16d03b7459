"""The simulator prelude of `tests/conftest.py` (run before every simulated script) keeps numba's CUDA
simulator faithful under thread switches: a block's threads share one ``cuda.shared.array`` even when the
allocation lookup is slowed so that threads interleave inside it (numba's own check-then-set made each
thread its own array in 8 launches of 20 this way, so a block scan read other threads' stale memory).
Its barrier keeps numba's rule: ``syncthreads`` releases the block once every thread still running waits
(threads that returned early no longer count), and a thread's exception aborts the launch with the thread
named, threads waiting at the barrier released."""

from __future__ import annotations

import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import time
    import numba
    import numpy as np
    from numba import cuda
    from numba.cuda.simulator import kernelapi

    class SlowLookups(dict):  # every lookup yields the GIL: threads interleave inside the allocation
        def get(self, key, default=None):
            found = dict.get(self, key, default)
            time.sleep(0.0005)
            return found

        def __contains__(self, key):
            found = dict.__contains__(self, key)
            time.sleep(0.0005)
            return found

    init = kernelapi.FakeCUDAShared.__init__
    def slow_init(self, size):
        init(self, size)
        self._allocations = SlowLookups()
    kernelapi.FakeCUDAShared.__init__ = slow_init

    @cuda.jit
    def block_sum(out):
        tmp = cuda.shared.array(32, numba.int64)
        t = cuda.threadIdx.x
        tmp[t] = t
        cuda.syncthreads()
        s = 0
        for q in range(32):
            s += tmp[q]
        out[cuda.blockIdx.x * 32 + t] = s

    for launch in range(10):
        out = np.zeros(64, np.int64)
        block_sum[2, 32](out)
        assert (out == 496).all(), (launch, out)

    @cuda.jit
    def rounds(out):  # threads 0..7 return before the barriers; the others meet at three of them
        tmp = cuda.shared.array(32, numba.int64)
        t = cuda.threadIdx.x
        if t < 8:
            return
        tmp[t] = t
        for r in range(3):
            cuda.syncthreads()
            v = tmp[(t + 1) % 32] if t < 31 else tmp[8]
            cuda.syncthreads()
            tmp[t] = v
        out[cuda.blockIdx.x * 32 + t] = tmp[t]

    out = np.full(64, -1, np.int64)
    rounds[2, 32](out)
    want = np.full(32, -1)
    want[8:] = np.roll(np.arange(8, 32), -3)  # each round reads the next live thread's value
    assert np.array_equal(out, np.tile(want, 2)), out

    @cuda.jit
    def fails(out):
        t = cuda.threadIdx.x
        if t == 5:
            raise ValueError("thread five")
        cuda.syncthreads()
        out[t] = t

    try:
        fails[1, 32](np.zeros(32, np.int64))
    except ValueError as err:
        assert "tid=[5, 0, 0] ctaid=[0, 0, 0]: thread five" in str(err), err
    else:
        raise AssertionError("no exception from the simulated thread")
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT, patches=True, timeout=120)
def test_a_blocks_threads_share_one_shared_array_under_thread_switches(simulated_part) -> None:
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output
