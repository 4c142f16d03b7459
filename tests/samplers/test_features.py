"""FeatureStore: exact gathers, staging reuse, the hot-row cache and its hit rate, budgets, bad input,
and the numba.cuda gather under the CUDA simulator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from graphrl.kernels import huge_page_bytes
from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers import features as features_module
from samplers.features import FeatureStore, RowStaging, gather_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def mm():
    with MemoryManager() as manager:
        yield manager


def hand_graph() -> CSCGraph:
    """6 nodes; in-degrees [0, 3, 1, 2, 0, 1]; out-degrees [2, 0, 2, 1, 1, 1]."""
    src = [0, 2, 4, 0, 2, 3, 5]
    dst = [1, 1, 1, 2, 3, 3, 5]
    return CSCGraph.from_edges(src, dst, 6)


# ------------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("shape,dtype", [((300, 7), torch.float32), ((300,), torch.int64),
                                         ((300, 3, 2), torch.float16), ((300, 5), torch.bfloat16),
                                         ((300, 3), torch.uint8)])
def test_gather_equals_index_select(shape, dtype):
    x = (torch.randn(shape) * 50).to(dtype)
    store = FeatureStore(x)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 300, 1000))
    got = store.gather(ids)
    assert got.dtype == dtype and got.shape == (1000, *shape[1:])
    assert torch.equal(got, torch.index_select(x, 0, ids))
    assert store.gather(torch.empty(0, dtype=torch.int64)).shape == (0, *shape[1:])
    assert store.table.data_ptr() == x.data_ptr()  # memory=None: the table is x itself


def test_gather_across_threads_and_chunks_and_into_out(mm):
    x = torch.randn(5000, 64)  # 256-byte rows: 8192 rows a chunk, so 30000 ids make 4 chunks
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 5000, 30_000)).to(torch.int32)
    for threads in (1, 2, 3):
        store = FeatureStore(x, memory=mm, threads=threads)
        assert torch.equal(store.gather(ids), torch.index_select(x, 0, ids))
        out = torch.full((30_005, 64), 7.0)
        got = store.gather(ids, out=out)
        assert got.data_ptr() == out.data_ptr() and got.shape == (30_000, 64)
        assert torch.equal(got, x[ids.long()]) and (out[30_000:] == 7).all()
        store.close()


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


@pytest.mark.parametrize("threads", [1, 2])
def test_large_batch_streams_by_default_and_stays_exact(threads):
    """A batch above the streaming threshold (8 MiB), over several chunks, into a staging view and `out`."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((3000, 128), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, 3000, 20_000))  # 10 MB of rows, 5 chunks
    assert 20_000 * 512 >= features_module._STREAM_BYTES
    store = FeatureStore(x, threads=threads)
    assert torch.equal(store.gather(ids), torch.index_select(x, 0, ids))
    out = torch.full((20_001, 128), 7.0)
    assert torch.equal(store.gather(ids, out=out), torch.index_select(x, 0, ids)) and (out[-1] == 7).all()
    store.close()


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0]


