"""A closed GPU sampler that is still referenced keeps no pool block (docs/architecture.md#memory-tiers).

`CudaMemory.close` drops the views its holders keep (the `CudaGraph`'s kernel arrays and stand-ins, the
`TypedCsc`'s, the layer loop's `CudaWorkspace` scratch and staging buffers, LABOR's arrays) before it
frees the regions, so the pool can trim or reuse every block. Before, the closed sampler's views kept
every block alive: ``mm.trim()`` released none, and a second sampler on a budget that fits one failed
with a pool error although the budget read 0 bytes used. Under numba's CUDA simulator (a subprocess) and
on a real GPU (``pytest -m gpu``), for NeighborSampler, LaborSampler (importance sampling: its per-node
arrays) and HeteroNeighborSampler (a fused `TypedCsc` and a temporal relation).
"""

from __future__ import annotations

import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc
    import os
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    from pathlib import Path
    import numpy as np
    import torch
    from graphrl import cuda as gcuda
    from graphrl.datasets import load_lastfm, load_planetoid
    from graphrl.memory import MemoryManager
    from samplers.hetero import HeteroNeighborSampler, lastfm_hetero_graph
    from samplers.labor import LaborSampler
    from samplers.neighbor import NeighborSampler

    DEVICE = "cuda" if gcuda.has_cuda() else "cpu"  # where the manager's device tier must be
    root = Path(os.environ.get("GRAPHRL_DATA", Path.cwd().parent / "shared" / "data"))
    cora = load_planetoid("cora", root).graph
    lastfm = lastfm_hetero_graph(load_lastfm(root))
    LISTENS, HEARD, FRIENDS = lastfm.relations
    t_friends = torch.from_numpy(np.random.default_rng(3).integers(0, 50, lastfm.num_edges(FRIENDS)))

    def held(mm):
        pools = mm.stats()["pools"]
        return pools["device"]["held_bytes"], pools["pinned"]["held_bytes"]

    CASES = {
        "neighbor": (lambda mm: NeighborSampler(cora, [4, 3], seed=5, device="cuda", memory=mm),
                     lambda s: s.sample(torch.arange(12))),
        "labor": (lambda mm: LaborSampler(cora, [4, 3], importance_sampling=1, seed=5, device="cuda",
                                          memory=mm), lambda s: s.sample(torch.arange(12))),
        "hetero": (lambda mm: HeteroNeighborSampler(lastfm, {LISTENS: [2], HEARD: [2], FRIENDS: [2]},
                                                    edge_times={FRIENDS: t_friends}, seed=7, device="cuda",
                                                    memory=mm),
                   lambda s: s.sample({"user": torch.tensor([0, 5, 77]), "artist": torch.tensor([3, 100])},
                                      seed_times={"user": torch.tensor([10, 49, 30]),
                                                  "artist": torch.tensor([20, 40])})),
    }
    for name, (build, run) in CASES.items():
        mm = MemoryManager(device=DEVICE)
        s = build(mm)
        run(s)
        built, peak = held(mm), mm.usage()["device"]["peak"]
        assert built[0] > 0, (name, built)
        s.close()
        gc.collect()
        assert mm.usage()["device"]["used"] == 0 and mm.usage()["pinned"]["used"] == 0, name
        mm.trim()
        # the closed sampler (still referenced) keeps no block: every one went upstream
        assert held(mm) == (0, 0), (name, held(mm), built)
        # a budget that fits one sampler (its peak and half again: less than two) runs the next one beside
        # the closed one
        small = MemoryManager(device=DEVICE, budgets={"device": peak + peak // 2})
        first = build(small)
        run(first)
        first.close()
        second = build(small)
        run(second)
        assert small.stats()["pools"]["device"]["pool_hits"] > 0, name  # the closed one's blocks reused
        second.close()
        del first, second, s
        small.close()
        mm.close()
    print("OK")
    """
)


@pytest.mark.slow
@pytest.mark.simulated(SCRIPT)
def test_a_closed_gpu_sampler_keeps_no_pool_block_under_the_simulator(data_root, simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


@pytest.mark.gpu
def test_a_closed_gpu_sampler_keeps_no_pool_block(data_root, monkeypatch) -> None:
    """On a real GPU: the same checks, the device regions CUDA tensors and the pinned ones page-locked."""
    monkeypatch.setenv("GRAPHRL_DATA", str(data_root))
    namespace: dict = {}
    exec(compile(SCRIPT, "<closed views script>", "exec"), namespace)  # noqa: S102 - the module's own script
