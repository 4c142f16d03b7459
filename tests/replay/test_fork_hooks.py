"""`graphrl.process_origin`'s one at-fork hook over the live fork-aware objects (`ProcessOrigin`,
`OwnerWatch`, `ThreadOwner`): making them registers no hook, a fork runs the ``forked`` of the live ones
only, and one that raises neither stops the others nor goes unreported."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

from _forked import check_in_fork

from graphrl.process_origin import ProcessOrigin, register_forked
from replay._owner import ThreadOwner
from replay.owner_watch import OwnerWatch

ROOT = Path(__file__).resolve().parents[2]


class Probe:
    """A fork-aware object that counts, in the list it is given, its ``forked`` calls."""

    def __init__(self, calls: list[int], fail: bool = False) -> None:
        self.calls, self.fail = calls, fail
        register_forked(self)

    def forked(self) -> None:
        self.calls.append(id(self))
        if self.fail:
            raise OSError("probe failed on purpose")


def test_making_fork_aware_objects_registers_no_at_fork_hook(monkeypatch):
    registered = []
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))
    kept = [ProcessOrigin() for _ in range(1000)] + [OwnerWatch(os.getppid()) for _ in range(1000)]
    kept += [ThreadOwner("TrajectoryWriter", "store.writer()") for _ in range(1000)]
    assert registered == []
    assert len(kept) == 3000


def test_a_fork_after_1000_dropped_objects_runs_only_the_live_ones():
    calls: list[int] = []
    probes = [Probe(calls) for _ in range(1000)]
    marks = [ProcessOrigin() for _ in range(1000)]
    watches = [OwnerWatch(os.getppid()) for _ in range(1000)]
    live_probes, live_mark, live_watch = probes[::250], marks[7], watches[11]
    dropped = weakref.ref(probes[1])
    del probes, marks, watches
    gc.collect()
    assert dropped() is None and calls == []
    parent = os.getpid()

    def child() -> None:
        assert sorted(calls) == sorted(id(p) for p in live_probes)  # 4 of 1000, each once
        assert live_mark.copy is True
        assert live_watch.process == os.getpid() != parent and not live_watch.armed and live_watch.fd == -1

    check_in_fork(child)
    assert calls == [] and live_mark.copy is False and live_watch.process == parent


def test_one_forked_that_raises_stops_no_other_and_is_reported(monkeypatch):
    calls: list[int] = []
    reported: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: reported.append(repr(args.exc_value)))
    failing = [Probe(calls, fail=True) for _ in range(3)]
    fine = [Probe(calls) for _ in range(3)]
    mark = ProcessOrigin()

    def child() -> None:
        assert sorted(calls) == sorted(id(p) for p in failing + fine)  # every live object visited
        assert mark.copy is True
        assert reported == ["OSError('probe failed on purpose')"]  # the first error, once

    check_in_fork(child)


def test_the_hooks_registered_stay_constant_however_many_objects_are_made():
    """In a fresh interpreter that counts ``os.register_at_fork`` calls (and the calls of the hooks) from
    before replay is imported: making and dropping 3,000 objects registers none, and the child of a fork
    runs as many hooks as before them (a hook per object would add 3,000)."""
    script = textwrap.dedent(
        """
        import gc, json, os, sys
        registered, ran = [], []
        real = os.register_at_fork

        def counting(*, before=None, after_in_child=None, after_in_parent=None):
            name = getattr(after_in_child, "__module__", None) or ""
            registered.append(name)
            def hook(after=after_in_child, name=name):
                ran.append(name)
                if after is not None:
                    after()
            real(after_in_child=hook, **{k: v for k, v in (("before", before),
                                                       ("after_in_parent", after_in_parent)) if v})

        os.register_at_fork = counting
        from replay._owner import ThreadOwner
        from graphrl.process_origin import ProcessOrigin
        from replay.owner_watch import OwnerWatch
        import replay.store  # every replay module a store brings in

        def fork_hooks_run():
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, json.dumps(ran).encode())
                os._exit(0)
            os.close(w)
            out = os.read(r, 1 << 20)
            os.close(r)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            return json.loads(out)

        before = list(registered)
        ran_before = fork_hooks_run()
        objects = [ProcessOrigin() for _ in range(1000)] + [OwnerWatch(os.getppid()) for _ in range(1000)]
        objects += [ThreadOwner("TrajectoryWriter", "store.writer()") for _ in range(1000)]
        made = list(registered)
        del objects
        gc.collect()
        ran_after = fork_hooks_run()
        print(json.dumps({"before": before, "made": made, "ran_before": ran_before, "ran_after": ran_after}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["before"].count("graphrl.process_origin") == 1  # the one hook of the fork-aware objects
    assert counts["made"] == counts["before"]  # 3,000 objects made: no hook registered
    assert counts["ran_after"] == counts["ran_before"] == counts["before"]  # each hook once, no more
