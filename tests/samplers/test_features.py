"""FeatureStore: exact gathers, staging reuse, the hot-row cache and its hit rate, budgets, bad input
(the gather kernels: tests/samplers/kernels/test_gather.py; staging: tests/samplers/test_staging.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from graphrl.kernels import huge_page_bytes, huge_pages_advised
from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers import feature_table
from samplers.features import FeatureStore
from samplers.kernels import gather as gather_module


@pytest.fixture
def mm():
    # the device tier in host memory on every machine: a CPU store places its rows the same with and
    # without CUDA (a default MemoryManager's device tier is GPU memory with CUDA: see the gpu tests)
    with MemoryManager(device="cpu") as manager:
        yield manager


GPU = pytest.param("cuda", marks=pytest.mark.gpu)


def hand_graph() -> CSCGraph:
    """6 nodes; in-degrees [0, 3, 1, 2, 0, 1]; out-degrees [2, 0, 2, 1, 1, 1]."""
    src = [0, 2, 4, 0, 2, 3, 5]
    dst = [1, 1, 1, 2, 3, 3, 5]
    return CSCGraph.from_edges(src, dst, 6)


# ------------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize("shape,dtype", [((300, 7), torch.float32), ((300,), torch.int64),
                                         ((300, 3, 2), torch.float16), ((300, 5), torch.bfloat16),
                                         ((300, 3), torch.uint8)])
def test_gather_equals_index_select(shape, dtype, device):
    x = (torch.randn(shape) * 50).to(dtype)
    store = FeatureStore(x, device=device)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 300, 1000))
    got = store.gather(ids)
    assert got.dtype == dtype and got.shape == (1000, *shape[1:]) and got.device.type == device
    assert torch.equal(got.cpu(), torch.index_select(x, 0, ids))
    assert store.gather(torch.empty(0, dtype=torch.int64)).shape == (0, *shape[1:])
    assert store.table.data_ptr() == x.data_ptr()  # memory=None: the table is x itself (page-locked for cuda)
    store.close()


def test_the_default_device_is_the_cpu_on_every_machine():
    x = torch.randn(10, 3)
    with FeatureStore(x) as store:
        assert store.device.type == "cpu" and store.gather([1, 2]).device.type == "cpu"


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


@pytest.mark.parametrize("threads", [1, 2])
def test_large_batch_streams_by_default_and_stays_exact(threads):
    """A batch above the streaming threshold (8 MiB), over several chunks, into a staging view and `out`."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((3000, 128), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, 3000, 20_000))  # 10 MB of rows, 5 chunks
    assert 20_000 * 512 >= gather_module.STREAM_BYTES
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


def _on_huge_pages(ptr: int, nbytes: int) -> bool:
    """Backed by huge pages, or advised so (the kernel may lack a free one at that moment)."""
    return huge_page_bytes(ptr, nbytes) > 0 or huge_pages_advised(ptr, nbytes)


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
@pytest.mark.parametrize("in_place", [True, False])
def test_a_large_table_goes_on_huge_pages_with_the_same_rows(in_place):
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((90_000, 128), dtype=np.float32))  # 44 MiB
    assert x.numel() * 4 >= feature_table.HUGE_TABLE_BYTES
    before = x.clone()
    ids = torch.from_numpy(rng.integers(0, 90_000, 5000))
    with MemoryManager() as manager:
        for huge in (True, False):
            store = FeatureStore(x, memory=None if in_place else manager, huge_pages=huge, device="cpu")
            assert (store.table.data_ptr() == x.data_ptr()) == in_place
            if huge:
                t = store.table
                assert _on_huge_pages(t.data_ptr(), t.numel() * t.element_size())
            elif _thp_mode() == "madvise" and not in_place:  # in place: x may be huge from the first store
                assert _table_huge_bytes(store) == 0
            assert torch.equal(store.gather(ids), torch.index_select(before, 0, ids))
            assert torch.equal(store.table, before)
            store.close()
    assert torch.equal(x, before)


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
def test_a_large_cache_goes_on_huge_pages_too():
    # a CPU store's cache is host memory on every machine: the device tier without CUDA, the host tier
    # with CUDA (where the default manager's device tier is GPU memory)
    rng = np.random.default_rng(5)
    n = 90_000
    g = CSCGraph.from_edges(rng.integers(0, n, 200_000), rng.integers(0, n, 200_000), n)
    x = torch.from_numpy(rng.standard_normal((n, 128), dtype=np.float32))
    with MemoryManager() as manager:
        store = FeatureStore(x, memory=manager, cache_rows=80_000, graph=g, tier="host", device="cpu")
        cache = store._cache.rows
        assert cache is not None and cache.numel() * 4 >= feature_table.HUGE_TABLE_BYTES
        assert _on_huge_pages(cache.data_ptr(), cache.numel() * 4)
        ids = torch.from_numpy(rng.integers(0, n, 5000))
        assert torch.equal(store.gather(ids), torch.index_select(x, 0, ids))
        assert store.stats()["cache_hits"] > 0
        store.close()


