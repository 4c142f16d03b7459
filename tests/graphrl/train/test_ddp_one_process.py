"""Data-parallel training pieces in one process (no torchrun): the seed split's drop/pad rule, share_graph
alone (unlink, sparse arrays), the training clock's warm-up, batches moved to the model's device, a
one-process job through the whole API, and the example's command line (click's CliRunner)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrl.train.ddp import DistributedBatchSampler

SHM = Path("/dev/shm")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ddp_recommender.py"


def _small_dataset():
    from graphrl.datasets import synthetic_bipartite

    return synthetic_bipartite(40, 30, 200, seed=5)


def _small_link_sampler(graph, ds, seed: int):
    from samplers.link import LinkSampler
    from samplers.neighbor import NeighborSampler

    return LinkSampler(NeighborSampler(graph, [-1, -1], seed=0), ds["users"], ds["items"], num_negatives=2,
                       item_range=(ds["num_users"], ds["num_users"] + ds["num_items"]), seed=seed)


# --------------------------------------------------------------------------------------------------
# The seed split


@pytest.mark.parametrize("m,world,batch", [(10, 3, 2), (7, 2, 3), (5, 4, 1), (12, 3, 5), (2, 3, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_split_rule_pads_or_drops_as_documented(m, world, batch, drop_last):
    splits = [DistributedBatchSampler(m, batch, rank=r, world_size=world, seed=9, drop_last=drop_last)
              for r in range(world)]
    shares = [s.indices() for s in splits]
    per_rank = m // world if drop_last else -(-m // world)
    assert all(s.numel() == per_rank for s in shares)
    allx = torch.cat(shares)
    assert ((allx >= 0) & (allx < m)).all()
    if drop_last:
        assert allx.unique().numel() == allx.numel()  # disjoint
        assert m - allx.numel() == m % world  # fewer than `world` dropped
    else:
        assert torch.equal(allx.unique(), torch.arange(m))  # covers every index
        assert allx.numel() - m == (-m) % world  # padding repeats fewer than `world` indices
    batches = [list(s) for s in splits]
    assert len({len(b) for b in batches}) == 1  # the same number of batches on every rank ...
    assert all(len(b) == len(splits[0]) for b in batches)
    for step in zip(*batches, strict=True):
        assert len({t.numel() for t in step}) == 1  # ... of the same sizes
        if drop_last:
            assert step[0].numel() == batch
    for share, rank_batches in zip(shares, batches, strict=True):  # batches cut the share in order
        visited = sum(t.numel() for t in rank_batches)
        assert torch.equal(torch.cat([share[:0], *rank_batches]), share[:visited])


def test_split_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        DistributedBatchSampler(10, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        DistributedBatchSampler(10, 0, rank=0, world_size=2)
    with pytest.raises(ValueError, match="num_items"):
        DistributedBatchSampler(0, 2, rank=0, world_size=2)


# --------------------------------------------------------------------------------------------------
# share_graph and the training loop in one process


def test_share_graph_one_process_unlinks_or_keeps_names():
    from graphrl.memory import MemoryManager, Region
    from graphrl.train.ddp import share_graph

    ds = _small_dataset()
    with MemoryManager() as mm:
        shared = share_graph(lambda: (ds.graph, {"users": ds.train_users}), mm)
        assert shared.owner and len(shared.names) == 5
        assert [n for n in shared.names if (SHM / n).exists()] == []
        assert torch.equal(shared.graph.indptr, ds.graph.indptr)  # still readable after the unlink
        with pytest.raises(FileNotFoundError):
            Region.attach(shared.regions[0].handle())
        kept = share_graph(lambda: ds.graph, mm, unlink=False)
        assert all((SHM / n).exists() for n in kept.names)
    assert [n for n in kept.names if (SHM / n).exists()] == []


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_share_graph_rejects_sparse_tensors_naming_them(layout):
    from graphrl.memory import MemoryManager
    from graphrl.train.ddp import share_graph

    ds = _small_dataset()
    dense = torch.eye(ds.num_nodes)[:, :8] / 2
    sparse = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    with MemoryManager() as mm:
        with pytest.raises(TypeError, match=r"'features' is a sparse tensor.*features_indices="):
            share_graph(lambda: (ds.graph, {"users": ds.train_users, "features": sparse}), mm)
        assert mm.regions() == [] and [p for p in SHM.iterdir() if p.name.startswith(mm.shm_prefix)] == []


def test_training_clock_starts_after_warm_up_steps():
    from graphrl.nn import LightGCN
    from graphrl.train.ddp import train_bpr_ddp

    ds = _small_dataset()
    sds = {"users": ds.train_users, "items": ds.train_items + ds.num_users, "num_users": ds.num_users,
           "num_items": ds.num_items}
    link = _small_link_sampler(ds.graph, sds, seed=0)
    for warmup, steps in ((0, 1), (1, 2), (3, 4)):  # a budget that has run out at once
        model = LightGCN.from_graph(ds.graph, num_layers=2, embedding_dim=8, seed=0)
        batches = DistributedBatchSampler(link.num_pairs, 8, rank=0, world_size=1)
        stats = train_bpr_ddp(model, link, batches, minutes=1e-9, max_steps=50, warmup_steps=warmup)
        assert (stats.steps, stats.stopped_by) == (steps, "minutes")
    with pytest.raises(ValueError, match="warmup_steps"):
        train_bpr_ddp(model, link, batches, minutes=1.0, warmup_steps=-1)


def test_batches_move_to_the_model_device():
    from graphrl.train.ddp.trainer import _batch_to

    ds = _small_dataset()
    sds = {"users": ds.train_users, "items": ds.train_items + ds.num_users, "num_users": ds.num_users,
           "num_items": ds.num_items}
    batch = _small_link_sampler(ds.graph, sds, seed=0).sample(torch.arange(6))
    assert _batch_to(batch, torch.device("cpu")) is batch
    meta = _batch_to(batch, torch.device("meta"))  # a device without data: shows every tensor moved
    assert type(meta.blocks) is type(batch.blocks) and len(meta.blocks) == len(batch.blocks)
    moved = [meta.users, meta.pos_items, meta.neg_items, meta.user_index, meta.pos_index, meta.neg_index,
             meta.pair_ids] + [getattr(b, f) for b in meta.blocks
                               for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids")]
    assert all(t.device.type == "meta" for t in moved)
    assert meta.users.shape == batch.users.shape and batch.users.device.type == "cpu"


# --------------------------------------------------------------------------------------------------
# The example's command line


@pytest.fixture(scope="module")
def example_main():
    spec = importlib.util.spec_from_file_location("ddp_recommender_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


INTS = "expected comma-separated integers such as '10,10'"  # graphrl.cli_options.int_list's message


@pytest.mark.parametrize("fanouts,why", [("10,x", f"{INTS}, got '10,x'"), ("", f"{INTS}, got ''"),
                                         ("10,,5", f"{INTS}, got '10,,5'"), ("10,-2", "must be >= 0, or -1")])
def test_example_bad_fanouts_are_usage_errors(example_main, fanouts, why):
    from click.testing import CliRunner

    result = CliRunner().invoke(example_main, ["--fanouts", fanouts])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--fanouts'" in result.output and why in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, ValueError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_example_device_cuda_without_cuda_is_a_usage_error(example_main):
    from click.testing import CliRunner

    result = CliRunner().invoke(example_main, ["--device", "cuda"])
    assert result.exit_code == 2 and "CUDA is not available" in result.output, result.output
    bad = CliRunner().invoke(example_main, ["--device", "tpu"])
    assert bad.exit_code == 2 and "'--device'" in bad.output


def test_example_help_names_device_and_warm_up(example_main):
    from click.testing import CliRunner

    result = CliRunner().invoke(example_main, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--device [auto|cpu|cuda]" in text and "warm-up step" in text


_ONE_PROCESS = """
import torch
from graphrl.datasets import synthetic_bipartite
from graphrl.memory import MemoryManager
from graphrl.nn import LightGCN
from graphrl.train import evaluate_model
from graphrl.train.ddp import (DistributedBatchSampler, evaluate_ddp, init_distributed, share_graph,
                               shutdown_distributed, train_bpr_ddp, wrap_model)
