"""Data-parallel training (graphrl.train.ddp) with two gloo ranks launched by torchrun.

One ``torchrun --standalone --nproc_per_node=2`` run of this file (standalone: the rendezvous binds a
free port itself) does the work in the ranks and saves what they saw; the tests below check it:

(a) parameters stay identical across ranks after several DDP steps on Gowalla (real data), from
    different initialisations (DDP broadcasts rank 0's);
(b) two DDP steps equal two single-process steps on the union of the ranks' batches (a small synthetic
    graph, fanout -1 so the blocks are deterministic, float64: to round-off);
(c) the seed split is disjoint and covers every pair, in the ranks and by the pure rule;
(d) the Gowalla graph is one copy on the shared tier: the same bytes on both ranks, the second rank's
    memory manager holds no shared bytes and no /dev/shm file of its own, its mappings are the
    first rank's segments (a write by the owner is seen by the other rank); once share_graph has
    returned, /dev/shm holds none of the job's segments (the owner unlinked them; the mappings keep
    working), and nothing is left afterwards;
(e) a job torn down by signals (one rank SIGKILLs itself after share_graph, torchrun SIGTERMs the
    other) leaves nothing in /dev/shm (separate torchrun runs, on a small graph).

What needs no second rank (the split rule, share_graph in one process, the example's command line) is in
test_ddp_one_process.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrl.train.ddp import DistributedBatchSampler

SHM = Path("/dev/shm")
WORLD = 2


# --------------------------------------------------------------------------------------------------
# The ranks (run by torchrun as a script)


def _small_dataset():
    from graphrl.datasets import synthetic_bipartite

    return synthetic_bipartite(40, 30, 200, seed=5)


def _small_link_sampler(graph, ds, seed: int):
    from samplers.link import LinkSampler
    from samplers.neighbor import NeighborSampler

    return LinkSampler(NeighborSampler(graph, [-1, -1], seed=0), ds["users"], ds["items"], num_negatives=2,
                       item_range=(ds["num_users"], ds["num_users"] + ds["num_items"]), seed=seed)


def _poisoned_class():
    from graphrl.nn import LightGCN

    class Poisoned(LightGCN):
        """A LightGCN whose outputs are NaN where ``poison`` is set."""

        poison = False

        def forward(self, blocks, return_embeddings=False):
            out, emb0 = super().forward(blocks, return_embeddings=True)
            if self.poison:
                out = out * float("nan")
            return (out, emb0) if return_embeddings else out

    return Poisoned


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def _worker(out: Path) -> None:
    import numba
    import torch.distributed as dist

    from graphrl.datasets import load_gowalla
    from graphrl.memory import MemoryManager
    from graphrl.nn import LightGCN
    from graphrl.train.ddp import (
        ddp_bpr_step,
        evaluate_ddp,
        init_distributed,
        share_graph,
        shutdown_distributed,
        train_bpr_ddp,
        wrap_model,
    )
    from samplers.link import LinkSampler
    from samplers.neighbor import NeighborSampler

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    ctx = init_distributed(backend="gloo")
    rank = ctx.rank
    res: dict = {"rank": rank, "world": ctx.world_size, "local_rank": ctx.local_rank, "backend": ctx.backend}
    mm = MemoryManager()
    res["prefix"] = mm.shm_prefix

    # (d) Gowalla: one copy on the shared tier, built by local rank 0 only
    def build():
        ds = load_gowalla(os.environ["GRAPHRL_DATA"])
        return ds.graph, {"users": ds.train_users, "items": ds.train_items + ds.num_users,
                          "probe": torch.zeros(4, dtype=torch.int64), "num_users": ds.num_users,
                          "num_items": ds.num_items, "built_by": rank}

    shared = share_graph(build, mm, ctx)
    g = shared.graph
    res["owner"] = shared.owner
    res["names"] = shared.names
    res["meta"] = dict(shared.meta)
    fields = ("indptr", "indices", "edge_ids", "node_type")
    res["graph_sha"] = {name: _sha(getattr(g, name)) for name in fields if getattr(g, name) is not None}
    res["pairs_sha"] = _sha(shared.tensors["users"]) + _sha(shared.tensors["items"])
    res["shared_stats"] = mm.stats()["shared"]
    res["own_shm_files"] = sorted(p.name for p in SHM.iterdir() if p.name.startswith(mm.shm_prefix))
    maps = Path("/proc/self/maps").read_text()
    res["mapped"] = sorted(name for name in shared.names if f"/dev/shm/{name}" in maps)
    if shared.owner:  # after the unlink: the mappings are still shared
        shared.tensors["probe"].copy_(torch.tensor([7, 11, 13, 17]))
    dist.barrier()
    res["probe"] = shared.tensors["probe"].clone()
    # every rank has returned from share_graph (and the owner has unlinked): no segment in /dev/shm
    res["names_in_shm"] = sorted(name for name in shared.names if (SHM / name).exists())
    res["job_shm_files"] = sorted(p.name for p in SHM.iterdir() if p.name.startswith(mm.shm_prefix))

    # (a) + (c): a few DDP steps on Gowalla, ranks initialised differently
    meta = shared.meta
    users, items = shared.tensors["users"], shared.tensors["items"]
    link = LinkSampler(NeighborSampler(g, [5, 5], seed=10 + rank), users, items, batch_size=256,
                       item_range=(meta["num_users"], meta["num_users"] + meta["num_items"]), seed=20 + rank)
    batches = DistributedBatchSampler(link.num_pairs, 256, rank=rank, world_size=ctx.world_size, seed=1)
    for epoch in (0, 1):
        batches.set_epoch(epoch)
        res[f"share_epoch{epoch}"] = batches.indices()
    res["batches_per_epoch"] = len(batches)
    model = LightGCN.from_graph(g, num_layers=2, embedding_dim=16, seed=rank)
    res["init_sha"] = _sha(model.embedding.weight.detach())
    ddp = wrap_model(model, ctx)
    start = model.embedding.weight.detach().clone()
    stats = train_bpr_ddp(ddp, link, batches, max_steps=4, lr=0.01, prefetch=1)
    weight = model.embedding.weight.detach()
    gathered = [torch.empty_like(weight) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, weight)
    res["param_max_diff"] = max(float((w - gathered[0]).abs().max()) for w in gathered)
    res["param_moved"] = float((weight - start).abs().max())
    res["steps"], res["losses"], res["stopped_by"] = stats.steps, stats.losses, stats.stopped_by

    # (b) exactness on a small graph: two DDP steps, saved for the single-process replay
    def build_small():
        ds = _small_dataset()
        return ds.graph, {"users": ds.train_users, "items": ds.train_items + ds.num_users,
                          "num_users": ds.num_users, "num_items": ds.num_items,
                          "train_csr": ds.user_item_csr("train"), "test_csr": ds.user_item_csr("test")}

    small = share_graph(build_small, mm, ctx)
    sds = {**small.tensors, **small.meta}
    slink = _small_link_sampler(small.graph, sds, seed=100 + rank)
    sbatches = DistributedBatchSampler(slink.num_pairs, 12, rank=rank, world_size=ctx.world_size, seed=3)
    smodel = LightGCN.from_graph(small.graph, num_layers=2, embedding_dim=8, seed=0).double()
    res["small_init"] = smodel.embedding.weight.detach().clone()
    sddp = wrap_model(smodel, ctx)
    opt = torch.optim.Adam(sddp.parameters(), lr=0.05)
    res["small_batches"], res["small_losses"] = [], []
    for ids in list(sbatches)[:2]:
        batch = slink.sample(ids)
        res["small_batches"].append({"pair_ids": batch.pair_ids, "users": batch.users,
                                     "pos": batch.pos_items, "neg": batch.neg_items})
        loss, _ = ddp_bpr_step(sddp, batch, opt, reg=1e-2)
        res["small_losses"].append(loss)
    res["small_grad"] = smodel.embedding.weight.grad.detach().clone()
    res["small_after"] = smodel.embedding.weight.detach().clone()

    # evaluation split over the ranks (compared with one process's in the tests)
    from graphrl.train import evaluate_model

    train_csr, test_csr = small.meta["train_csr"], small.meta["test_csr"]
    res["small_eval"] = evaluate_ddp(
        lambda t: evaluate_model(smodel, small.graph, sds["num_users"], train_csr, t, k=5), test_csr)

    # the ranks stop together when one rank's clock runs out (rank 0: at once; rank 1: 10 minutes);
    # the clock starts after one warm-up step
    stats = train_bpr_ddp(sddp, slink, sbatches, minutes=1e-9 if rank == 0 else 10.0, max_steps=50, lr=0.01)
    res["minutes_stop"] = (stats.steps, stats.stopped_by)

    # a non-finite loss on one rank: every rank raises, none updates (and nobody hangs)
    poisoned = _poisoned_class().from_graph(small.graph, num_layers=2, embedding_dim=8, seed=0)
    poisoned.poison = rank == 1  # not a parameter or buffer: DDP leaves it rank-local
    pddp = wrap_model(poisoned, ctx)
    before = poisoned.embedding.weight.detach().clone()
    try:
        ddp_bpr_step(pddp, slink.sample(next(iter(sbatches))), torch.optim.SGD(pddp.parameters(), lr=1.0))
        res["nonfinite"] = None
    except ValueError as exc:
        res["nonfinite"] = str(exc)
    res["nonfinite_unchanged"] = torch.equal(before, poisoned.embedding.weight.detach())

    # teardown: every rank closes its manager (owner unlinks, attachers unmap), then nothing is left
    del link, slink
    mm.close()
    dist.barrier()
    res["left_after_close"] = sorted(p.name for p in SHM.iterdir() if p.name.startswith(mm.shm_prefix))
    torch.save(res, out / f"rank{rank}.pt")
    shutdown_distributed()


def _killed_worker(out: Path, victim: int) -> None:
    """Share a small graph, then rank ``victim`` SIGKILLs itself; the other waits for torchrun's SIGTERM."""
    import numba
    import torch.distributed as dist

    from graphrl.memory import MemoryManager
    from graphrl.train.ddp import init_distributed, share_graph

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    ctx = init_distributed(backend="gloo", timeout_s=120)
    mm = MemoryManager()
    (out / f"prefix{ctx.rank}").write_text(mm.shm_prefix)

    def build():
        ds = _small_dataset()
        return ds.graph, {"users": ds.train_users, "items": ds.train_items}

    shared = share_graph(build, mm, ctx)
    (out / f"names{ctx.rank}").write_text("\n".join(shared.names))
    dist.barrier()  # both ranks are past share_graph and wrote their files
    if ctx.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    signal.pause()  # no collective to fail out of: only torchrun's signal ends this rank


