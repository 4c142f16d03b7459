"""Range checks at the public boundary of the samplers: every integer that reaches a kernel as a machine
integer is checked; the edge values are accepted and the first bad value is refused, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl import CSCGraph
from samplers import (
    MAX_BATCH,
    MAX_FANOUT,
    FeatureStore,
    FullGraph,
    HeteroGraph,
    HeteroNeighborSampler,
    LinkLoader,
    LinkSampler,
    NeighborLoader,
    NeighborSampler,
)

CLICKS = ("user", "clicks", "item")
U64_MAX = 2**64 - 1


def _graph() -> CSCGraph:
    # node 0 has in-neighbours 1 and 2; node 3 has in-neighbour 0
    return CSCGraph.from_edges(np.array([1, 2, 0]), np.array([0, 0, 3]), 4)


def _hetero() -> HeteroGraph:
    return HeteroGraph.from_edges({"user": 3, "item": 2}, {CLICKS: ([0, 1, 2], [0, 0, 1])})


def _link(**kw) -> LinkSampler:
    graph = CSCGraph.bipartite(np.array([0, 1]), np.array([0, 1]), 2, 3)
    return LinkSampler(NeighborSampler(graph, [2], seed=0), np.array([0, 1]), np.array([2, 3]), **kw)


# ------------------------------------------------------------------------------------------- fanouts
def test_the_bounds_are_int32_local_ids():
    assert MAX_FANOUT == MAX_BATCH == np.iinfo(np.int32).max
    assert MAX_BATCH * MAX_FANOUT < np.iinfo(np.int64).max  # a layer's edge count fits int64 offsets


@pytest.mark.parametrize("k", [-1, 0, 1, MAX_FANOUT])
def test_fanout_edge_values_are_accepted_and_sample(k):
    blocks = NeighborSampler(_graph(), [k], seed=0).sample(torch.tensor([0, 3]))
    assert blocks[0].num_edges == (0 if k == 0 else min(k, 2) + 1 if k != -1 else 3)


@pytest.mark.parametrize("k", [MAX_FANOUT + 1, 2**63, 2**64, U64_MAX])
def test_fanout_above_the_maximum_is_refused_naming_it(k):
    with pytest.raises(ValueError, match=rf"fanouts\[1\]={k}: a fanout must be <= {MAX_FANOUT}"):
        NeighborSampler(_graph(), [2, k])


@pytest.mark.parametrize("k", [-2, -(2**63)])
def test_fanout_below_minus_one_is_refused(k):
    with pytest.raises(ValueError, match=rf"fanouts\[0\]={k}: a fanout must be >= 0, or -1"):
        NeighborSampler(_graph(), [k])


@pytest.mark.parametrize("k", [True, False, 2.0, "3", None])
def test_fanout_that_is_not_an_int_is_a_type_error(k):
    with pytest.raises(TypeError, match=r"fanouts\[0\] must be an int"):
        NeighborSampler(_graph(), [k])


def test_numpy_integer_fanouts_are_checked_in_range():
    assert NeighborSampler(_graph(), [np.int64(2), np.uint64(MAX_FANOUT)]).fanouts == [2, MAX_FANOUT]
    with pytest.raises(ValueError, match=r"fanouts\[0\]=18446744073709551615"):
        NeighborSampler(_graph(), [np.uint64(U64_MAX)])


@settings(max_examples=60, deadline=None)
@given(k=st.integers(min_value=-(2**70), max_value=2**70))
def test_any_fanout_is_accepted_iff_in_range(k):
    ok = -1 <= k <= MAX_FANOUT
    try:
        sampler = NeighborSampler(_graph(), [k])
    except ValueError as err:
        assert not ok and f"fanouts[0]={k}" in str(err)
    else:
        assert ok and sampler.fanouts == [k]


def test_hetero_fanouts_are_bounded_per_relation():
    assert HeteroNeighborSampler(_hetero(), [MAX_FANOUT], seed=0).fanouts[CLICKS] == [MAX_FANOUT]
    with pytest.raises(ValueError, match=r"fanouts\[0\]=2147483648"):  # one list for all relations: its index
        HeteroNeighborSampler(_hetero(), [MAX_FANOUT + 1])
    with pytest.raises(ValueError, match=r"fanouts\[.*\]\[1\]=9223372036854775808"):
        HeteroNeighborSampler(_hetero(), {CLICKS: [1, 2**63]})
    with pytest.raises(TypeError, match=r"fanouts\[0\] must be an int"):
        HeteroNeighborSampler(_hetero(), [True])


def test_loader_fanouts_are_checked_before_any_batch():
    with pytest.raises(ValueError, match=r"fanouts\[0\]=9223372036854775808"):
        NeighborLoader(_graph(), torch.tensor([0]), [2**63], batch_size=1)


# ------------------------------------------------------------------------------------------- RNG seeds
@pytest.mark.parametrize("seed", [0, 1, 2**63, U64_MAX, np.uint64(U64_MAX), np.int64(5)])
def test_seed_edge_values_are_accepted(seed):
    a = NeighborSampler(_graph(), [1], seed=seed).sample(torch.tensor([0]))
    b = NeighborSampler(_graph(), [1], seed=int(seed)).sample(torch.tensor([0]))
    assert torch.equal(a[0].edge_ids, b[0].edge_ids)
    HeteroNeighborSampler(_hetero(), [1], seed=seed)
    NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=1, seed=seed, prefetch=0)
    _link(seed=seed)


@pytest.mark.parametrize("seed", [-1, 2**64, 2**70])
def test_seed_outside_uint64_is_refused_with_its_value(seed):
    match = rf"seed must be in \[0, 2\*\*64\), got {seed}"
    with pytest.raises(ValueError, match=match):
        NeighborSampler(_graph(), [1], seed=seed)
    with pytest.raises(ValueError, match=match):
        HeteroNeighborSampler(_hetero(), [1], seed=seed)
    with pytest.raises(ValueError, match=match):
        NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=1, seed=seed)
    with pytest.raises(ValueError, match=match):
        _link(seed=seed)
    with pytest.raises(ValueError, match=match):
        FeatureStore(torch.zeros(4, 2), seed=seed)


@pytest.mark.parametrize("seed", [True, 1.0, "0"])
def test_seed_that_is_not_an_int_is_a_type_error(seed):
    with pytest.raises(TypeError, match="seed must be an int"):
        NeighborSampler(_graph(), [1], seed=seed)
    with pytest.raises(TypeError, match="seed must be an int"):
        NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=1, seed=seed)
    with pytest.raises(TypeError, match="seed must be an int"):
        _link(seed=seed)


# ------------------------------------------------------------------------------------------- node ids
def test_node_ids_edge_values():
    sampler = NeighborSampler(_graph(), [1], seed=0)
    assert sampler.sample(torch.tensor([0, 3]))[-1].dst_nodes.tolist() == [0, 3]
    with pytest.raises(ValueError, match=r"seeds: 1 of 2 ids outside \[0, num_nodes=4\), first 4"):
        sampler.sample(torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"first -1"):
        sampler.sample(torch.tensor([-1]))


@pytest.mark.parametrize("make", [lambda v: np.array(v, dtype=np.uint64),
                                  lambda v: torch.tensor(v, dtype=torch.uint64)])
def test_uint64_ids_report_the_value_not_its_int64_wrap(make):
    sampler = NeighborSampler(_graph(), [1], seed=0)
    ids = make([0, U64_MAX])
    with pytest.raises(ValueError, match=rf"seeds: 1 of 2 ids outside .*, first {U64_MAX}$") as err:
        sampler.sample(ids)
    assert "first -1" not in str(err.value)
    with pytest.raises(ValueError, match=rf"ids: 1 of 2 ids outside \[0, num_rows=4\), first {U64_MAX}"):
        FeatureStore(torch.zeros(4, 2)).gather(ids)
    assert sampler.sample(make([3, 0]))[-1].dst_nodes.tolist() == [3, 0]  # in range: accepted


def test_uint64_ids_of_a_hetero_sampler_and_exclusions():
    sampler = HeteroNeighborSampler(_hetero(), [1], seed=0)
    with pytest.raises(ValueError, match=rf"seeds\['item'\]: .*first {U64_MAX}"):
        sampler.sample({"item": np.array([U64_MAX], dtype=np.uint64)})
    homo = NeighborSampler(_graph(), [1], seed=0)
    with pytest.raises(ValueError, match=rf"exclude_eids: .*num_edges=3\), first {U64_MAX}"):
        homo.sample(torch.tensor([0]), exclude_eids=np.array([U64_MAX], dtype=np.uint64))
    assert homo.sample(torch.tensor([0]), exclude_eids=np.array([2], dtype=np.uint64))[0].num_edges == 1


# ------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("b", [1, 3, MAX_BATCH])
def test_batch_size_edge_values_are_accepted(b):
    loader = NeighborLoader(_graph(), torch.tensor([0, 3]), [1], batch_size=b, seed=0, prefetch=0)
    assert len(loader) == (2 if b == 1 else 1)
    assert _link(batch_size=b).batch_size == b


@pytest.mark.parametrize("b", [0, -1, MAX_BATCH + 1, 2**64])
def test_batch_size_outside_the_range_is_refused(b):
    with pytest.raises(ValueError, match=rf"batch_size must be (>= 1|<= {MAX_BATCH}), got {b}"):
        NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=b)
    with pytest.raises(ValueError, match=rf"batch_size must be (>= 1|<= {MAX_BATCH}), got {b}"):
        _link(batch_size=b)


def test_batch_size_bool_is_a_type_error():
    with pytest.raises(TypeError, match="batch_size must be an int, got True"):
        NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=True)
    with pytest.raises(TypeError, match="batch_size must be an int, got True"):
        _link(batch_size=True)


def test_num_negatives_range():
    assert _link(num_negatives=MAX_FANOUT).num_negatives == MAX_FANOUT
    assert _link(num_negatives=1).num_negatives == 1
    for k in (0, MAX_FANOUT + 1, 2**63):
        with pytest.raises(ValueError, match=rf"num_negatives must be (>= 1|<= {MAX_FANOUT}), got {k}"):
            _link(num_negatives=k)
    with pytest.raises(TypeError, match="num_negatives must be an int, got True"):
        _link(num_negatives=True)


def test_prefetch_range():
    loader = NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=1, prefetch=0)
    assert loader.prefetch == 0
    with pytest.raises(ValueError, match="prefetch must be an int >= 0 and <= 2147483647, got -1"):
        NeighborLoader(_graph(), torch.tensor([0]), [1], batch_size=1, prefetch=-1)
    with pytest.raises(ValueError, match=rf"prefetch must be an int >= 0 and <= {MAX_BATCH}, got 2147483648"):
        LinkLoader(_link(), prefetch=MAX_BATCH + 1)
    with pytest.raises(TypeError, match="prefetch must be an int >= 0, got True"):
        LinkLoader(_link(), prefetch=True)


# ------------------------------------------------------------------------------------------- features
def test_feature_store_int_arguments():
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    g = _graph()
    with FeatureStore(x, cache_rows=0, staging_slots=1, threads=1, presample_batches=0,
                      presample_batch_size=1, seed=U64_MAX) as store:
        assert store.gather(torch.tensor([3])).tolist() == [[6.0, 7.0]]
    bad = [("cache_rows", -1, "cache_rows must be >= 0, got -1"),
           ("staging_slots", 0, "staging_slots must be >= 1, got 0"),
           ("staging_slots", MAX_BATCH + 1, f"staging_slots must be <= {MAX_BATCH}"),
           ("threads", 0, "threads must be >= 1, got 0"),
           ("presample_batches", -1, "presample_batches must be >= 0, got -1"),
           ("presample_batch_size", 0, "presample_batch_size must be >= 1, got 0"),
           ("seed", -1, r"seed must be in \[0, 2\*\*64\), got -1")]
    for name, value, match in bad:
        with pytest.raises(ValueError, match=match):
            FeatureStore(x, graph=g, **{name: value})
    for name in ("cache_rows", "staging_slots", "threads", "presample_batches", "presample_batch_size",
                 "seed"):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            FeatureStore(x, graph=g, **{name: True})


def test_presample_fanouts_are_bounded():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=rf"presample_fanouts\[1\] must be <= {MAX_FANOUT}"):
        FeatureStore(x, cache_rows=2, cache_policy="presample", graph=_graph(),
                     presample_fanouts=(2, 2**63))


# ------------------------------------------------------------------------------------------- full graph
def test_partition_bytes_range():
    g = _graph()
    fg = FullGraph(g, partition_bytes=1 << 40)
    fg.partition_bytes = 2**64  # more than any device: the device tier's free bytes bound it
    assert fg(torch.ones(4, 1)).shape == (4, 1)
    with pytest.raises(ValueError, match="partition_bytes must be > 0, got 0"):
        FullGraph(g, partition_bytes=0)
    with pytest.raises(ValueError, match=r"partition_bytes|size must be >= 0"):
        FullGraph(g, partition_bytes=-1)
    with pytest.raises(TypeError, match="got bool"):
        FullGraph(g, partition_bytes=True)
    fg.close()


# ------------------------------------------------------------------------------------------- hetero graphs
def test_hetero_graph_node_counts_and_uint64_ids():
    rel = {CLICKS: (np.array([0], dtype=np.uint64), np.array([0], dtype=np.uint64))}
    assert HeteroGraph.from_edges({"user": 1, "item": np.int64(1)}, rel).num_nodes == {"user": 1, "item": 1}
    with pytest.raises(ValueError, match=r"num_nodes\['user'\] must be >= 0, got -1"):
        HeteroGraph.from_edges({"user": -1, "item": 1}, rel)
    with pytest.raises(ValueError, match=r"num_nodes\['user'\] must be <= 9223372036854775807"):
        HeteroGraph.from_edges({"user": 2**63, "item": 1}, rel)
    for bad in (True, 2.5):
        with pytest.raises(TypeError, match=r"num_nodes\['user'\] must be an int"):
            HeteroGraph.from_edges({"user": bad, "item": 1}, rel)
    wrapped = {CLICKS: (np.array([U64_MAX], dtype=np.uint64), np.array([0], dtype=np.uint64))}
    with pytest.raises(ValueError, match=rf"src: 1 of 1 ids outside \[0, 1\), first {U64_MAX}"):
        HeteroGraph.from_edges({"user": 1, "item": 1}, wrapped)


def test_link_sampler_uint64_ids_are_reported_as_given():
    graph = CSCGraph.bipartite(np.array([0, 1]), np.array([0, 1]), 2, 3)
    sampler = NeighborSampler(graph, [2], seed=0)
    with pytest.raises(ValueError, match=rf"users: 1 of 2 ids above 2\*\*63 - 1.*first {U64_MAX}"):
        LinkSampler(sampler, np.array([0, U64_MAX], dtype=np.uint64), np.array([2, 3]))
    with pytest.raises(ValueError, match=r"items: 1 of 2 ids outside \[2, 5\) \(item_range\), first 5"):
        LinkSampler(sampler, np.array([0, 1]), np.array([2, 5], dtype=np.uint64))
    u64 = np.uint64
    assert LinkSampler(sampler, np.array([0, 1], dtype=u64), np.array([2, 4], dtype=u64)).num_pairs == 2


def test_feature_store_device_is_parsed_at_the_boundary():
    for device in ("tpu", "not a device"):
        with pytest.raises(ValueError, match=rf"device must be 'cpu' or 'cuda', got '{device}'"):
            FeatureStore(torch.zeros(2, 2), device=device)


# ------------------------------------------------------------------------------------------- times
def test_uint64_times_never_wrap_negative():
    graph = _graph()
    times = np.array([5, 7, 2**63 - 1], dtype=np.uint64)  # edge ids 0, 1, 2
    sampler = NeighborSampler(graph, [-1], seed=0, edge_times=times)
    # a uint64 seed time above 2**63 - 1 sees every edge (clamped), never wraps to a negative time
    late = sampler.sample(torch.tensor([0, 3]), seed_times=np.array([U64_MAX, U64_MAX], dtype=np.uint64))
    assert late[0].num_edges == 3
    early = sampler.sample(torch.tensor([0]), seed_times=np.array([6], dtype=np.uint64))
    assert early[0].edge_ids.tolist() == [0]
    with pytest.raises(ValueError, match=rf"edge_times: 1 of 3 times above 2\*\*63 - 1.*first {U64_MAX}"):
        NeighborSampler(graph, [-1], edge_times=np.array([0, 1, U64_MAX], dtype=np.uint64))
