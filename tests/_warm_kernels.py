"""Compile the samplers' numba kernels into numba's on-disk cache, on the core the test session leaves idle.

`tests/conftest.py` starts this script in a background process when a session begins (set
``GRAPHRL_TEST_WARM=0`` to skip it). The kernels are ``cache=True``: whatever this compiles, the tests
that come later load instead of compiling again (the sampler tests run last and otherwise compile for
minutes on a cold checkout). It asserts nothing and prints nothing; the tests check every result.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers.labor import LaborSampler
from samplers.neighbor import NeighborSampler


def main() -> None:
    warnings.simplefilter("ignore")
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