# --------------------------------------------------------------------------------------------------
# The tests (in the pytest process)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp("ddp")
    before = {p.name for p in SHM.iterdir()}
    env = {**os.environ, "GRAPHRL_DATA": str(data_root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
           __file__, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    after = {p.name for p in SHM.iterdir()}
    return results, before, after


@pytest.mark.slow
def test_ranks_joined_with_gloo(ranks):
    results, _, _ = ranks
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == WORLD and r["backend"] == "gloo" for r in results)
    assert [r["local_rank"] for r in results] == [0, 1]


@pytest.mark.slow
def test_parameters_identical_across_ranks_after_ddp_steps(ranks):
    results, _, _ = ranks
    r0, r1 = results
    assert r0["init_sha"] != r1["init_sha"]  # different initialisations before DDP's broadcast
    assert r0["steps"] == r1["steps"] == 4 and r0["stopped_by"] == "steps"
    assert r0["param_moved"] > 0
    assert r0["param_max_diff"] == 0.0 and r1["param_max_diff"] == 0.0  # bit-identical
    assert r0["losses"] == r1["losses"]  # averaged over ranks in the step's all-reduce


def _union_batch(graph, parts):
    """One process's batch of the ranks' pairs and negatives together (deterministic fanout -1 blocks)."""
    from samplers.link import LinkBatch
    from samplers.neighbor import NeighborSampler

    users = torch.cat([p["users"] for p in parts])
    pos = torch.cat([p["pos"] for p in parts])
    neg = torch.cat([p["neg"] for p in parts])
    b, k = neg.shape
    seeds, inverse = torch.unique(torch.cat([users, pos, neg.reshape(-1)]), return_inverse=True)
    blocks = NeighborSampler(graph, [-1, -1], seed=0).sample(seeds)
    return LinkBatch(users=users, pos_items=pos, neg_items=neg, blocks=blocks, user_index=inverse[:b],
                     pos_index=inverse[b:2 * b], neg_index=inverse[2 * b:].reshape(b, k),
                     pair_ids=torch.cat([p["pair_ids"] for p in parts]))


@pytest.mark.slow
def test_ddp_step_equals_single_process_step_on_the_union(ranks):
    from graphrl.nn import LightGCN
    from graphrl.train import bpr_step

    results, _, _ = ranks
    ds = _small_dataset()
    sds = {"users": ds.train_users, "items": ds.train_items + ds.num_users, "num_users": ds.num_users,
           "num_items": ds.num_items}
    for rank, res in enumerate(results):  # the ranks' batches are reproducible from their seeds
        link = _small_link_sampler(ds.graph, sds, seed=100 + rank)
        batches = DistributedBatchSampler(link.num_pairs, 12, rank=rank, world_size=WORLD, seed=3)
        for ids, saved in zip(list(batches)[:2], res["small_batches"], strict=True):
            assert torch.equal(ids, saved["pair_ids"])
            assert torch.equal(link.sample(ids).neg_items, saved["neg"])
    model = LightGCN.from_graph(ds.graph, num_layers=2, embedding_dim=8, seed=0).double()
    assert torch.equal(model.embedding.weight.detach(), results[0]["small_init"])
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for step in range(2):
        union = _union_batch(ds.graph, [r["small_batches"][step] for r in results])
        assert union.batch_size == 24
        loss, _ = bpr_step(model, union, opt, reg=1e-2)
        losses.append(loss)
    grad = model.embedding.weight.grad
    assert grad.abs().max() > 0
    for res in results:
        torch.testing.assert_close(res["small_grad"], grad, rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(res["small_after"], model.embedding.weight.detach(), rtol=1e-10,
                                   atol=1e-12)
        assert res["small_losses"] == pytest.approx(losses, rel=1e-12)


@pytest.mark.slow
def test_evaluation_split_over_ranks_equals_one_process(ranks):
    from graphrl.nn import LightGCN
    from graphrl.train import evaluate_model

    results, _, _ = ranks
    ds = _small_dataset()
    model = LightGCN.from_graph(ds.graph, num_layers=2, embedding_dim=8, seed=0).double()
    with torch.no_grad():
        model.embedding.weight.copy_(results[0]["small_after"])
    one = evaluate_model(model, ds.graph, ds.num_users, ds.user_item_csr("train"), ds.user_item_csr("test"),
                         k=5)
    for res in results:
        split = res["small_eval"]
        assert split.num_users == one.num_users and split.k == 5
        assert split.recall == pytest.approx(one.recall, rel=1e-12)
        assert split.ndcg == pytest.approx(one.ndcg, rel=1e-12)
    assert one.recall > 0


@pytest.mark.slow
def test_ranks_agree_on_stopping_and_on_a_non_finite_loss(ranks):
    results, _, _ = ranks
    # one warm-up step, then rank 0's clock runs out at once (rank 1 had 10 minutes left)
    assert [r["minutes_stop"] for r in results] == [(2, "minutes")] * WORLD
    for res in results:
        assert res["nonfinite"] is not None and "non-finite on 1 of 2 ranks" in res["nonfinite"]
        assert res["nonfinite_unchanged"]


@pytest.mark.slow
def test_seed_split_disjoint_and_covering_in_the_ranks(ranks):
    results, _, _ = ranks
    m = 810_128  # Gowalla's training pairs: even, so the shares are an exact partition
    for epoch in (0, 1):
        shares = [r[f"share_epoch{epoch}"] for r in results]
        assert shares[0].numel() == shares[1].numel() == m // 2
        both = torch.cat(shares)
        assert torch.equal(torch.sort(both).values, torch.arange(m))
    assert not torch.equal(results[0]["share_epoch0"], results[0]["share_epoch1"])  # reshuffled per epoch
    assert results[0]["batches_per_epoch"] == results[1]["batches_per_epoch"] == -(-(m // 2) // 256)


@pytest.mark.slow
def test_graph_is_one_shared_copy_per_machine(ranks):
    results, _, _ = ranks
    r0, r1 = results
    assert r0["owner"] and not r1["owner"]
    assert r0["meta"]["built_by"] == r1["meta"]["built_by"] == 0  # only local rank 0 ran build()
    assert r0["names"] == r1["names"] and len(r0["names"]) == 4 + 3  # graph arrays + users, items, probe
    assert r0["graph_sha"] == r1["graph_sha"] and r0["pairs_sha"] == r1["pairs_sha"]
    # the owner's manager holds the bytes; the attaching rank's holds none and made no segment
    assert sum(o["bytes"] for o in r0["shared_stats"].values()) > 20 * 2**20
    assert r1["shared_stats"] == {} and r1["own_shm_files"] == []
    # rank 1 maps rank 0's segments, and sees the owner's write
    assert r1["mapped"] == sorted(r0["names"])
    assert r1["probe"].tolist() == [7, 11, 13, 17]


@pytest.mark.slow
def test_nothing_left_in_dev_shm(ranks):
    results, before, after = ranks
    for res in results:
        assert res["left_after_close"] == []
        assert not [n for n in after if n.startswith(res["prefix"])]


@pytest.mark.slow
def test_segments_unlinked_once_every_rank_attached(ranks):
    results, _, _ = ranks
    r0, r1 = results
    assert len(r0["names"]) == 7 and all(n.startswith(r0["prefix"]) for n in r0["names"])
    for res in results:  # checked inside the ranks, while they still use the graph
        assert res["names_in_shm"] == [] and res["job_shm_files"] == []
    assert r0["own_shm_files"] == []  # already gone when the owner looked, right after share_graph
    assert r1["mapped"] == sorted(r0["names"]) and r1["probe"].tolist() == [7, 11, 13, 17]


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1], ids=["owner-sigkill", "attacher-sigkill-owner-sigterm"])
def test_job_killed_by_signals_leaves_nothing_in_dev_shm(tmp_path, victim):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
           __file__, str(tmp_path), "--kill", str(victim)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0  # a rank died: torchrun stopped the other and failed
    assert "SIGKILL" in proc.stdout + proc.stderr or "-9" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    names = (tmp_path / "names0").read_text().split()
    assert names == (tmp_path / "names1").read_text().split() and len(names) == 4 + 2
    prefixes = [(tmp_path / f"prefix{r}").read_text() for r in range(WORLD)]
    assert all(n.startswith(prefixes[0]) for n in names)
    left = sorted(p.name for p in SHM.iterdir() if p.name.startswith(tuple(prefixes)))
    for name in left:  # clean up what a failing run leaked (the ranks are dead)
        (SHM / name).unlink(missing_ok=True)
    assert left == [], f"left in /dev/shm after the job was killed: {left}"


if __name__ == "__main__":  # torchrun runs this file in each rank
    if sys.argv[2:3] == ["--kill"]:
        _killed_worker(Path(sys.argv[1]), int(sys.argv[3]))
    else:
        _worker(Path(sys.argv[1]))
