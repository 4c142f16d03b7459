"""The GPU rules of the staged full-graph path, counted on the CPU (issue 26, items 2 and 3).

With the device tier in host memory (``MemoryManager(device="cpu")``) the staged path runs the same
calls as on a GPU: every host-device copy goes through `graphrl.memory.transfers.Transfers`, which
counts pageable transfers and host waits, and the memory manager's pools count registrations. After
the first epoch of GCN training: no registration, no pageable transfer, one host wait per partition
of a propagation and one per `host_linear` call; and the results equal the unstaged host path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphrl.datasets import load_planetoid
from graphrl.memory import MemoryManager, Tier
from graphrl.memory.transfers import Transfers
from graphrl.nn.gcn import GCN
from graphrl.nn.host_linear import host_linear
from samplers.full_graph import FullGraph


@pytest.fixture(scope="module")
def cora(data_root):
    return load_planetoid("cora", data_root)


def _epoch(model, fg, x, labels, opt) -> float:
    opt.zero_grad()
    logits = model(fg, x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _train(cora, memory: MemoryManager, staged: bool, epochs: int, layers: int = 3):
    """Losses and per-epoch traffic of a GCN on Cora: staged (a 256 KiB device tier) or the host path."""
    ds = cora
    x, labels = ds.features.to_dense() if ds.features.is_sparse else ds.features, ds.labels
    fg = FullGraph(ds.graph, memory=memory, dedup=True if staged else None)
    model = GCN(x.shape[1], hidden=32, out_dim=int(labels.max()) + 1, layers=layers, dropout=0.0, seed=0,
                recompute="keep")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, traffic = [], []
    for _ in range(epochs):
        losses.append(_epoch(model, fg, x, labels, opt))
        traffic.append(fg.traffic(reset=True))
    fg.close()
    return losses, traffic


def test_a_steady_epoch_registers_nothing_and_moves_nothing_pageable(cora):
    layers = 3
    with MemoryManager(budgets={"device": "256KiB"}, device="cpu") as mm:
        losses, traffic = _train(cora, mm, staged=True, epochs=3, layers=layers)
        pools = mm.stats()["pools"]
    first, steady = traffic[0], traffic[1:]
    assert first["registrations"] > 0  # the counter is live: the first epoch takes its memory
    for t in steady:
        assert t["registrations"] == 0
        assert t["pageable_transfers"] == 0
        assert t["pinned_transfers"] > 0
        partitions = sum(c["partitions"] for c in t["per_call"])
        assert max(c["partitions"] for c in t["per_call"]) > 2  # the 256 KiB tier forces partitions
        # one wait per partition of every propagation, one per host_linear call (forward and backward)
        assert t["host_waits"] == partitions + 2 * layers
        assert all(c["host_waits"] == c["partitions"] and c["pageable_transfers"] == 0 for c in t["per_call"])
    assert pools["pinned"]["pool_hits"] > 0
    with MemoryManager(device="cpu") as mm:
        reference, _ = _train(cora, mm, staged=False, epochs=3, layers=layers)
    np.testing.assert_allclose(losses, reference, rtol=1e-4)


def test_without_the_pool_every_epoch_registers_again(cora):
    with MemoryManager(budgets={"device": "256KiB"}, device="cpu", pool=False) as mm:
        _, traffic = _train(cora, mm, staged=True, epochs=2, layers=2)
    assert traffic[1]["registrations"] > 0


def test_a_full_pinned_tier_falls_back_to_host_and_the_pageable_copies_are_counted(cora):
    with MemoryManager(budgets={"device": "256KiB", "pinned": 0}, device="cpu") as mm:
        _, traffic = _train(cora, mm, staged=True, epochs=2, layers=2)
    assert traffic[1]["pageable_transfers"] > 0
    assert traffic[1]["pinned_transfers"] == 0


@pytest.mark.parametrize("pinned", [False, True])
def test_host_linear_through_transfers_equals_torch_and_waits_as_documented(pinned):
    gen = torch.Generator().manual_seed(1)
    n, f, c, chunk = 103, 7, 5, 10
    with MemoryManager(device="cpu") as mm:
        t = Transfers(mm, torch.device("cpu"))
        if pinned:
            region = mm.allocate((n, f), torch.float32, Tier.PINNED, owner="test.x")
            x = region.tensor()
            x.copy_(torch.randn(n, f, generator=gen))
        else:
            x = torch.randn(n, f, generator=gen)
        x.requires_grad_()
        w = torch.randn(f, c, generator=gen, requires_grad=True)
        b = torch.randn(c, generator=gen, requires_grad=True)
        g = torch.randn(n, c, generator=gen)  # pageable: staged through pinned buffers
        out = host_linear(x, w, b, chunk_rows=chunk, transfers=t)
        chunks = -(-n // chunk)
        assert t.counts.pageable_transfers == 0
        assert t.counts.host_waits == (0 if pinned else chunks - 2) + 1
        assert mm.tier_of(out) is Tier.PINNED
        out.backward(g)
        assert t.counts.pageable_transfers == 0
        staged_x = 0 if pinned else chunks - 2  # waits for a staging buffer of a pageable x
        assert t.counts.host_waits == staged_x + 1 + (chunks - 2) + staged_x + 1  # forward, then g and x back
        xr, wr, br = (v.detach().clone().requires_grad_() for v in (x, w, b))
        ref = xr @ wr + br
        ref.backward(g)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(w.grad, wr.grad)
        torch.testing.assert_close(b.grad, br.grad)


def test_transfers_count_a_pageable_copy_and_refuse_another_device():
    with MemoryManager(device="cpu") as mm:
        t = Transfers(mm, torch.device("cpu"))
        dst = torch.empty(4)
        t.h2d(dst, torch.arange(4.0))
        c = t.counts
        assert (c.pageable_transfers, c.pinned_transfers, c.host_to_device_bytes) == (1, 0, 16)
        with mm.allocate(4, torch.float32, Tier.PINNED, owner="test") as r:
            t.d2h(r.tensor(), dst)
            assert t.counts.pinned_transfers == 1 and t.counts.device_to_host_bytes == 16
        with pytest.raises(ValueError, match="weight is on"):
            host_linear(torch.zeros(2, 4), torch.zeros(4, 3, device="meta"), transfers=t)
        with pytest.raises(ValueError, match="device must be"):
            Transfers(mm, torch.device("meta"))


def test_host_linear_refuses_an_input_changed_in_place_before_backward():
    """x is saved through autograd, so changing it in place after the forward is torch's error (as for
    ``torch.nn.functional.linear``), not a silently wrong weight gradient."""
    with MemoryManager(device="cpu") as mm:
        t = Transfers(mm, torch.device("cpu"))
        for transfers in (t, None):
            w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
            x = torch.randn(20, 3, dtype=torch.float64)
            y = host_linear(x, w, transfers=transfers)
            x.mul_(2.0)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.sum().backward()
