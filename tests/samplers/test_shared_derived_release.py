"""Pickling a CPU sampler with plain `pickle` (never unpickled) or `copy.deepcopy` moves its per-edge arrays
(`samplers._csc.SHARED`: weights, times and the derived pairs and prefix sums) into shared memory
(`samplers._csc.share_loop`); that memory is released once its holders go, under both of torch's sharing
strategies: with ``file_descriptor`` (the default) each array holds one open descriptor of an unlinked
``/dev/shm`` file, with ``file_system`` one named ``/dev/shm/torch_<pid>_*`` file; counted here before and
after, only the files and descriptors this process made."""

from __future__ import annotations

import copy
import gc
import os
import pickle

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from graphrl.graph import CSCGraph
from samplers import LaborSampler, NeighborSampler
from samplers._csc import SHARED

N, E = 90, 700
SEEDS = torch.arange(0, 15)


def held() -> tuple[set[str], set[str]]:
    """(this process's ``/dev/shm/torch_<pid>_*`` files, its open descriptors of ``/dev/shm`` files)."""
    pid = os.getpid()
    files = {n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{pid}_")}
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        if target.startswith("/dev/shm/"):
            fds.add(f"{fd} {target}")
    return files, fds


@pytest.fixture(params=["file_descriptor", "file_system"])
def strategy(request):
    before = mp.get_sharing_strategy()
    mp.set_sharing_strategy(request.param)
    yield request.param
    mp.set_sharing_strategy(before)


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.isdir("/proc/self/fd"),
                    reason="counts /dev/shm files and /proc/self/fd descriptors (Linux)")
@pytest.mark.parametrize("cls", [NeighborSampler, LaborSampler])
def test_shared_copies_of_a_pickled_or_copied_sampler_are_released_with_their_holders(strategy, cls):
    rng = np.random.default_rng(7)
    src, dst = (torch.from_numpy(rng.integers(0, N, E)) for _ in range(2))
    g = CSCGraph.from_edges(src, dst, N)
    gc.collect()
    files0, fds0 = held()
    s = cls(g, [3, 2], seed=0, weights=torch.rand(E, generator=torch.Generator().manual_seed(1)))
    s.sample(SEEDS)
    arrays = sum(getattr(r, name) is not None for r in s.loop.relations.values() for name in SHARED)
    assert arrays >= 2  # the weights and the pairs at least

    def made() -> tuple[int, int]:
        files, fds = held()
        return len(files - files0), len(fds - fds0)

    one_each = (arrays, 0) if strategy == "file_system" else (0, arrays)
    assert made() == (0, 0)
    blob = pickle.dumps(s)  # never unpickled: s's arrays now live in shared memory
    assert made() == one_each
    c = copy.deepcopy(s)  # the copy's arrays are its own (private), s keeps its shared ones
    assert made() == one_each
    for a, b in zip(s.sample(SEEDS), c.sample(SEEDS), strict=True):  # the copy continues s's stream
        assert torch.equal(a.indices, b.indices) and torch.equal(a.edge_ids, b.edge_ids)
    del s, blob
    gc.collect()
    assert made() == (0, 0)
    d = copy.deepcopy(c)  # now c's move into shared memory
    assert made() == one_each
    del c, d
    gc.collect()
    assert made() == (0, 0)