def test_small_tables_and_huge_pages_false_are_left_alone(monkeypatch):
    x = torch.randn(1000, 16)  # 64 KiB: below the huge-page threshold
    # the heap may already sit on huge pages (an earlier test collapsed a table in place and its memory was
    # reused), so check that the store asks for none rather than what smaps shows
    calls = []
    monkeypatch.setattr(feature_table, "advise_huge_pages", lambda *a, **k: calls.append(a) or 0)
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
    assert store.table_tier == "device"  # MemoryManager(device="cpu"): the device tier is host memory
    assert store.table.data_ptr() != x.data_ptr() and torch.equal(store.table, x)
    assert mm.stats()["device"]["features.table"]["bytes"] == 100 * 8 * 4
    store.gather([1, 2, 3])
    assert mm.stats()["pinned"]["features.staging"]["regions"] == 1
    store.close()
    assert all(u["bytes"] == 0 for tier in ("device", "pinned", "host") for u in mm.stats()[tier].values())


# ------------------------------------------------------------------------------------------- staging
def test_gather_without_out_reuses_staging_round_robin_but_never_a_kept_result(mm):
    x = torch.randn(50, 4)
    store = FeatureStore(x, memory=mm, staging_slots=2)
    a, b, c, d = torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8]), torch.tensor([9])
    ra = store.gather(a)
    ptr_a = ra.data_ptr()
    rb = store.gather(b)
    assert torch.equal(ra, x[a]) and torch.equal(rb, x[b])  # both still valid: 2 slots
    rc = store.gather(c)  # ra is kept: its buffer is not reused, rc gets a buffer of its own
    assert rc.data_ptr() != ptr_a
    assert torch.equal(ra, x[a]) and torch.equal(rb, x[b]) and torch.equal(rc, x[c])
    assert mm.stats()["pinned"]["features.staging"]["regions"] == 2
    del ra  # nothing views the first buffer: the next gather reuses it, no fresh tensor
    rd = store.gather(d)
    assert rd.data_ptr() == ptr_a
    assert torch.equal(rb, x[b]) and torch.equal(rc, x[c]) and torch.equal(rd, x[d])


# ------------------------------------------------------------------------------------------- cache
def test_degree_cache_hit_rate_by_hand():
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    # table 96 bytes does not fit the 64-byte device budget and goes to pinned; the cache (2 rows,
    # 32 bytes) and its slot map (6 x int32, 24 bytes) fit it
    with MemoryManager(budgets={"device": 64}, device="cpu") as mm:
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
    with MemoryManager(budgets={"device": 80}, device="cpu") as mm:
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
    with MemoryManager(device="cpu") as mm:
        store = FeatureStore(torch.randn(6, 2), memory=mm, cache_rows=50, graph=hand_graph(), tier="pinned")
        assert store.cache_rows == 6
        ids = torch.tensor([5, 4, 0])
        store.gather(ids)
        assert store.stats()["hit_rate"] == 1.0


# ------------------------------------------------------------------------------------------- budgets
def test_budgets_fall_back_or_raise_and_leak_nothing():
    x = torch.randn(100, 8)  # 3200 bytes
    # every manager with its device tier in host memory: the same tiers with and without CUDA
    with MemoryManager(budgets={"device": 1000, "pinned": 5000}, device="cpu") as mm:
        store = FeatureStore(x, memory=mm)
        assert store.table_tier == "pinned"
        store.close()
    with MemoryManager(budgets={"device": 1000, "pinned": 1000, "host": 1000}, device="cpu") as mm:
        with pytest.raises(MemoryBudgetError) as info:
            FeatureStore(x, memory=mm)
        assert info.value.owner == "features.table"
        assert mm.regions() == []
    # the cache must fit the device tier: no silent fallback
    with MemoryManager(budgets={"device": 200}, device="cpu") as mm:
        with pytest.raises(MemoryBudgetError, match="features.cache"):
            FeatureStore(x, memory=mm, cache_rows=10, graph=CSCGraph.from_edges([0], [1], 100))
        assert mm.regions() == []
    # staging beyond its budget raises at the gather
    with MemoryManager(budgets={"pinned": 100, "host": 100}, device="cpu") as mm:
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


