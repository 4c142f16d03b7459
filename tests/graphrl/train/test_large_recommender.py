"""examples/large_recommender.py at a small scale: the device budget refuses the exact step's working set
by the memory manager's accounting while sampled steps fit under it, and the command line runs end to end."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphrl.datasets.synthetic import synthetic_communities
from graphrl.interrupts import Interrupted
from graphrl.memory import MemoryBudgetError, MemoryManager, Tier
from graphrl.train.rec_step import RecommenderSteps
from graphrl.train.recommend import RecommendConfig
from samplers import NeighborSampler

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "large_recommender.py"


@pytest.fixture(scope="module")
def example(load_script):
    return load_script(EXAMPLE)


@pytest.fixture(scope="module")
def run():
    ds = synthetic_communities(600, 800, 15_000, num_communities=8, seed=1)
    cfg = RecommendConfig(loss="softmax", propagation="sampled", fanouts=(3, 3), num_layers=2,
                          batch_size=64, num_negatives=16, item_bias=True, seed=0)
    return RecommenderSteps(ds, cfg)


def test_exact_refused_and_sampled_steps_fit_one_budget(example, run):
    structure, tables = example.exact_working_set(run)
    m = run.adj.matrix
    exact = m.indptr.nbytes + m.indices.nbytes + m.data.nbytes + 2 * 2 * 1400 * 64 * 4
    assert sum(t.nbytes for t in structure) + sum(4 * a * b for a, b in tables) == exact
    budget = exact // 2
    with MemoryManager(budgets={"device": budget}, device="cpu") as probe:
        with pytest.raises(MemoryBudgetError) as err:
            example.stage(probe, "exact", structure, tables)
        assert err.value.tier is Tier.DEVICE and err.value.budget == budget
        assert probe.usage()["device"]["used"] == 0  # what it placed before the refusal is freed
    with MemoryManager(budgets={"device": budget}, device="cpu") as mm:
        run.sampler = example.StagedSampler(run.sampler, mm, run.config.embedding_dim)
        before = [p.detach().clone() for p in run.model.parameters()]
        for _ in range(2):
            run.step(0.01)
        staged = mm.stats()["device"]
        assert 0 < staged["sampled.structure"]["peak"] and 0 < staged["sampled.tables"]["peak"]
        assert mm.usage()["device"]["peak"] <= budget
        assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters(), strict=True))
        example.free_all(run.sampler.regions)
        assert mm.usage()["device"]["used"] == 0
        run.sampler = run.sampler.sampler


def test_staged_blocks_equal_the_sampler_blocks(example, run):
    cfg = run.config
    with MemoryManager(device="cpu") as mm:
        sampler = NeighborSampler(run.dataset.graph, list(cfg.fanouts), seed=cfg.seed)
        twin = NeighborSampler(run.dataset.graph, list(cfg.fanouts), seed=cfg.seed)  # the same blocks
        staged = example.StagedSampler(sampler, mm, 8).sample(torch.arange(0, 600, 7))
        plain = twin.sample(torch.arange(0, 600, 7))
        for a, b in zip(staged, plain, strict=True):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
                assert torch.equal(getattr(a, f), getattr(b, f))
        assert mm.tier_of(staged[0].indices) is Tier.DEVICE


# a run of the example small enough for a test (steps and budget added per test)
SMALL_RUN = ["--scale", "0.002", "--communities", "4", "--batch-size", "64", "--negatives", "16",
             "--fanouts", "3,3,3", "--eval-users", "100"]


def test_command_line_small(example):
    result = CliRunner().invoke(example.main, [*SMALL_RUN, "--steps", "3", "--device-budget", "1MiB"])
    assert result.exit_code == 0, result.output
    assert "exact propagation refused" in result.output
    assert "trained 3 steps" in result.output
    assert "memory peak device:" in result.output and "popularity recall@20" in result.output


@pytest.mark.parametrize(("args", "flag"), [
    (["--fanouts", "10,10"], "--fanouts"), (["--fanouts", "0,0,0"], "--fanouts"),
    (["--fanouts", "a,b"], "--fanouts"),
    (["--device-budget", "1XB"], "--device-budget"), (["--seed", "-1"], "--seed"),
    (["--communities", "100000"], "--communities")])
def test_command_line_bad_arguments_are_usage_errors(example, args, flag):
    result = CliRunner().invoke(example.main, ["--scale", "0.002", "--communities", "4", *args])
    assert result.exit_code == 2, result.output  # click's usage error, before the graph is built
    assert flag in result.output and "graph:" not in result.output


def test_command_line_interrupt_exits_130(example, monkeypatch):
    def interrupted(**_):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(example, "run_example", interrupted)
    result = CliRunner().invoke(example.main, ["--scale", "0.002"])
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT" in result.output


def test_command_line_budget_too_small_for_sampled_steps(example):
    result = CliRunner().invoke(example.main, [*SMALL_RUN, "--steps", "2", "--device-budget", "1KiB"])
    assert result.exit_code == 1, result.output
    assert "Error: a sampled step does not fit --device-budget 1KiB" in result.output
    assert "sampled.structure" in result.output  # the owner the manager refused
