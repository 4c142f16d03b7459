"""Typed graphs on the GPU in one launch per kernel and layer (`samplers.kernels.cuda.typed`), under numba's
CUDA simulator in a subprocess (the simulator must be chosen before numba.cuda is first imported): the fused
path's blocks equal the CPU typed sampler's for uniform draws (with and without replacement, exclusions,
fanout -1, a fanout above the thread-per-row limit, with replacement too) and weighted draws; the launch
counter shows one plan, one scan and one rows launch per layer (and one warp-rows launch where a relation
takes a warp per row) whatever the number of relations; the layer loop refuses a concatenated CSC on the
CPU or with a relation of another mode. (The typed kernels compile to sm_90 PTX in test_sampler_cuda_sim's
PTX script, with every other sampling kernel.)"""

from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest

from samplers.layers import LayerLoop
from samplers.modes import RelationArrays, TemporalMode, UniformMode

SIM_SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from samplers.hetero import HeteroGraph, HeteroNeighborSampler
    from samplers.kernels import cuda as ck
    from samplers.kernels.cuda import typed  # noqa: F401
    warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around in the simulated RNG

    CLICKS, BY = ("user", "clicks", "item"), ("item", "clicked_by", "user")
    FOLLOWS, TAGS = ("user", "follows", "user"), ("tag", "labels", "item")
    rng = np.random.default_rng(0)
    U, I, T = 12, 8, 5
    cu, ci = rng.integers(0, U, 40), rng.integers(0, I, 40)
    fu, fv = rng.integers(0, U, 20), rng.integers(0, 4, 20)  # only users 0-3 are followed
    tt, ti = rng.integers(0, T, 15), rng.integers(0, I, 15)
    edges = {CLICKS: (cu, ci), BY: (ci, cu), FOLLOWS: (fu, fv), TAGS: (tt, ti)}
    weights = {CLICKS: torch.tensor(rng.random(40) * (rng.random(40) < 0.7)),
               TAGS: torch.tensor(rng.random(15))}
    graph = HeteroGraph.from_edges({"user": U, "item": I, "tag": T}, edges, weights=weights)
    excl = {CLICKS: torch.tensor([1, 5, 9, 9]), TAGS: torch.tensor([2])}
    item_seeds = dict(seeds={"item": torch.tensor([0, 3, 3, 7])})  # no user rows in the outer layer
    mixed = dict(seeds={"user": torch.tensor([1, 2]), "item": torch.tensor([5])}, exclude_eids=excl)

    # independent read-back counter: the simulator's device-to-host copies and host-side scalar reads of
    # device arrays (kernels run in other threads), blocks' conversion to host tensors not counted
    sys.path.insert(0, "tests")
    from _cuda_copies import ALLOCATION, PAGEABLE, count_host_copies
    copies = count_host_copies()

    per_relation = [0]  # layers of one relation sampled by the per-relation launches
    own = ck.sample_layer_cuda
    def counted(*args, **kwargs):
        per_relation[0] += 1
        return own(*args, **kwargs)
    ck.sample_layer_cuda = counted

    from _typed_blocks import same_blocks

    def compare(fanouts, calls, what, chains=0, unchained=True, choose=0, **kw):
        cpu_s = HeteroNeighborSampler(graph, fanouts, seed=5, **kw)
        gpu_s = HeteroNeighborSampler(graph, fanouts, seed=5, device="cuda", **kw)
        per_relation[0] = 0
        for i, call in enumerate(calls):
            want = cpu_s.sample(**call)
            copies.clear()
            before = gpu_s.traffic.snapshot()
            same_blocks(gpu_s.sample(**call), want, (what, i))
            used = gpu_s.traffic.since(before)
            # a chain of layers: their sizes in one read-back (the library's count); an unchained layer reads
            # back four times at least (the fused layer's bounds, each type's relabelling)
            assert used.readbacks == chains, (what, i, used)
            if not unchained:  # each chained layer's parameters staged through a page-locked buffer, and the
                # call's inputs: the seeds of each seeded type, each sampled relation's excluded positions and
                # their concatenation (the fused layer's)
                excluded = sum(rel in fanouts for rel in call.get("exclude_eids", {}))
                inputs = sum(v.numel() > 0 for v in call["seeds"].values()) + excluded + (excluded > 0)
                assert used.pinned_copies == len(next(iter(fanouts.values()))) + inputs, (what, i, used)
            reads = copies.readbacks
            assert reads >= chains + 4 if unchained else reads == chains, (what, i, copies.seen)
        assert cpu_s.sampled_edges == gpu_s.sampled_edges > 0, (what, gpu_s.sampled_edges)
        layers = len(next(iter(fanouts.values()))) * len(calls)
        want = {"plan": layers, "scan": layers, "rows": layers}
        want.update({"choose": choose * len(calls)} if choose else {})
        assert gpu_s.launches == want, (what, gpu_s.launches)
        return gpu_s, per_relation[0]

    # uniform: fanouts below and above the degrees, -1, and follows at 70 in the inner layer (above the
    # thread-per-row Floyd subset: a warp per row, as -1), all fused and chained
    fan = {CLICKS: [3, 2], BY: [2, -1], FOLLOWS: [-1, 70], TAGS: [1, 2]}
    s, own_layers = compare(fan, [item_seeds, mixed], "uniform", chains=1, unchained=False, choose=2)
    assert own_layers == 0, own_layers
    csc = s.typed_csc
    assert csc.relations == [CLICKS, BY, FOLLOWS, TAGS] and not any(csc.weighted.values())
    cat = csc.graph.indptr.copy_to_host()
    for rel in csc.relations:  # each relation's rows, shifted by its edge base; its graph's own indptr
        rows = cat[csc.row_base[rel]:csc.row_base[rel] + csc.num_rows[rel] + 1]
        assert (rows - csc.edge_base[rel] == graph.indptr[rel].numpy()).all(), rel
        assert (csc.relation_graph(rel).indptr.copy_to_host() == graph.indptr[rel].numpy()).all(), rel
    # with replacement, every relation fused
    s, own_layers = compare(fan, [mixed], "replace", chains=1, unchained=False, choose=2, replace=True)
    assert own_layers == 0, own_layers
    # with replacement at 70, the only relation above the thread-per-row limit in its layer: a warp per row,
    # as the plain layers (uniform.warp_per_row): one warp-rows launch in that layer (a thread per row
    # before, 70 draws each; the same draws)
    fan70 = {CLICKS: [3, 2], BY: [2, 2], FOLLOWS: [2, 70], TAGS: [1, 2]}
    s, own_layers = compare(fan70, [mixed, item_seeds], "replace 70", chains=1, unchained=False, choose=1,
                            replace=True)
    assert own_layers == 0, own_layers
    # weighted on two relations (random fanouts, zero weights, exclusions) beside two uniform ones
    s, own_layers = compare({CLICKS: [3, 2], BY: [2, 2], FOLLOWS: [2, 3], TAGS: [1, 2]}, [mixed, item_seeds],
                            "weighted", chains=1, unchained=False,
                            weights=True)
    assert own_layers == 0 and s.typed_csc.weighted == {CLICKS: True, BY: False, FOLLOWS: False, TAGS: True}
    # as many launches with one relation as with four
    s, own_layers = compare({CLICKS: [3, 2]}, [item_seeds], "one relation", chains=1, unchained=False)
    assert s.typed_csc.relations == [CLICKS]
    # three uniform layers (0 draws nothing, -1 in the middle) in one chain
    fan = {CLICKS: [2, -1, 0], BY: [3, 2, 2], FOLLOWS: [1, 2, 0], TAGS: [2, 1, 3]}
    s, own_layers = compare(fan, [mixed], "chain with -1", chains=1, unchained=False, choose=1)

    # a warm typed chain (fused, and relation by relation with times) allocates on the device only the
    # arrays its blocks keep (the workspace's outputs), and copies no pageable host memory to the device
    # (seeds, seed times and excluded ids go through the workspace's page-locked staging): counted by
    # wrapping the simulator's allocator, its to_device and its kernels' host-array arguments; follows at -1
    # and 70 (a warp per row in the fused chain, its mode's capacity and warp rows relation by relation)
    from numba import cuda
    with copies.device_traffic():
        by_times = {BY: torch.from_numpy(rng.integers(0, 100, 40) + 0.5)}  # float times: staged as float64
        mixed_times = dict(seeds=mixed["seeds"], exclude_eids=excl,
                           seed_times={"user": torch.tensor([50.0, -0.0]), "item": torch.tensor([70.5])})
        fan = {CLICKS: [3, 2], BY: [2, 2], FOLLOWS: [-1, 70], TAGS: [1, 2]}
        for kw, call in (({"weights": True}, mixed), ({"edge_times": by_times}, mixed_times)):
            cpu_s = HeteroNeighborSampler(graph, fan, seed=5, **kw)
            gpu_s = HeteroNeighborSampler(graph, fan, seed=5, device="cuda", **kw)
            for i in range(2):
                copies.clear()
                want = cpu_s.sample(**call)
                before = gpu_s.traffic.snapshot()
                same_blocks(gpu_s.sample(**call), want, ("warm", list(kw), i))
                used = gpu_s.traffic.since(before)
                assert used.readbacks == 1 and used.chain_overflows == 0, (kw, i, used)
                if i:  # warm: no scratch grown, no host memory registered, no allocation outside the
                    # workspace
                    assert used.scratch_allocations == 0 and used.registrations == 0, (list(kw), used)
                    assert copies.seen[ALLOCATION] == used.output_allocations > 0, (list(kw), copies.seen)
                    assert copies.seen[PAGEABLE] == 0 and used.pinned_copies >= 5, (list(kw), copies.seen)

    # the unbounded pair relabelling (a typed temporal layer read back) equals the CPU one
    from samplers.kernels.cpu import relabel_pairs
    from samplers.kernels.cuda.relabel import relabel_pairs_cuda
    dst, dt = rng.choice(20, 6, replace=False), rng.integers(0, 3, 6)
    src, st = rng.integers(0, 20, 30), rng.integers(0, 3, 30)
    got = relabel_pairs_cuda(*(cuda.to_device(a.astype(np.int64)) for a in (dst, dt, src, st)))
    for g, w in zip(got, relabel_pairs(dst, dt, src, st), strict=True):
        assert (g.copy_to_host() == w).all(), (g.copy_to_host(), w)
    print("OK")
    """
)

@pytest.mark.simulated(SIM_SCRIPT, patches=True)
def test_fused_typed_blocks_equal_the_cpu_blocks_in_one_launch_per_kernel_and_layer(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


REL = ("n", "e", "n")


def _arrays() -> dict:
    return {REL: RelationArrays(np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64), None, 1)}


def test_layer_loop_refuses_a_typed_csc_on_the_cpu_or_with_a_relation_of_another_mode():
    csc = types.SimpleNamespace(relations=[REL], weighted={REL: False})
    with pytest.raises(ValueError, match=r"typed_csc is for typed graphs on CUDA, got device='cpu'"):
        LayerLoop(_arrays(), {"n": 1}, {REL: UniformMode()}, "cpu", typed_csc=csc)
    with pytest.raises(ValueError, match=r"relation \('n', 'e', 'n'\) is uniform .* its mode is 'temporal'"):
        LayerLoop(_arrays(), {"n": 1}, {REL: TemporalMode()}, "cuda", typed_csc=csc)
    csc.weighted[REL] = True
    with pytest.raises(ValueError, match=r"is weighted in the concatenated CSC but its mode is 'uniform'"):
        LayerLoop(_arrays(), {"n": 1}, {REL: UniformMode()}, "cuda", typed_csc=csc)
