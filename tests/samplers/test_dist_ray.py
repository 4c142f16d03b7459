"""samplers.distributed on Ray: owners as actors give NeighborSampler's blocks; a killed owner is named
within a second; an owner restarted from the folder lets sampling go on with no batch lost or short.

The session's one local Ray cluster (``ray_cluster`` of tests/conftest.py) serves the whole module.
The same code paths but Ray's run in-process in tests/samplers/test_dist_sampler.py."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_graph
from graphrl.partition import PartitionError, graph_fingerprint, write_partitions
from samplers import NeighborSampler
from samplers.distributed import DistFeatureStore, DistNeighborSampler, OwnerError, RayOwners

ray = pytest.importorskip("ray", reason="the Ray owners need ray: pip install 'graphrl[ray]'")
pytestmark = pytest.mark.slow  # a Ray session and two owner processes: ~30 s on 2 cores

N, E = 800, 8000


@pytest.fixture(scope="module")
def setup(ray_cluster, tmp_path_factory):
    graph = synthetic_graph(N, E, "powerlaw", seed=3)
    path = tmp_path_factory.mktemp("ray") / "parts"
    write_partitions(graph, path, 2, method="ldg", features=np.arange(N, dtype=np.float32)[:, None])
    owners = RayOwners(str(path), expect=graph_fingerprint(graph))
    yield graph, owners
    owners.close()


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        for f in ("src_nodes", "indptr", "indices", "edge_ids"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f


def test_ray_owners_sample_and_fetch(setup):
    graph, owners = setup
    seeds = torch.arange(0, N, 5)
    _same(NeighborSampler(graph, [4, 3], seed=9).sample(seeds), DistNeighborSampler(owners, [4, 3], seed=9)
          .sample(seeds))
    ref, dist = NeighborSampler(graph, [4, 3], seed=2), DistNeighborSampler(owners, [4, 3], seed=2)
    batches = [torch.arange(lo, N, 9) for lo in range(5)]  # two groups in flight at once, over Ray
    for b, blocks in zip(batches, dist.sample_many(batches, batches_per_request=2, in_flight=2), strict=True):
        _same(ref.sample(b), blocks)
    assert DistFeatureStore(owners).fetch(torch.tensor([5, 1, 700]))[:, 0].tolist() == [5.0, 1.0, 700.0]
    assert {owners.info(p)["part"] for p in range(2)} == {0, 1} and owners.stats.bytes_received > 0
    with pytest.raises(PartitionError, match="another graph"):
        RayOwners(owners.folder, expect=graph_fingerprint(synthetic_graph(N, E, seed=4)))
    import pickle

    with pytest.raises(TypeError, match=r"RayOwners cannot be pickled: .* RayOwners.attach"):
        pickle.dumps(DistNeighborSampler(owners, [2], seed=0))


def test_an_owner_of_a_damaged_part_fails_naming_the_file(setup, tmp_path):
    import shutil

    _, owners = setup
    copy = shutil.copytree(owners.folder, tmp_path / "copy")
    (copy / "part1" / "edge_ids.npy").write_bytes(b"\x93NUMPY damaged")
    with pytest.raises(OwnerError, match="partition owner 1 failed to start .*part1/edge_ids.npy: truncated"):
        RayOwners(str(copy))


def test_killed_owner_is_named_at_once_and_restart_goes_on(setup):
    graph, owners = setup
    ref = NeighborSampler(graph, [5, 5], seed=1)
    dist = DistNeighborSampler(owners, [5, 5], seed=1)
    seeds = torch.arange(0, N, 3)
    _same(ref.sample(seeds), dist.sample(seeds))
    os.kill(owners.info(1)["pid"], signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(OwnerError, match=r"partition owner 1 \(Ray actor, pid \d+.*died") as err:
        dist.sample(seeds)
    assert time.perf_counter() - t0 < 1.0 and err.value.part == 1
    owners.restart(1)
    _same(ref.sample(seeds), dist.sample(seeds))  # the failed call is not lost: the same batch comes again
    assert dist.sample(seeds)[0].num_edges == ref.sample(seeds)[0].num_edges


def test_a_hung_owner_is_named_at_the_timeout_and_the_batch_comes_again(setup):
    graph, owners = setup
    ref, dist = NeighborSampler(graph, [3], seed=2), DistNeighborSampler(owners, [3], seed=2)
    seeds = torch.arange(0, N, 2)
    pid = owners.info(0)["pid"]
    os.kill(pid, signal.SIGSTOP)
    owners.timeout_s = 0.5
    try:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match=r"partition owners \[0\] .* did not answer sample within"):
            dist.sample(seeds)
        assert time.perf_counter() - t0 < 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
        owners.timeout_s = None
    _same(ref.sample(seeds), dist.sample(seeds))  # the call counter did not move: the same batch, whole
