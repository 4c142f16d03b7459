"""The row-gather kernels: the CPU gather (prefetch, streaming stores, cache slots, any row size) and the
numba.cuda gather and its word views under the CUDA simulator."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from samplers.kernels.gather import gather_rows, word_type


def test_gather_rows_kernel_with_a_cache_counts_hits():
    x = torch.arange(40, dtype=torch.float64).reshape(10, 4)
    cache = -x[[2, 7]]
    slots = np.full(10, -1, np.int32)
    slots[[2, 7]] = [0, 1]
    ids = np.array([7, 1, 2, 2, 9], dtype=np.int64)
    out = torch.empty(5, 4, dtype=torch.float64)
    assert gather_rows(x, ids, out, 1, cache, slots) == 3
    assert torch.equal(out, torch.stack([-x[7], x[1], -x[2], -x[2], x[9]]))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("ahead", [0, 1, 5, 1000])
@pytest.mark.parametrize("cols", [1, 16, 33, 128])
def test_gather_rows_with_prefetch_and_streaming_stores_is_exact(stream, ahead, cols):
    rng = np.random.default_rng(cols)
    x = torch.from_numpy(rng.standard_normal((500, cols)).astype(np.float32))
    ids = rng.integers(0, 500, 3000)
    for threads in (1, 2):
        out = torch.full((3001, cols), 7.0)
        assert gather_rows(x, ids, out, threads, ahead=ahead, stream=stream) == 0
        assert torch.equal(out[:3000], x[torch.from_numpy(ids)]) and (out[3000] == 7).all()
    cache = -x[:100]
    slots = np.full(500, -1, np.int32)
    slots[:100] = np.arange(100)
    out = torch.full((3000, cols), 7.0)
    hits = gather_rows(x, ids, out, 2, cache, slots, ahead=ahead, stream=stream)
    assert hits == int((ids < 100).sum())
    want = x[torch.from_numpy(ids)]
    want[torch.from_numpy(ids < 100)] *= -1
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype,cols", [(torch.float64, 5), (torch.int64, 9), (torch.uint8, 1),
                                        (torch.uint8, 3), (torch.uint8, 77), (torch.float32, 128),
                                        (torch.int64, 64)])
@pytest.mark.parametrize("stream", [None, False, True])
def test_gather_rows_is_byte_identical_to_index_select_for_any_row_size(dtype, cols, stream):
    """Row sizes of 1 to 512 bytes, whole lines or not; duplicate and unsorted ids, 1 row, empty."""
    rng = np.random.default_rng(cols)
    x = torch.from_numpy(rng.integers(0, 256, (700, cols * torch.empty(0, dtype=dtype).element_size()),
                                      dtype=np.uint8)).view(dtype)  # every bit pattern, NaNs included
    base = rng.integers(0, 700, 2000)
    cases = {"random": base, "duplicates": np.repeat(base[:50], 40), "descending": np.sort(base)[::-1].copy(),
             "one": base[:1], "empty": base[:0]}
    for name, ids in cases.items():
        want = torch.index_select(x, 0, torch.from_numpy(ids))
        for threads in (1, 2):
            out = torch.full((len(ids) + 1, cols), 7, dtype=dtype)
            assert gather_rows(x, ids, out, threads, stream=stream) == 0
            got = out[:len(ids)]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (name, threads)
            assert (out[len(ids)] == 7).all(), (name, threads)


def test_word_type_is_the_widest_word_dividing_a_row():
    assert word_type(512) == (torch.int32, "<i4")
    assert word_type(6) == (torch.int16, "<i2")
    assert word_type(3) == (torch.uint8, "|u1")


# ------------------------------------------------------------------------------------------- CUDA simulator
SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import config, cuda
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from samplers.kernels.gather import gather_rows_cuda

    rng = np.random.default_rng(0)
    n, width = 40, 5
    table = rng.integers(-1000, 1000, (n, width)).astype(np.int32)
    ids = np.concatenate([rng.integers(0, n, 20), [3, 17, 3]]).astype(np.int64)
    # more rows than warps (3 blocks of 1 warp): warps loop over rows; rows past len(ids) untouched
    out = cuda.to_device(np.full((30, width), 7, np.int32))
    gather_rows_cuda(cuda.to_device(table), cuda.to_device(ids), out, warps_per_block=1, max_blocks=3)
    got = out.copy_to_host()
    assert np.array_equal(got[:23], table[ids]) and (got[23:] == 7).all()

    hot = np.array([3, 17, 0])
    slots = np.full(n, -1, np.int32)
    slots[hot] = np.arange(3, dtype=np.int32)
    cache = table[hot] + 10000  # marked, to see which rows came from the cache
    hits = cuda.to_device(np.zeros(1, np.int64))
    out2 = cuda.to_device(np.zeros((23, width), np.int32))
    gather_rows_cuda(cuda.to_device(table), cuda.to_device(ids), out2, cache=cuda.to_device(cache),
                     slots=cuda.to_device(slots), hits=hits, warps_per_block=2, max_blocks=2)
    cached = np.isin(ids, hot)
    assert np.array_equal(out2.copy_to_host(), np.where(cached[:, None], table[ids] + 10000, table[ids]))
    assert hits.copy_to_host()[0] == cached.sum() >= 3

    # word views of torch tensors (as FeatureStore's GPU gather builds them), launched on the stream rule's
    # stream (0 under the simulator): float32 rows as int32 words, 3-byte rows as bytes
    import torch
    from graphrl import cuda as gcuda
    from samplers.kernels.gather import word_view
    assert gcuda.launch_stream("cuda") == 0
    for x in (torch.from_numpy(rng.standard_normal((40, 6)).astype(np.float32)),
              torch.from_numpy(rng.integers(0, 256, (40, 3)).astype(np.uint8))):
        out_t = torch.zeros((23, *x.shape[1:]), dtype=x.dtype)
        words = word_view(x)
        assert words.shape == (40, 6 if x.dtype == torch.float32 else 3)
        gather_rows_cuda(words, cuda.to_device(ids), word_view(out_t), stream=gcuda.launch_stream("cuda"))
        assert torch.equal(out_t, x[torch.from_numpy(ids)])
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT)
def test_cuda_gather_kernel_under_the_simulator(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output
