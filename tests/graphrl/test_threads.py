"""graphrl.threads: one count for torch, numba and the team; explicit count, opt-out, idempotence.

No timing here: the figures under load are benchmarks/threads_under_load.py's (docs/performance.md).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
import torch

from graphrl import threads
from graphrl.datasets import synthetic_graph
from graphrl.memory import MemoryManager
from samplers.full_graph import FullGraph

TWO = numba.config.NUMBA_NUM_THREADS >= 2
needs_two = pytest.mark.skipif(not TWO, reason="numba allows one thread here (NUMBA_NUM_THREADS=1)")


@pytest.fixture(autouse=True)
def restore_counts(monkeypatch):
    """Each test starts without GRAPHRL_THREADS and leaves torch's and numba's counts as it found them."""
    monkeypatch.delenv(threads.ENV, raising=False)
    before = torch.get_num_threads(), numba.get_num_threads()
    yield
    threads.configure(before[1])
    torch.set_num_threads(before[0])


def counts() -> tuple[int, int]:
    return torch.get_num_threads(), numba.get_num_threads()


def test_configure_sets_torch_numba_and_the_team_to_one_count():
    p = threads.configure(1)
    assert (p.threads, p.source, p.explicit) == (1, "argument", True)
    assert counts() == (1, 1) and threads.team_size() == 1 and threads.policy() == p
    if TWO:
        threads.configure(2)
        assert counts() == (2, 2) and threads.team_size() == 2


def test_default_is_the_cores_this_process_may_use():
    p = threads.configure()
    assert p.source == "cores" and p.threads == threads.available_cores()
    assert torch.get_num_threads() == p.threads
    assert numba.get_num_threads() == min(p.threads, numba.config.NUMBA_NUM_THREADS)


def test_an_explicit_count_beats_the_environment(monkeypatch):
    monkeypatch.setenv(threads.ENV, "1")
    assert threads.configure().source == threads.ENV and counts() == (1, 1)
    if TWO:
        p = threads.configure(2)
        assert (p.threads, p.source) == (2, "argument") and counts() == (2, 2)


def test_opting_out_leaves_torch_and_numba_alone(monkeypatch):
    threads.configure(1)
    if TWO:
        numba.set_num_threads(2)
    before = counts()
    for p in (threads.configure("off"), (monkeypatch.setenv(threads.ENV, "off"), threads.configure())[1]):
        assert (p.threads, p.source) == (None, "off") and counts() == before
        assert threads.team_size() == numba.get_num_threads()  # the team follows numba's count


def test_configure_is_idempotent_and_logs_only_changes(caplog):
    threads.configure(1)
    with caplog.at_level(logging.INFO, logger="graphrl.threads"):
        assert threads.configure(1) == threads.configure(1)
        assert caplog.records == []
        if TWO:
            threads.configure(2)
            assert len(caplog.records) == 1 and "2 thread(s)" in caplog.records[0].getMessage()
    assert counts() == ((2, 2) if TWO else (1, 1))


@pytest.mark.parametrize("bad, err", [(0, ValueError), (-1, ValueError), ("many", ValueError),
                                      (1.5, TypeError), (True, TypeError)])
def test_bad_counts_are_refused_by_name(bad, err):
    before = counts()
    with pytest.raises(err, match="threads"):
        threads.configure(bad)
    assert counts() == before


def test_a_bad_environment_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(threads.ENV, "lots")
    with pytest.raises(ValueError, match=threads.ENV):
        threads.configure()


def test_a_lower_numba_count_in_this_thread_still_caps_the_team():
    threads.configure(2 if TWO else 1)
    numba.set_num_threads(1)
    assert threads.team_size() == 1


def test_limit_sets_both_and_restores():
    threads.configure(2 if TWO else 1)
    before, policy = counts(), threads.policy()
    with threads.limit(1):
        assert counts() == (1, 1) and threads.team_size() == 1
    assert counts() == before and threads.policy() == policy
    with pytest.raises(ValueError, match="threads"):
        with threads.limit(0):
            pass


def test_threads_for_runs_small_work_serially():
    threads.configure(2 if TWO else 1)
    assert threads.threads_for(0) == threads.threads_for(threads.SERIAL_WORK - 1) == 1
    assert 1 <= threads.threads_for(1 << 30) <= threads.team_size()
    if TWO:
        assert threads.threads_for(1 << 30) == 2


def _fresh(code: str, env: dict | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the implicit policy applies once per process); its stdout."""
    import os

    full_env = {k: v for k, v in os.environ.items() if k != threads.ENV} | (env or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=full_env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


IMPLICIT = """
    import logging, numba, torch
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    torch.set_num_threads(1)
    if numba.config.NUMBA_NUM_THREADS >= 2:
        numba.set_num_threads(2)
    from graphrl import threads
    assert threads.policy() is None          # importing changes nothing
    n = threads.team_size()
    threads.team_size()                      # applied once
    p = threads.policy()
    print(n, torch.get_num_threads(), numba.get_num_threads(), p.source, p.explicit)
"""


def test_the_first_kernel_call_aligns_the_counts_downward_once(capfd):
    out = _fresh(IMPLICIT)
    assert out == "1 1 1 torch False"


def test_the_implicit_policy_honours_the_opt_out():
    out = _fresh(IMPLICIT, {threads.ENV: "off"})
    assert out == f"{2 if TWO else 1} 1 {2 if TWO else 1} off False"


@needs_two
def test_staged_results_do_not_depend_on_the_team_size():
    """The staged path's team-run product, gathers and split-row scatter give the same bits on 1 and 2
    threads (partitions large enough for the parallel branches), and the host path's bits on rows not
    split (a split row is a sum of pieces: equal to rounding)."""
    g = synthetic_graph(20_000, 400_000, "powerlaw", seed=3)
    h = torch.from_numpy(np.random.default_rng(0).standard_normal((20_000, 32), dtype=np.float32))
    with FullGraph(g) as host_fg:
        host = host_fg.propagate(h)
    mm = MemoryManager(budgets={"device": "2MiB"}, device="cpu")
    results = []
    for n in (1, 2):
        with threads.limit(n), FullGraph(g, memory=mm, device="cpu", dedup=True) as fg:
            results.append(fg.propagate(h))
            plan = fg.plan(32)
            split = torch.from_numpy(plan.split_rows)
            assert plan.num_partitions > 4 and split.shape[0] > 0
            assert max(p.cols.shape[0] for p in plan.parts) * 32 >= threads.SERIAL_WORK  # parallel branches
    mm.close()
    assert torch.equal(results[0], results[1])
    whole = torch.ones(g.num_nodes, dtype=torch.bool).index_fill_(0, split, False)
    assert torch.equal(results[0][whole], host[whole])
    torch.testing.assert_close(results[0][split], host[split])


@needs_two
def test_serial_torch_lowers_torch_only_for_the_block_and_not_when_opted_out():
    threads.configure(2)
    with threads.serial_torch():
        assert counts() == (1, 2) and threads.team_size() == 2  # our kernels keep the team
    assert counts() == (2, 2)
    threads.configure("off")
    with threads.serial_torch():
        assert counts() == (2, 2)


def test_the_spmm_kernels_never_start_openmp_threads():
    """The products run on the kernel team, never in an OpenMP region (no ``prange``): the serial and
    parallel builds used to share numba's disk cache entry (keyed by name, not flags), and OpenMP's
    fork-join waits for a descheduled worker on a loaded machine."""
    out = _fresh("""
        import numba, numpy as np
        from graphrl.kernels.spmm import csr_spmm_parallel, csr_spmm_serial, csr_spmm_t_parallel
        from graphrl.kernels.spmm import csr_spmm_t_serial
        ip = np.arange(0, 20001, 10, dtype=np.int64); cols = np.arange(20000, dtype=np.int32) % 3000
        w = np.ones(20000, np.float32); src = np.ones((3000, 8), np.float32)
        out = np.empty((2000, 8), np.float32); back = np.empty((3000, 8), np.float32)
        csr_spmm_serial(ip, cols, w, src, out); csr_spmm_t_serial(ip, cols, w, out, back, 1)
        csr_spmm_parallel(ip, cols, w, src, out, 2); csr_spmm_t_parallel(ip, cols, w, out, back, 2)
        try:
            numba.threading_layer()
            print("parallel")
        except ValueError:  # no parallel region has run in this process
            print("serial")
        print(float(out[0, 0]), float(back[0, 0]))
    """)
    assert out.splitlines() == ["serial", "10.0 70.0"]


def test_idle_cores_counts_the_cores_with_nothing_else_to_run(monkeypatch):
    for cores in (1, 2, 64):
        assert 0 <= threads.idle_cores(cores) <= cores - 1  # this thread is running
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert threads.idle_cores(4) == 0  # a load of twice the cores and more: busy, /proc/loadavg not read
    assert threads.idle_cores(4, own=2) == 0  # the caller's spinning helpers too
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.5, 0.5, 0.5))

    def loadavg(running: int):  # /proc/loadavg read back with ``running`` runnable tasks
        return lambda fd, n: f"0.5 0.5 0.5 {running}/300 99\n".encode()[:n]

    monkeypatch.setattr(threads.os, "read", loadavg(3))
    assert threads.idle_cores(4) == 1  # 3 running, this thread among them
    assert threads.idle_cores(4, own=2) == 3  # two of them the caller's helpers, spinning on their cores
    assert threads.idle_cores(4, own=5) == 3  # never more than the cores beside the caller's
    monkeypatch.setattr(threads.os, "read", loadavg(9))
    assert threads.idle_cores(4, own=1) == 0

    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(threads.os, "getloadavg", unavailable)
    assert threads.idle_cores(4) == 3