def _table_huge_bytes(store: FeatureStore) -> int:
    t = store.table
    return huge_page_bytes(t.data_ptr(), t.numel() * t.element_size())


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
@pytest.mark.parametrize("in_place", [True, False])
def test_a_large_table_goes_on_huge_pages_with_the_same_rows(in_place):
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((90_000, 128), dtype=np.float32))  # 44 MiB
    assert x.numel() * 4 >= features_module._HUGE_TABLE_BYTES
    before = x.clone()
    ids = torch.from_numpy(rng.integers(0, 90_000, 5000))
    with MemoryManager() as manager:
        for huge in (True, False):
            store = FeatureStore(x, memory=None if in_place else manager, huge_pages=huge, device="cpu")
            assert (store.table.data_ptr() == x.data_ptr()) == in_place
            if huge:
                assert _table_huge_bytes(store) > 0
            elif _thp_mode() == "madvise" and not in_place:  # in place: x may be huge from the first store
                assert _table_huge_bytes(store) == 0
            assert torch.equal(store.gather(ids), torch.index_select(before, 0, ids))
            assert torch.equal(store.table, before)
            store.close()
    assert torch.equal(x, before)


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU store's cache needs a machine without CUDA")
def test_a_large_cache_goes_on_huge_pages_too():
    rng = np.random.default_rng(5)
    n = 90_000
    g = CSCGraph.from_edges(rng.integers(0, n, 200_000), rng.integers(0, n, 200_000), n)
    x = torch.from_numpy(rng.standard_normal((n, 128), dtype=np.float32))
    with MemoryManager() as manager:
        store = FeatureStore(x, memory=manager, cache_rows=80_000, graph=g, tier="host", device="cpu")
        cache = store._cache
        assert cache is not None and cache.numel() * 4 >= features_module._HUGE_TABLE_BYTES
        assert huge_page_bytes(cache.data_ptr(), cache.numel() * 4) > 0
        ids = torch.from_numpy(rng.integers(0, n, 5000))
        assert torch.equal(store.gather(ids), torch.index_select(x, 0, ids))
        assert store.stats()["cache_hits"] > 0
        store.close()


def test_small_tables_and_huge_pages_false_are_left_alone(monkeypatch):
    x = torch.randn(1000, 16)  # 64 KiB: below the huge-page threshold
    # the heap may already sit on huge pages (an earlier test collapsed a table in place and its memory was
    # reused), so check that the store asks for none rather than what smaps shows
    calls = []
    monkeypatch.setattr(features_module, "advise_huge_pages", lambda *a, **k: calls.append(a) or 0)
    before = huge_page_bytes(x.data_ptr(), x.numel() * 4)
    store = FeatureStore(x)
    assert store.huge_pages and not calls
    assert _table_huge_bytes(store) == before
    assert not FeatureStore(x, huge_pages=False).huge_pages and not calls


def test_cached_gather_across_threads_counts_every_hit(mm):
    rng = np.random.default_rng(2)
    x = torch.randn(5000, 64)
    g = CSCGraph.from_edges(rng.integers(0, 5000, 40_000), rng.integers(0, 5000, 40_000), 5000)
    store = FeatureStore(x, memory=mm, cache_rows=500, graph=g, tier="pinned", threads=2)
    ids = torch.from_numpy(rng.integers(0, 5000, 30_000))  # 4 chunks of 8192 rows
    assert torch.equal(store.gather(ids), x[ids])
    want = int(np.isin(ids.numpy(), store.cache_nodes.numpy()).sum())
    assert store.stats()["cache_hits"] == want > 0
    deg = g.in_degrees()
    assert deg[store.cache_nodes].min() >= deg.sort(descending=True).values[499]


def test_table_is_copied_into_a_region_on_the_fastest_tier(mm):
    x = torch.randn(100, 8)
    store = FeatureStore(x, memory=mm)
    assert store.table_tier == "device"  # without CUDA the device tier is host memory
    assert store.table.data_ptr() != x.data_ptr() and torch.equal(store.table, x)
    assert mm.stats()["device"]["features.table"]["bytes"] == 100 * 8 * 4
    store.gather([1, 2, 3])
    assert mm.stats()["pinned"]["features.staging"]["regions"] == 1
    store.close()
    assert all(u["bytes"] == 0 for tier in mm.stats().values() for u in tier.values())


# ------------------------------------------------------------------------------------------- staging
def test_gather_without_out_reuses_staging_round_robin(mm):
    x = torch.randn(50, 4)
    store = FeatureStore(x, memory=mm, staging_slots=2)
    a, b, c = torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8])
    ra = store.gather(a)
    rb = store.gather(b)
    assert torch.equal(ra, x[a]) and torch.equal(rb, x[b])  # both still valid: 2 slots
    rc = store.gather(c)
    assert rc.data_ptr() == ra.data_ptr()  # the third gather reuses the first's buffer: no fresh tensor
    assert torch.equal(rb, x[b]) and torch.equal(rc, x[c])
    assert mm.stats()["pinned"]["features.staging"]["regions"] == 1