def test_refresh_cache_after_the_table_changed_in_place():
    # memory=None: the table is x itself, the cache a copy of its hot rows; after x changes in place
    # the cached rows are stale until refresh_cache() copies them again
    g = CSCGraph.from_edges([1, 2, 3, 0], [0, 0, 0, 1], 4)  # node 0 has the highest in-degree
    x = torch.zeros(4, 2)
    fs = FeatureStore(x, cache_rows=1, graph=g, device="cpu")
    assert fs.cache_nodes.tolist() == [0] and fs.table.data_ptr() == x.data_ptr()
    x += torch.arange(1, 5, dtype=torch.float32)[:, None]
    ids = torch.tensor([0, 1, 2, 3, 0])
    assert fs.gather(ids)[:, 0].tolist() == [0.0, 2.0, 3.0, 4.0, 0.0]  # the documented staleness
    fs.refresh_cache()
    assert torch.equal(fs.gather(ids), x[ids])
    assert fs.stats()["cache_hits"] == 4  # node 0, twice a gather
    fs.close()
    with pytest.raises(ValueError, match="closed"):
        fs.refresh_cache()
    plain = FeatureStore(x, device="cpu")  # no cache: nothing to refresh
    plain.refresh_cache()
    assert torch.equal(plain.gather(ids), x[ids])
    plain.close()


# ------------------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
def test_a_cpu_store_keeps_off_a_gpu_device_tier():
    """With CUDA a default manager's device tier is GPU memory: a CPU store puts its table and cache in
    host memory instead and gives the same rows and hits as over a host device tier."""
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    ids = torch.tensor([1, 1, 3, 0, 5, 2, 1, 4])
    with MemoryManager() as mm:
        store = FeatureStore(x, memory=mm, cache_rows=2, graph=hand_graph(), device="cpu")
        assert (store.table_tier, store.cache_tier) == ("host", "host") and store.table.device.type == "cpu"
        assert torch.equal(store.gather(ids), x[ids]) and store.stats()["hit_rate"] == 0.5
        assert all(u["bytes"] == 0 for u in mm.stats().get("device", {}).values())
        assert mm.stats()["pinned"]["features.staging"]["regions"] == 1  # page-locked, for copies
        store.close()
        with FeatureStore(x, cache_rows=2, graph=hand_graph(), device="cpu") as own:  # a private manager
            assert own.cache_tier == "device" and own.table.data_ptr() == x.data_ptr()
            assert torch.equal(own.gather(ids), x[ids]) and own.stats()["hit_rate"] == 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("tier", [None, "pinned"])
def test_a_gpu_store_gives_the_rows_and_hits_of_a_cpu_store(tier):
    rng = np.random.default_rng(7)
    n = 5000
    g = CSCGraph.from_edges(rng.integers(0, n, 40_000), rng.integers(0, n, 40_000), n)
    x = torch.randn(n, 64)
    ids = torch.from_numpy(rng.integers(0, n, 30_000))
    with MemoryManager() as mm, MemoryManager(device="cpu") as host:
        gpu = FeatureStore(x, memory=mm, cache_rows=500, graph=g, tier=tier, device="cuda")
        cpu = FeatureStore(x, memory=host, cache_rows=500, graph=g, tier="pinned", device="cpu")
        assert gpu.table_tier == (tier or "device") and torch.equal(gpu.cache_nodes, cpu.cache_nodes)
        got = gpu.gather(ids)
        assert got.device.type == "cuda" and torch.equal(got.cpu(), cpu.gather(ids))
        out = torch.full((30_001, 64), 7.0, device="cuda")
        assert torch.equal(gpu.gather(ids, out=out).cpu(), x[ids]) and (out[-1] == 7).all()
        with pytest.raises(ValueError, match="out must be on cuda"):
            gpu.gather(ids, out=torch.empty(30_000, 64))
        torch.cuda.synchronize()
        if tier == "pinned":  # the cache is on the device; hits are counted on the device
            assert gpu.cache_tier == "device"
            assert gpu.stats()["cache_hits"] == 2 * cpu.stats()["cache_hits"] > 0
        else:  # the table is on the device: no cache
            assert gpu.cache_rows == 0 and gpu.stats()["cache_hits"] == 0
        assert mm.stats()["device"]["features.staging"]["regions"] == 1
        gpu.close()
        cpu.close()


@pytest.mark.gpu
def test_a_gpu_store_refuses_a_device_tier_in_host_memory():
    with MemoryManager(device="cpu") as mm:
        with pytest.raises(ValueError, match=r"memory: its device tier is host memory"):
            FeatureStore(torch.randn(6, 2), memory=mm, device="cuda")
        assert mm.regions() == []
