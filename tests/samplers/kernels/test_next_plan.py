"""A layer planned by the relabelling of the layer before it (`samplers.kernels.cpu.relabel.
relabel_src_planned`): the same rows, offsets and blocks as its own planning pass, and taken only for the
destinations, fanout and rule it was made for."""

from __future__ import annotations

import numpy as np
import pytest

import samplers.kernels.cpu.layer as layer_module
from samplers.kernels.cpu import Masks, Workspace, layer_key, sample_block, weight_prefix
from samplers.kernels.cpu.plan import plan, plan_new_rows


def _graph(seed: int, num_nodes: int = 300, max_degree: int = 40):
    rng = np.random.default_rng(seed)
    degrees = rng.integers(0, max_degree, num_nodes)
    degrees[rng.random(num_nodes) < 0.1] = 0
    indptr = np.concatenate(([0], np.cumsum(degrees))).astype(np.int64)
    indices = rng.integers(0, num_nodes, int(indptr[-1])).astype(np.int32)
    weights = rng.random(int(indptr[-1])).astype(np.float32)
    weights[rng.random(weights.shape[0]) < 0.3] = 0.0
    return indptr, indices, weights


@pytest.mark.parametrize("fanout", [-1, 0, 1, 5, 25])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_rows_planned_in_pieces_equal_the_planning_pass(fanout, replace, weighted):
    indptr, _, weights = _graph(1)
    nodes = np.random.default_rng(2).integers(0, indptr.shape[0] - 1, 500).astype(np.int64)
    masks = None
    count = np.empty(0, dtype=np.int64)
    if weighted:
        prefix, count = weight_prefix(indptr, weights)
        masks = Masks(weights, prefix=prefix, positive=count)
    out_indptr, rows, _, nnz, _ = plan(indptr, nodes, fanout, replace, None, Workspace(300), 0, masks,
                                       chunk_edges=64)
    rows = rows.copy()
    got_rows = np.full((5, nodes.shape[0]), -7, dtype=np.int64)
    offs = np.full(nodes.shape[0] + 1, -7, dtype=np.int64)
    offs[0] = 0
    for lo, hi in [(0, 0), (0, 7), (7, 7), (7, 200), (200, 499), (499, 500)]:  # pieces, as chunks append
        plan_new_rows(nodes, lo, hi, indptr, count, weighted, np.int64(fanout), replace, got_rows, offs)
    assert offs.tolist() == out_indptr.tolist() and offs[-1] == nnz
    kept = 5 if weighted else 2  # uniform rows without exclusions read their start and degree alone
    assert got_rows[:kept].tolist() == rows[:kept].tolist()


def _layers(indptr, indices, weights, seeds, fanouts, replace, threads, ahead, monkeypatch):
    """Every layer of a plain graph through `sample_block`, as `samplers.layers.LayerLoop` runs them
    (innermost first), the next fanout given when ``ahead``; the planning passes run are counted."""
    planned = []

    def counting_plan(*args, **kwargs):
        planned.append(args[1].shape[0])
        return plan(*args, **kwargs)

    monkeypatch.setattr(layer_module, "plan", counting_plan)
    masks = None
    if weights is not None:
        prefix, positive = weight_prefix(indptr, weights)
        masks = Masks(weights, prefix=prefix, positive=positive)
    ws = Workspace(indptr.shape[0] - 1, indices.dtype)
    dst, out = seeds, []
    for layer in range(len(fanouts) - 1, -1, -1):
        nxt = fanouts[layer - 1] if ahead and layer else None
        block = sample_block(indptr, indices, None, dst, fanouts[layer], replace, layer_key(3, 0, layer),
                             None, ws, threads, masks, next_fanout=nxt)
        out.append([a.tolist() for a in block[:4]])
        dst = block[1]
    return out, planned


@pytest.mark.parametrize("fanouts", [[15, 10, 5], [-1, 3], [2, 2, 2, 2], [0, 4]])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_layers_planned_ahead_equal_layers_planned_alone(fanouts, replace, weighted, threads, monkeypatch):
    indptr, indices, weights = _graph(4, num_nodes=3000, max_degree=60)
    seeds = np.random.default_rng(5).integers(0, 3000, 400).astype(np.int64)
    seeds[:10] = seeds[10:20]  # duplicate seeds are rows of their own
    w = weights if weighted else None
    alone, planned_alone = _layers(indptr, indices, w, seeds, fanouts, replace, threads, False, monkeypatch)
    ahead, planned_ahead = _layers(indptr, indices, w, seeds, fanouts, replace, threads, True, monkeypatch)
    assert ahead == alone
    assert len(planned_alone) == len(fanouts) and planned_ahead == [seeds.shape[0]]  # the seeds' layer only


def test_a_plan_serves_only_the_destinations_and_rule_it_was_made_for(monkeypatch):
    indptr, indices, _ = _graph(6, num_nodes=2000)
    seeds = np.arange(0, 2000, 7, dtype=np.int64)
    ws = Workspace(2000, indices.dtype)
    passes = []
    monkeypatch.setattr(layer_module, "plan", lambda *a, **k: passes.append(a[1].shape[0]) or plan(*a, **k))
    excl = np.array([0, 5, 9], dtype=np.int64)

    def second_layer(dst_of, fanout, excluded=None):
        """The seeds' layer planning a next layer of fanout 4, then the layer of ``dst_of(its sources)``:
        that layer's blocks and whether it ran a planning pass."""
        first = sample_block(indptr, indices, None, seeds, 3, False, 11, None, ws, 1, next_fanout=4)
        passes.clear()
        dst = dst_of(first[1])
        got = sample_block(indptr, indices, None, dst, fanout, False, 12, excluded, ws, 1)
        ran = list(passes)
        want = sample_block(indptr, indices, None, dst, fanout, False, 12, excluded,
                            Workspace(2000, indices.dtype))
        assert all(np.array_equal(a, b) for a, b in zip(got[:4], want[:4], strict=True))
        assert ran in ([], [dst.shape[0]])
        return bool(ran)

    assert not second_layer(lambda src: src, 4)  # the planned layer itself takes the plan
    assert second_layer(lambda src: src.copy(), 4)  # equal destinations in another array: planned afresh
    assert second_layer(lambda src: src, 5)  # another fanout
    assert second_layer(lambda src: src, 4, excl)  # exclusions


def test_a_layer_with_exclusions_checks_before_it_takes_and_drops_the_plan(monkeypatch):
    # the order is check, then take: a layer with excluded positions never takes a kept plan (which would swap
    # its row scratch for nothing), and drops it, so no later layer can take it
    indptr, indices, _ = _graph(7, num_nodes=500)
    seeds = np.arange(0, 500, 5, dtype=np.int64)
    ws = Workspace(500, indices.dtype)
    taken = []
    own = Workspace.take_plan
    monkeypatch.setattr(Workspace, "take_plan", lambda self, *a: taken.append(a[1]) or own(self, *a))
    first = sample_block(indptr, indices, None, seeds, 3, False, 11, None, ws, 1, next_fanout=4)
    assert taken == [3]  # the seeds' layer, without exclusions, looked for a plan
    taken.clear()
    sample_block(indptr, indices, None, first[1], 4, False, 12, np.array([0, 5], np.int64), ws, 1)
    assert taken == []
    assert own(ws, first[1], 4, False, False) is None  # dropped
