"""Compile the replay store's and the samplers' numba kernels into numba's on-disk cache, on the core the test
session leaves idle.

`tests/conftest.py` starts this script in a background process when a session begins (set
``GRAPHRL_TEST_WARM=0`` to skip it). The kernels are ``cache=True``: whatever this compiles, the tests
that come later load instead of compiling again (the replay tests run after the core's, the sampler tests
last, and otherwise compile for minutes on a cold checkout). The replay store's paths come first. It
asserts nothing and prints nothing; the tests check every result.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from samplers.labor import LaborSampler
from samplers.neighbor import NeighborSampler


def replay_paths() -> None:
    """Writers, fused transitions and short windows, the lock-free window path, priority updates and the
    codecs' encode and decode."""
    rng = np.random.default_rng(0)
    frame = ((24, 20), "uint8")
    fields = {"obs": frame, "pos": ((), "int64"), "done": ((), "bool")}
    for codec in ("lz4", "zstd", "lz4dict"):
        fields[codec] = ((24, 20), "uint8", codec, 2.0, 4)
    with MemoryManager() as mm:
        for selector in (Uniform(), Prioritized(0.6)):
            store = ReplayStore(TrajectorySpec(fields), 512, 2, memory=mm, seed=1, timeout=5.0,
                                selector=selector)
            with store.writer(chunk_steps=16) as w:
                for n in (40, 70, 33):
                    obs = rng.integers(0, 4, (n, 24, 20), dtype=np.uint8)
                    step = {"obs": obs, "pos": np.arange(n), "done": np.arange(n) == n - 1}
                    step.update({c: obs for c in ("lz4", "zstd", "lz4dict")})
                    w.extend(step)
                    w.end_episode()
            for batch_size, length in ((8, 1), (8, 4), (4, 16)):
                for pad in ("head", "tail"):
                    batch = store.sample(batch_size, length, pad)
                    store.update_priorities(batch.keys, torch.rand(batch_size) + 0.1)
                    batch.release()
            store.close()
        plain = ReplayStore(TrajectorySpec({"obs": frame, "pos": ((), "int64")}), 256, 1, memory=mm, seed=1,
                            timeout=5.0, selector=Prioritized(0.6))
        with plain.writer() as w:
            w.add_episode({"obs": rng.integers(0, 4, (90, 24, 20), dtype=np.uint8), "pos": np.arange(90)})
        for length in (1, 4):
            batch = plain.sample(16, length)
            plain.update_priorities(batch.keys, torch.rand(16) + 0.1)
            batch.release()
        plain.close()


def main() -> None:
    warnings.simplefilter("ignore")
    try:
        replay_paths()
    except Exception:  # noqa: BLE001 - a warm-up: the replay tests report any failure of these paths
        pass
    rng = np.random.default_rng(0)
    n, e = 300, 3000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), np.minimum(rng.geometric(0.02, e) - 1, n - 1), n)
    seeds = torch.from_numpy(rng.integers(0, n, 16))
    excluded = torch.from_numpy(rng.integers(0, e, 40))
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    times = {"int64": rng.integers(0, 100, e), "float64": rng.random(e) * 100}
    for fanouts in ([3, 2], [-1], [70], [15, 10, 5]):
        for replace in (False, True):
            for kw in ({}, {"weights": weights}):
                sampler = NeighborSampler(graph, fanouts, replace=replace, seed=1, **kw)
                sampler.sample(seeds)
                sampler.sample(seeds, exclude_eids=excluded)
            for t in times.values():
                sampler = NeighborSampler(graph, fanouts, replace=replace, seed=1, edge_times=t)
                sampler.sample(seeds, seed_times=np.full(seeds.shape[0], t.max(), dtype=t.dtype))
    for importance in (0, 1, 2):
        for kw in ({}, {"weights": weights}):
            LaborSampler(graph, [5, 3], importance_sampling=importance, seed=1, **kw).sample(seeds)


if __name__ == "__main__":
    main()