def test_row_staging_grows_and_frees_old_pools_when_released(mm):
    staging = RowStaging(mm, (4,), torch.float32, slots=2, owner="t.staging")
    first = staging.acquire(10)
    assert staging.capacity == 10 and first.tensor.shape == (10, 4)
    bigger = staging.acquire(11)  # needs a larger pool: 1.25 x 10 rounded up = 13 rows
    assert staging.capacity == 13 and bigger.tensor.shape == (11, 4)
    assert mm.stats()["pinned"]["t.staging"]["regions"] == 2  # the old pool lives while leased
    first.release()
    first.release()  # idempotent
    assert mm.stats()["pinned"]["t.staging"]["regions"] == 1
    bigger.release()
    staging.close()
    assert mm.stats()["pinned"]["t.staging"]["bytes"] == 0


# ------------------------------------------------------------------------------------------- cache
def test_degree_cache_hit_rate_by_hand():
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    # table 96 bytes does not fit the 64-byte device budget and goes to pinned; the cache (2 rows,
    # 32 bytes) and its slot map (6 x int32, 24 bytes) fit it
    with MemoryManager(budgets={"device": 64}) as mm:
        store = FeatureStore(x, memory=mm, cache_rows=2, graph=hand_graph())
        assert store.table_tier == "pinned" and store.stats()["cache_tier"] == "device"
        assert store.cache_nodes.tolist() == [1, 3]  # in-degrees 3 and 2
        ids = torch.tensor([1, 1, 3, 0, 5, 2, 1, 4])
        assert torch.equal(store.gather(ids), x[ids])
        s = store.stats()
        assert (s["cache_hits"], s["gathered_rows"], s["hit_rate"]) == (4, 8, 0.5)
        assert torch.equal(store.gather(torch.tensor([0, 2])), x[[0, 2]])
        assert store.stats()["hit_rate"] == 4 / 10
        assert mm.stats()["device"]["features.cache"]["bytes"] == 32
        store.reset_stats()
        assert store.stats()["gathered_rows"] == 0 and store.stats()["hit_rate"] == 0.0


def test_out_degree_and_presample_policies_by_hand():
    x = torch.randn(6, 4)  # table 96 bytes > 80: pinned; cache 3 x 16 bytes + slot map 24 bytes <= 80
    g = hand_graph()
    with MemoryManager(budgets={"device": 80}) as mm:
        store = FeatureStore(x, memory=mm, cache_rows=3, cache_policy="out_degree", graph=g)
        assert store.cache_nodes.tolist() == [0, 2, 3]  # out-degrees 2, 2, then 1 (smallest id of 3, 4, 5)
        store.close()
        # fanout -1 takes every in-neighbour: seeds {1, 5} read inputs {1, 5, 0, 2, 4}; counted twice
        counts = FeatureStore.presample_counts(g, [-1], seeds=[1, 5], batches=2, batch_size=2)
        assert counts.tolist() == [2, 2, 2, 0, 2, 2]
        store = FeatureStore(x, memory=mm, cache_rows=3, cache_policy="presample", graph=g,
                             presample_fanouts=[-1], presample_seeds=torch.tensor([1, 5]),
                             presample_batches=2, presample_batch_size=2)
        # count 2 each for 0, 1, 2, 4, 5; ties by in-degree (node 1: 3, nodes 2 and 5: 1), then id
        assert store.cache_nodes.tolist() == [1, 2, 5]
        ids = torch.tensor([0, 1, 2, 3, 4, 5])
        assert torch.equal(store.gather(ids), x) and store.stats()["hit_rate"] == 0.5


def test_no_cache_when_the_table_is_on_the_device_tier(mm):
    store = FeatureStore(torch.randn(6, 2), memory=mm, cache_rows=3, graph=hand_graph())
    assert store.table_tier == "device" and store.cache_rows == 0
    assert store.stats()["cache_tier"] is None


