"""The numba.cuda window gather, run under numba's CUDA simulator in a subprocess (the simulator must
be chosen before numba.cuda is first imported), checked against the step-by-step reference."""

from __future__ import annotations

import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from replay.cuda import gather_windows_cuda, word_dtype
    from replay.windows import reference_gather, window_bounds

    rng = np.random.default_rng(0)
    cases = [((), np.uint8), ((3,), np.uint8), ((2,), np.float32), ((3,), np.int64), ((), np.bool_)]
    words = set()
    for shape, dtype in cases:
        capacity, length = 11, 5
        top = 2 if dtype is np.bool_ else 100
        ring = (rng.integers(1, 100, size=(capacity, *shape)) % top).astype(dtype)
        row_bytes = ring.itemsize * int(np.prod(shape, dtype=np.int64))
        # windows over a wrapped ring: positions 20..30 live (floor 20), episodes [20, 24) and [24, 31)
        anchors = np.array([20, 22, 23, 24, 27, 29, 30])
        ep_start = np.where(anchors < 24, 20, 24)
        ep_end = np.where(anchors < 24, 24, 31)
        for pad in ("tail", "head"):
            first, n, dst = window_bounds(anchors, ep_start, ep_end, 20, length, pad)
            rows = np.arange(len(anchors))[::-1].copy()  # scattered output rows
            out = cuda.to_device(np.full(len(anchors) * length * row_bytes, 7, np.uint8))
            src = cuda.to_device(ring.reshape(-1).view(np.uint8))
            gather_windows_cuda(src, row_bytes, first % capacity, n, dst, out, length, rows=rows, threads=8)
            got = out.copy_to_host().view(dtype).reshape(len(anchors), length, *shape)
            want = reference_gather(ring, first % capacity, n, dst, length)[np.argsort(rows)]
            assert np.array_equal(got, want), (shape, dtype, pad)
        words.add(np.dtype(word_dtype(row_bytes, src, out)).itemsize)
    assert words == {1, 8}, words  # both the byte path and the wide-word path ran
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT)
def test_cuda_gather_matches_the_reference_under_the_simulator(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output