from samplers import LinkSampler, NeighborSampler

ctx = init_distributed()
assert (ctx.rank, ctx.world_size, ctx.backend, str(ctx.device)) == (0, 1, "gloo", "cpu"), ctx
with MemoryManager() as mm:
    ds = synthetic_bipartite(50, 40, 300, seed=1)
    shared = share_graph(lambda: ds.graph, mm, ctx)
    assert shared.owner and shared.graph.placement()["indptr"] == "shared"
    link = LinkSampler(NeighborSampler(shared.graph, [3, 3], seed=0), ds.train_users,
                       ds.train_items + ds.num_users, item_range=(ds.num_users, ds.num_nodes), seed=1)
    batches = DistributedBatchSampler(link.num_pairs, 32, rank=0, world_size=1)
    model = LightGCN.from_graph(shared.graph, num_layers=2, embedding_dim=8, seed=0)
    stats = train_bpr_ddp(wrap_model(model, ctx), link, batches, epochs=2, lr=0.05, prefetch=2)
    assert stats.steps == 2 * len(batches) and stats.stopped_by == "epochs", stats
    train, test = ds.user_item_csr("train"), ds.user_item_csr("test")
    split = evaluate_ddp(lambda t: evaluate_model(model, shared.graph, ds.num_users, train, t, k=5), test)
    one = evaluate_model(model, shared.graph, ds.num_users, train, test, k=5)
    assert split.num_users == one.num_users and abs(split.recall - one.recall) < 1e-12, (split, one)
shutdown_distributed()
print("ok")
"""


def test_runs_as_one_process_without_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "-c", _ONE_PROCESS], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-4000:]

