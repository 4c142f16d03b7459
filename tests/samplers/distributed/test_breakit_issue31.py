"""Issue 31 under a new user's hands: partitioned graphs sampled through `samplers.distributed`.

Relative folders and owners restarted from another directory; every part file damaged in turn and
named; a part with no nodes; feature rows and the store's counters by hand; several trainers
(attached by name) that each restart a killed Ray owner and go on with the same blocks; an owner
restarted by an attached trainer (a Ray actor) outlives that trainer, as the first owners do.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_graph
from graphrl.partition import PartitionError, graph_fingerprint, load_partition, write_partitions
from samplers import NeighborSampler
from samplers.distributed import DistFeatureStore, DistNeighborSampler, LocalOwners, OwnerError

N, E = 500, 4000


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(N, E, "powerlaw", seed=3)


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f


def test_a_relative_folder_is_the_one_of_when_the_owners_were_made(graph, tmp_path, monkeypatch):
    write_partitions(graph, tmp_path / "parts", 3, method="ldg")
    monkeypatch.chdir(tmp_path)
    owners = LocalOwners("parts")
    monkeypatch.chdir("/")  # a trainer that moved on; restarted owners still read the same folder
    assert owners.folder == str(tmp_path / "parts")
    owners.restart(1)
    seeds = torch.arange(0, N, 4)
    _same(NeighborSampler(graph, [3, 2], seed=1).sample(seeds),
          DistNeighborSampler(owners, [3, 2], seed=1).sample(seeds))


def test_each_damaged_file_of_a_part_is_named(graph, tmp_path):
    import shutil

    src = tmp_path / "parts"
    write_partitions(graph, src, 2, method="ldg", features=torch.randn(N, 2), labels=torch.arange(N))
    names = sorted(p.name for p in (src / "part1").iterdir())
    assert {"indptr.npy", "indices.npy", "edge_ids.npy", "halo.npy", "features.npy", "labels.npy"} <= {*names}
    for name in names:
        copy = shutil.copytree(src, tmp_path / f"d_{name}")
        path = copy / "part1" / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2 + 1] ^= 1  # one bit, the size unchanged
        path.write_bytes(bytes(data))
        load_partition(copy, 0)  # the other part is whole
        with pytest.raises(PartitionError, match=f"part1/{name}"):
            load_partition(copy, 1)
        with pytest.raises(PartitionError, match=f"part1/{name}"):  # the book is whole; part 1 is not
            LocalOwners(str(copy))


def test_a_part_with_no_nodes_samples_and_fetches_as_the_whole_graph(graph, tmp_path):
    owner = np.where(np.arange(N) < 200, 0, 2)  # part 1 owns nothing
    x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
    write_partitions(graph, tmp_path / "parts", 3, owner=owner, features=x, labels=torch.arange(N))
    owners = LocalOwners(str(tmp_path / "parts"))
    ref, dist = NeighborSampler(graph, [3, -1], seed=2), DistNeighborSampler(owners, [3, -1], seed=2)
    batches = [torch.arange(k, N, 9) for k in range(5)]
    for seeds, blocks in zip(batches, dist.sample_many(batches, batches_per_request=2), strict=True):
        _same(ref.sample(seeds), blocks)
    assert torch.equal(DistFeatureStore(owners, "labels").fetch(torch.arange(N)), torch.arange(N))


def test_a_graph_with_no_edges_is_balanced_and_samples_empty_blocks(tmp_path):
    from graphrl.graph import CSCGraph

    empty = CSCGraph.from_edges(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 6)
    body = write_partitions(empty, tmp_path / "parts", 3, method="ldg")
    assert body["balance"]["edge_imbalance"] == 1.0 and body["balance"]["node_imbalance"] == 1.0  # was 0.0
    dist = DistNeighborSampler(LocalOwners(str(tmp_path / "parts")), [2, -1], seed=0)
    _same(NeighborSampler(empty, [2, -1], seed=0).sample(torch.arange(6)), dist.sample(torch.arange(6)))


@pytest.mark.parametrize("per", [1, 3])
def test_owner_bytes_of_a_layer_by_hand(graph, tmp_path, per):
    write_partitions(graph, tmp_path / "parts", 3, method="ldg")
    owners = LocalOwners(str(tmp_path / "parts"))
    batches = [torch.arange(k, N, 7) for k in range(per)]  # distinct seeds: the frontier is the seeds
    got = list(DistNeighborSampler(owners, [4], seed=1).sample_many(batches, batches_per_request=per))
    s, frontier = owners.stats, sum(b.numel() for b in batches)
    edges = sum(blocks[0].num_edges for blocks in got)
    assert s.requests == len(np.unique(owners.book.node_part[: N])) == 3
    assert s.bytes_sent == 4 * frontier + s.requests * 8 * (7 + 3 * per)  # int32 ids and the header
    assert s.bytes_received == 4 * frontier + s.requests * 4 * per + 8 * edges  # rows, offsets, edges


def test_feature_store_rows_hits_and_bytes_by_hand(graph, tmp_path):
    x = torch.randn(N, 5)
    write_partitions(graph, tmp_path / "parts", 3, method="ldg", features=x)
    owners = LocalOwners(str(tmp_path / "parts"))
    store = DistFeatureStore(owners, cache_ids=torch.tensor([7, 3, 7], dtype=torch.int32))
    ids = torch.tensor([3, 7, 3, 8, 9, 8, 499, 0])
    assert torch.equal(store.fetch(ids), x[ids])
    book = owners.book.node_part
    misses = ids.numpy()[~np.isin(ids.numpy(), [3, 7])]
    s = store.stats
    assert (s.hits, s.misses) == (3, 5) and s.hit_rate == 3 / 8
    assert s.requests == len(np.unique(book[misses]))  # one request per owner of a miss
    assert s.bytes_moved == misses.size * (5 * 4 + 8)  # float32 rows back, int64 ids out
    assert store.fetch(torch.empty(0, dtype=torch.int64)).shape == (0, 5)
    assert store.stats.requests == s.requests


def test_an_invalid_actor_option_is_raised_at_once_not_retried_as_a_held_name():
    ray = pytest.importorskip("ray", reason="the Ray owners need ray: pip install 'graphrl[ray]'")
    from samplers.distributed.owners import _remote

    start = time.monotonic()
    with pytest.raises(ValueError, match="bogus_option"):  # checked by .options(), no session needed
        _remote(ray.remote(LocalOwners), {"bogus_option": 1}, ())
    assert time.monotonic() - start < 2.0  # the held-name wait is 5 s


@pytest.fixture(scope="module")
def owner_group(graph, tmp_path_factory, ray_cluster):
    """``owner_group()``: (folder, the RayOwners group that started two owners of ``graph``'s partitions),
    shared by this module's tests that kill and restart an owner (each starts from live owners; starting a
    group costs seconds): the one started earlier while it is open, else a new one."""
    from samplers.distributed import RayOwners

    folder = tmp_path_factory.mktemp("breakit31") / "parts"
    write_partitions(graph, folder, 2, method="ldg")
    held: list = []

    def group():
        if not held or held[-1].closed:
            held.append(RayOwners(str(folder), expect=graph_fingerprint(graph), name="breakit31"))
        return str(folder), held[-1]

    yield group
    for owners in held:
        if not owners.closed:
            owners.close()


@pytest.mark.slow  # a Ray session and two owner processes
def test_every_attached_trainer_restarts_a_killed_owner_and_goes_on(graph, owner_group):
    from samplers.distributed import RayOwners

    folder, first = owner_group()
    second = RayOwners.attach(folder, first.name)  # another trainer's view
    seeds = torch.arange(0, N, 3)
    trainers = [(NeighborSampler(graph, [4, 3], seed=s), DistNeighborSampler(o, [4, 3], seed=s))
                for s, o in ((0, first), (1, second))]
    for ref, dist in trainers:
        _same(ref.sample(seeds), dist.sample(seeds))
    os.kill(first.info(1)["pid"], signal.SIGKILL)
    for _, dist in trainers:
        t0 = time.perf_counter()
        with pytest.raises(OwnerError, match=r"partition owner 1 .*died.*restart\(1\)"):
            dist.sample(seeds)
        assert time.perf_counter() - t0 < 1.0
    t0 = time.perf_counter()
    second.restart(1)  # the attached trainer starts the new owner ...
    first.restart(1)  # ... and the one that started the first attaches it (was: name taken after 5 s)
    assert time.perf_counter() - t0 < 30.0  # no hang (two process starts: 3-13 s on a loaded 2-core box)
    assert first.info(1)["pid"] == second.info(1)["pid"]
    for ref, dist in trainers:  # the failed batch comes again, whole
        _same(ref.sample(seeds), dist.sample(seeds))


class _Trainer:
    """A trainer in a process of its own (a Ray actor) that attaches to named owners and restarts one."""

    def __init__(self, folder: str, name: str) -> None:
        from samplers.distributed import RayOwners

        self.owners = RayOwners.attach(folder, name)

    def pid(self, part: int) -> int:
        return self.owners.info(part)["pid"]

    def restart(self, part: int) -> int:
        self.owners.restart(part)
        return self.pid(part)


def _gone(ray, name: str, within_s: float) -> bool:
    """Whether no live actor holds ``name`` within ``within_s`` seconds (Ray frees names asynchronously)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow  # a Ray session, two owner processes and a trainer's
