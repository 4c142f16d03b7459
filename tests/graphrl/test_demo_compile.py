"""The demo compiles its kernels before its clocks start: after `_compile_kernels` (recommend) and
`_compile_rl_kernels` (rl), the tasks' own work calls no numba kernel with a signature not compiled yet.

Each check runs in a process of its own (numba's dispatchers gain a signature when a call compiles it or loads
it from the cache, either way once per process), so the kernels other tests called do not hide a miss: a
fork child of one interpreter that has imported the checks' modules and called nothing (`checks`), so that
torch, numba and the library are imported once for the three checks; each child starts with the signatures
a fresh interpreter has after the same imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SIGNATURES = """
import sys
from numba.core.dispatcher import Dispatcher

def signatures():
    found = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith(("graphrl", "samplers", "replay")):
            continue
        for attr, obj in list(vars(mod).items()):
            for item in (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple))
                         else (obj,)):
                if isinstance(item, Dispatcher):
                    found[f"{name}.{attr}.{item.py_func.__name__}"] = set(map(str, item.signatures))
    return found

def new_since(before):
    return {k: sorted(v - before.get(k, set())) for k, v in signatures().items() if v - before.get(k, set())}
"""


# what the interpreter imports before it forks: every module the checks import, and nothing called; the
# imports' objects exempt from the cyclic collector (gc.freeze), which compiling walked again and again
IMPORTS = """
import gc
import numpy, numba, torch
import graphrl.cli_demo, graphrl.cli_demo_recommend, graphrl.datasets, graphrl.train.rec_step
import graphrl.train.recommend, graphrl.train.rl, replay
gc.collect()
gc.freeze()
"""

# runs each check in a fork child of the interpreter (one after another), its stdout and traceback kept
RUNNER = """
import contextlib, io, json, os, traceback


def _run_forked(code):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(code, "<check>", "exec"), {"__name__": "__main__"})
                said = [True, out.getvalue()]
            except BaseException:
                said = [False, out.getvalue() + traceback.format_exc()]
            with os.fdopen(w, "w") as pipe:
                pipe.write(json.dumps(said))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not said:
        return [False, "the fork child died before it reported: wait status %d" % status]
    return json.loads(said)


print(MARK + json.dumps({name: _run_forked(code) for name, code in CHECKS.items()}))
"""
MARK = "=== demo compile checks: "


def recommend_check(propagation: str) -> str:
    return f"""
        from graphrl.cli_demo_recommend import _compile_kernels
        from graphrl.datasets import synthetic_bipartite
        from graphrl.train.rec_step import RecommenderSteps
        from graphrl.train.recommend import RecommendConfig

        config = RecommendConfig(loss="full-softmax", init="spectral", item_bias=True, lr=0.02,
                                 temperature=0.12, embedding_dim=16, batch_size=256, minutes=1.5, seed=3,
                                 propagation="{propagation}", fanouts=(10, 10, 10))
        # more items than the warm-up's small set, and than one planning chunk of the sampler's layers
        ds = synthetic_bipartite(3000, 40_000, 60_000, seed=1)
        assert _compile_kernels(ds, config) > 0
        before = signatures()
        if config.propagation == "sampled":  # (exact propagation runs on torch alone)
            assert any(before.values()), "the warm-up called no kernel"
        steps = RecommenderSteps(ds, config)
        for _ in range(2):
            steps.step(0.02)
        print("NEW", new_since(before))
    """


RL_CHECK = """
        import numpy as np
        from graphrl.cli_demo import _compile_rl_kernels
        from graphrl.train.rl import RLConfig, trajectory_spec
        from replay import Prioritized, ReplayStore

        config = RLConfig(minutes=1.0)
        assert _compile_rl_kernels(config) > 0
        before = signatures()
        assert any(before.values()), "the warm-up called no kernel"
        store = ReplayStore(trajectory_spec(4), capacity_steps=config.capacity_steps,
                            num_shards=config.num_shards, seed=5, timeout=5.0,
                            selector=Prioritized(exponent=config.priority_exponent))
        rng = np.random.default_rng(0)
        writers = [store.writer(chunk_steps=config.chunk_steps) for _ in range(3)]
        for episode in range(12):                   # episodes of several lengths on several writers
            w = writers[episode % 3]
            n = int(rng.integers(5, 60))
            for t in range(n):
                w.append({"obs": rng.random(4, dtype=np.float32), "action": int(t % 2), "reward": 1.0,
                          "done": t == n - 1})
            w.end_episode()
        for _ in range(3):
            with store.sample(config.batch_size, window=config.window, pad="tail", timeout=5.0,
                              beta=0.7) as batch:
                store.update_priorities(batch.keys, rng.random(len(batch.keys)) + 0.1)
        for w in writers:
            w.close()
        store.close()
        print("NEW", new_since(before))
    """


@pytest.fixture(scope="module")
def checks() -> dict[str, tuple[bool, str]]:
    """``{check: (ran to its end, its output)}`` of the three checks, each run in a fork child of one
    interpreter that imported their modules first (`IMPORTS`, `RUNNER`)."""
    scripts = {"sampled": recommend_check("sampled"), "exact": recommend_check("exact"), "rl": RL_CHECK}
    scripts = {name: textwrap.dedent(SIGNATURES) + textwrap.dedent(body) for name, body in scripts.items()}
    code = f"CHECKS = {scripts!r}\nMARK = {MARK!r}\n" + IMPORTS + RUNNER
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    _, mark, tail = out.stdout.rpartition(MARK)
    assert out.returncode == 0 and mark, out.stdout[-3000:] + out.stderr[-3000:]
    return {name: (ok, said) for name, (ok, said) in json.loads(tail).items()}


@pytest.mark.slow
@pytest.mark.parametrize("propagation", ["sampled", "exact"])
def test_recommend_steps_compile_nothing_after_the_warm_up(checks, propagation):
    ok, out = checks[propagation]
    assert ok, out[-3000:]
    assert "NEW {}" in out, out


@pytest.mark.slow
def test_rl_store_work_compiles_nothing_after_the_warm_up(checks):
    ok, out = checks["rl"]
    assert ok, out[-3000:]
    assert "NEW {}" in out, out