def test_cache_rows_beyond_the_table_are_clipped():
    with MemoryManager() as mm:
        store = FeatureStore(torch.randn(6, 2), memory=mm, cache_rows=50, graph=hand_graph(), tier="pinned")
        assert store.cache_rows == 6
        ids = torch.tensor([5, 4, 0])
        store.gather(ids)
        assert store.stats()["hit_rate"] == 1.0


# ------------------------------------------------------------------------------------------- budgets
def test_budgets_fall_back_or_raise_and_leak_nothing():
    x = torch.randn(100, 8)  # 3200 bytes
    with MemoryManager(budgets={"device": 1000, "pinned": 5000}) as mm:
        store = FeatureStore(x, memory=mm)
        assert store.table_tier == "pinned"
        store.close()
    with MemoryManager(budgets={"device": 1000, "pinned": 1000, "host": 1000}) as mm:
        with pytest.raises(MemoryBudgetError) as info:
            FeatureStore(x, memory=mm)
        assert info.value.owner == "features.table"
        assert mm.regions() == []
    # the cache must fit the device tier: no silent fallback
    with MemoryManager(budgets={"device": 200}) as mm:
        with pytest.raises(MemoryBudgetError, match="features.cache"):
            FeatureStore(x, memory=mm, cache_rows=10, graph=CSCGraph.from_edges([0], [1], 100))
        assert mm.regions() == []
    # staging beyond its budget raises at the gather
    with MemoryManager(budgets={"pinned": 100, "host": 100}) as mm:
        store = FeatureStore(x, memory=mm)
        with pytest.raises(MemoryBudgetError, match="features.staging"):
            store.gather(torch.arange(50))


# ------------------------------------------------------------------------------------------- bad input
def test_out_of_range_ids_raise_value_error_naming_ids():
    store = FeatureStore(torch.randn(10, 3))
    with pytest.raises(ValueError, match=r"ids: 2 of 5 ids outside \[0, num_rows=10\), first 10"):
        store.gather(torch.tensor([1, 10, 2, 11, 3]))
    with pytest.raises(ValueError, match="ids: 1 of 2"):
        store.gather([-1, 0])
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        store.gather(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="ids must be 1-D"):
        store.gather(torch.zeros(2, 2, dtype=torch.int64))
    assert store.stats()["gathers"] == 0


def test_bad_out_and_bad_arguments():
    x = torch.randn(10, 3)
    store = FeatureStore(x)
    ids = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="dtype"):
        store.gather(ids, out=torch.empty(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        store.gather(ids, out=torch.empty(1, 3))
    with pytest.raises(ValueError, match="shape"):
        store.gather(ids, out=torch.empty(2, 4))
    with pytest.raises(ValueError, match="contiguous"):
        store.gather(ids, out=torch.empty(3, 2).t())
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        store.gather(ids, out=np.empty((2, 3), np.float32))
    with pytest.raises(TypeError, match="x must be"):
        FeatureStore([[1.0]])
    with pytest.raises(TypeError, match="real numeric"):
        FeatureStore(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="row dimension"):
        FeatureStore(torch.tensor(1.0))
    with pytest.raises(ValueError, match="cache_rows must be >= 0"):
        FeatureStore(x, cache_rows=-1)
    with pytest.raises(ValueError, match="cache_policy"):
        FeatureStore(x, cache_rows=1, cache_policy="lru", graph=CSCGraph.from_edges([0], [1], 10))
    with pytest.raises(ValueError, match="needs graph="):
        FeatureStore(x, cache_rows=1)
    with pytest.raises(ValueError, match="graph has 6 nodes but x has 10 rows"):
        FeatureStore(x, graph=hand_graph())
    with pytest.raises(TypeError, match="memory must be a MemoryManager"):
        FeatureStore(x, memory="pinned")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            FeatureStore(x, device="cuda")


# ------------------------------------------------------------------------------------------- CUDA simulator
SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import config, cuda
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from samplers.features import gather_rows_cuda

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
    print("OK")
    """
)


def test_cuda_gather_kernel_under_the_simulator():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")