def test_an_owner_restarted_by_an_attached_trainer_outlives_that_trainer(graph, owner_group, ray_cluster):
    from samplers.distributed import RayOwners

    ray = ray_cluster
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _Trainer travels by value
    (folder, first), seeds = owner_group(), torch.arange(0, N, 3)
    name = first.name
    try:
        trainer = ray.remote(num_cpus=0)(_Trainer).remote(folder, name)
        assert ray.get(trainer.pid.remote(1)) == first.info(1)["pid"]  # attached
        os.kill(first.info(1)["pid"], signal.SIGKILL)
        pid = ray.get(trainer.restart.remote(1))  # the trainer that did not start the owners restarts one
        ray.kill(trainer, no_restart=True)  # ... and ends (its job done, or it failed)
        deadline = time.monotonic() + 10.0  # ray.kill returns at once: a call may still reach the trainer
        with pytest.raises(ray.exceptions.RayActorError):  # a harmless call: gone
            while time.monotonic() < deadline:
                ray.get(trainer.pid.remote(1))
                time.sleep(0.05)
        later = RayOwners.attach(folder, name)  # was: owner 1 died with the trainer
        assert later.info(1)["pid"] == pid
        first.restart(1)  # the first group attaches the live owner the trainer started
        assert first.info(1)["pid"] == pid
        for owners in (first, later):
            _same(NeighborSampler(graph, [4, 3], seed=5).sample(seeds),
                  DistNeighborSampler(owners, [4, 3], seed=5).sample(seeds))
    finally:
        first.close()
    for part in (0, 1):  # closing the first group ends the restarted owner too: nothing left running
        assert _gone(ray, f"{name}.owner{part}", 5.0)
    assert _gone(ray, f"{name}.keeper", 5.0)  # nor the keeper (a leaked actor, else)


@pytest.mark.slow  # a Ray session and two owner processes
def test_a_refused_start_leaves_no_keeper_behind(graph, tmp_path, ray_cluster):
    from samplers.distributed import RayOwners

    ray = ray_cluster
    write_partitions(graph, tmp_path / "parts", 2, method="ldg")
    folder = str(tmp_path / "parts")
    with pytest.raises(TypeError, match="max_restarts"):  # the keeper starts, then the owners are refused
        RayOwners(folder, name="refused31", actor_options={"lifetime": "detached", "max_restarts": "x"})
    assert _gone(ray, "refused31.keeper", 5.0)  # was: a detached keeper left running, holding the name
