"""A group of partition owners behind one call: in this process, or as Ray actors.

`LocalOwners` holds the P `PartitionOwner`s in this process (tests, one host); `RayOwners` runs each as
a Ray actor (one engine with the Ray replay store, `replay.distributed`). Both answer `call`: one
request per owner, all in flight at once, the results keyed by part, and count the requests, the
bytes sent and received and the seconds waited (`OwnerStats`); `start`, `wait_any` and `finish` are
`call` in three steps, so that one thread keeps several calls in flight (`OwnerCall`). An owner that
died fails the call with `OwnerError` naming the part, as soon as the engine knows (a Ray actor's death
is reported when its process exits, not at a timeout); `restart` builds the owner again from the
folder (for a group that `attach`ed to named owners, through the `OwnerKeeper` started beside them, so
that the new owner lives as long as the first ones, not as long as the trainer that restarted it).

>>> owners = RayOwners("parts/", expect=graph_fingerprint(graph))   # doctest: +SKIP
>>> owners.call("rows", {0: (ids0, "features"), 2: (ids2, "features")})  # {0: rows0, 2: rows2}
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphrl.partition import PartitionError, load_book
from samplers.distributed.owner import PartitionOwner

__all__ = ["OWNER_ENV", "LocalOwners", "OwnerCall", "OwnerError", "OwnerKeeper", "OwnerStats", "RayOwners",
           "check_owners", "payload_bytes"]

OWNER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""glibc allocator settings of each owner's process (`RayOwners`): blocks up to 32 MiB come from the heap
and up to 256 MiB of freed heap is kept, so an owner's per-request arrays reuse pages it already touched
rather than fault in fresh zeroed ones each request (other allocators ignore them)."""


class OwnerError(RuntimeError):
    """A partition owner died or failed a request; the message names the part ("partition owner 2").

    Attributes
    ----------
    part : int
        The owner's part.
    """

    def __init__(self, message: str, part: int) -> None:
        super().__init__(message)
        self.part = part


@dataclass
class OwnerStats:
    """What a group's calls cost: requests, payload bytes each way (numpy arrays), seconds waited."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0


@dataclass
class OwnerCall:
    """One request per owner in flight (`start`); `wait_any` and `finish` take its answers.

    ``results``: the answers so far, by part; ``waiting``: the engine's handles not yet answered, to
    their part; ``error``: the call's failure (`OwnerError`, ``TimeoutError``), raised by `finish`;
    ``deadline``: `time.monotonic` seconds after which it fails, or None.
    """

    method: str
    requests: Mapping[int, tuple]
    started: float
    results: dict[int, Any] = field(default_factory=dict)
    waiting: dict[Any, int] = field(default_factory=dict)
    error: BaseException | None = None
    deadline: float | None = None

    @property
    def done(self) -> bool:
        """Every owner answered, or the call failed."""
        return self.error is not None or not self.waiting


def payload_bytes(obj: Any) -> int:
    """Bytes of the numpy arrays in ``obj`` (nested tuples, lists and dicts): what a request moves."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (tuple, list)):
        return sum(payload_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(x) for x in obj.values())
    return 0


def check_owners(owners: Any) -> None:
    """Refuse anything but a group of owners (`LocalOwners`, `RayOwners`), naming what was given.

    Raises
    ------
    TypeError
        ``owners`` is not such a group (a folder path, say: build ``LocalOwners(folder)`` first).
    """
    if not isinstance(owners, _Owners):
        raise TypeError(f"owners must be LocalOwners or RayOwners (e.g. LocalOwners('parts/') for a "
                        f"partition folder), got {type(owners).__name__} {owners!r:.60}")


class _Owners:
    """What both groups share: the book, the checks of a request, the stats."""

    def __init__(self, folder: str, expect: str | None) -> None:
        folder = os.path.abspath(folder)  # owners (re)started later, or in a process of another cwd
        self.book = load_book(folder, expect)
        self.folder = folder
        self.fingerprint = self.book.fingerprint
        self.num_parts = self.book.num_parts
        self.stats = OwnerStats()
        self._stats_lock = threading.Lock()  # calls may come from several threads (sample_many)

    def __getstate__(self) -> dict:
        """The group without its locks (made again by `__setstate__`)."""
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_lock")}

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled group (`__getstate__`)."""
        self.__dict__.update(state)
        self._stats_lock = threading.Lock()

    def _check_parts(self, requests: Mapping[int, tuple], name: str = "requests") -> None:
        for p in requests:
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
                raise TypeError(f"{name}: a part must be an int, got {type(p).__name__} {p!r}")
            if not 0 <= int(p) < self.num_parts:
                raise ValueError(f"{name}: part {p} outside [0, {self.num_parts})")

    def start(self, method: str, requests: Mapping[int, tuple]) -> OwnerCall:
        """Send ``{part: args}``: ``owner.method(*args)`` on each part, all in flight at once."""
        raise NotImplementedError

    def wait_any(self, calls: Sequence[OwnerCall]) -> int:
        """The index in ``calls`` of one that is `OwnerCall.done` (answered or failed), waiting for it."""
        for i, c in enumerate(calls):
            if c.done:
                return i
        raise ValueError("wait_any: no call of these owners is in flight")

    def finish(self, call: OwnerCall) -> dict[int, Any]:
        """The answers of a done call, ``{part: result}`` in its requests' order.

        Raises
        ------
        OwnerError, TimeoutError
            The call's failure (`call`).
        """
        if call.error is not None:
            raise call.error
        results = {p: call.results[p] for p in call.requests}
        sent, received = payload_bytes(list(call.requests.values())), payload_bytes(list(results.values()))
        with self._stats_lock:
            self.stats.requests += len(call.requests)
            self.stats.bytes_sent += sent
            self.stats.bytes_received += received
            self.stats.seconds += time.perf_counter() - call.started
        return results

    def call(self, method: str, requests: Mapping[int, tuple]) -> dict[int, Any]:
        """``{part: owner.method(*args)}`` for each ``{part: args}`` of ``requests``, all in flight at once.

        Raises
        ------
        OwnerError
            An owner died (named as soon as the engine reports its process gone) or raised (the part is
            named; the owner's error is the cause).
        TimeoutError
            `RayOwners` that did not answer within ``timeout_s`` (named).
        ValueError
            Closed `RayOwners`.
        """
        started = self.start(method, requests)
        self.wait_any([started])
        return self.finish(started)

    def _checked(self, part: int, info: dict) -> dict:
        if info["fingerprint"] != self.fingerprint:
            raise PartitionError(f"partition owner {part} holds another graph than {self.folder}",
                                 self.folder)
        if info["manifest"] != self.book.digest:
            raise PartitionError(f"partition owner {part} holds a part of another writing of {self.folder} "
                                 "than its partition book (the folder was written again): start every owner "
                                 "again", self.folder)
        return info


def _owner_name(name: str, part: int) -> str:
    """The Ray actor name of owner ``part`` of the owners named ``name``."""
    return f"{name}.owner{part}"


def _remote(actor: Any, options: dict, args: tuple) -> Any:
    """``actor.options(**options).remote(*args)``; a ``name`` in ``options`` that a killed actor still
    holds (Ray frees it asynchronously) is waited for, up to 5 s (then Ray's ``ActorAlreadyExistsError``,
    a ``ValueError``); any other error of Ray's (an invalid option: ``ValueError``) is raised at once."""
    from ray.exceptions import ActorAlreadyExistsError

    deadline = time.monotonic() + 5.0
    while True:
        try:
            return actor.options(**options).remote(*args)
        except ActorAlreadyExistsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class OwnerKeeper:
    """Starts named owners again for the groups that `RayOwners.attach`ed to them (a Ray actor).

    Ray ends an actor that is not detached with the process that created it: an owner that an attached
    trainer started itself would end with that trainer, whereas the first owners live as long as the
    group that started them. That group starts this keeper beside them (``{name}.keeper``, with their
    ``lifetime``, ``namespace`` and ``runtime_env``), and an attached group's `RayOwners.restart` has it
    start the owner with the first owners' options: the new owner then lives as long as they do.

    Parameters
    ----------
    name : str; options : dict (the owners' ``ray.remote`` options)
    args : tuple
        ``(folder, fingerprint, threads, manifest)``: `PartitionOwner`'s arguments but the part.
    """

    def __init__(self, name: str, options: dict, args: tuple) -> None:
        import ray

        self._ray = ray
        self._actor = ray.remote(PartitionOwner)
        self.name, self.options, self.args = name, dict(options), tuple(args)
        self.started: dict[int, Any] = {}  # part -> the owner started last (held, so that it lives on)

    def start(self, part: int) -> Any:
        """Owner ``part``'s actor handle: the live one under its name when another group started it
        again already, else a new one (the caller killed the old one; the new one may still be loading).

        Raises
        ------
        ValueError
            The name still held by another actor after 5 s (Ray's error).
        """
        ray, name = self._ray, _owner_name(self.name, part)
        try:
            live = ray.get_actor(name)
            ray.get(live.info.remote())
            return live
        except ValueError:  # no actor of that name
            pass
        except ray.exceptions.RayActorError:  # a dead one whose name Ray has not freed yet
            pass
        folder, fingerprint, threads, manifest = self.args
        actor = _remote(self._actor, {**self.options, "name": name}, (folder, part, fingerprint, threads,
                                                                      manifest))
        self.started[part] = actor
        return actor


class LocalOwners(_Owners):
    """The P owners of a partition folder, in this process.

    Parameters
    ----------
    folder : str or os.PathLike; expect : str or None (the graph fingerprint the folder must hold)
        A relative ``folder`` is taken from the current directory when the owners are made.

    Raises
    ------
    graphrl.partition.PartitionError
        A damaged folder or one of another graph.
    """

    def __init__(self, folder: str, expect: str | None = None) -> None:
        super().__init__(folder, expect)
        self.owners = [self._owner(p) for p in range(self.num_parts)]
        self._call_lock = threading.Lock()  # one call at a time, as an actor serves one request at a time

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled group (`__getstate__`)."""
        super().__setstate__(state)
        self._call_lock = threading.Lock()

    def _owner(self, part: int) -> PartitionOwner:
        return PartitionOwner(self.folder, part, self.fingerprint, manifest=self.book.digest)

    def info(self, part: int) -> dict:
        """`PartitionOwner.info` of one owner."""
        return self.owners[part].info()

    def counters(self) -> dict[int, dict]:
        """Each owner's `PartitionOwner.counters`."""
        return {p: o.counters() for p, o in enumerate(self.owners)}

    def start(self, method: str, requests: Mapping[int, tuple]) -> OwnerCall:
        """Run ``owner.method(*args)`` for each ``{part: args}`` now; a failure is kept for `finish`."""
        self._check_parts(requests)
        out = OwnerCall(method, requests, time.perf_counter())
        with self._call_lock:
            for p, args in requests.items():
                try:
                    try:
                        out.results[p] = getattr(self.owners[p], method)(*args)
                    except Exception as e:
                        raise OwnerError(f"partition owner {p} ({self.folder}) failed {method}: {e}",
                                         p) from e
                except OwnerError as err:
                    out.error = err
                    break
        return out

    def restart(self, part: int) -> None:
        """Build owner ``part`` again from the folder (verified; a folder written again since the book
        was read is refused with `graphrl.partition.PartitionError`, and the old owner kept).

        Raises
        ------
        TypeError, ValueError
            ``part`` not an int in [0, P).
        """
        self._check_parts({part: ()}, "part")
        owner = self._owner(part)
        with self._call_lock:
            self.owners[part] = owner


class RayOwners(_Owners):
    """The P owners of a partition folder as Ray actors (``ray.init`` first).

    Parameters
    ----------
    folder : str or os.PathLike
        A path every Ray node can read (a relative one is taken from the current directory here).
    expect : str or None
        The graph fingerprint the folder must hold.
    actor_options : dict or None
        ``ray.remote`` options of each owner (``num_cpus`` defaults to 0, so owners share CPUs with
        trainers; ``resources`` or a ``scheduling_strategy`` place them on hosts). Its ``runtime_env``'s
        ``env_vars`` are added to `OWNER_ENV` (theirs win).
    name : str or None
        Name the actors ``{name}.owner{p}`` in Ray's current namespace, so that other processes of the
        cluster `attach` to them; an `OwnerKeeper` ``{name}.keeper`` is started beside them, which starts
        an owner again for an attached group (`restart`).
    threads : int or None
        Kernel threads of each owner (`PartitionOwner`).
    timeout_s : float or None
        Seconds a `call` waits for its answers before ``TimeoutError`` names the owners that did not
        answer (alive but hung: a dead one is reported at once whatever this is); ``None`` waits on.
        An attribute: set it on owners that `attach` gave.

    Raises
    ------
    graphrl.partition.PartitionError
        A damaged partition book or manifest, or a folder of another graph.
    OwnerError
        An owner failed to start (its part's files damaged: the file is named); none is left running.
    """

    def __init__(self, folder: str, expect: str | None = None, actor_options: dict | None = None,
                 name: str | None = None, threads: int | None = None, *, timeout_s: float | None = None,
                 attach: bool = False) -> None:
        import ray

        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0):
            raise ValueError(f"timeout_s must be None or a number of seconds > 0, got {timeout_s!r}")
        super().__init__(folder, expect)
        self._ray = ray
        self.closed = False
        self.timeout_s = timeout_s
        self.name = name
        self.threads = threads
        options = dict(actor_options or {})
        runtime_env = dict(options.pop("runtime_env", None) or {})
        runtime_env["env_vars"] = {**OWNER_ENV, **(runtime_env.get("env_vars") or {})}
        self._options = {"num_cpus": 0, "max_restarts": 0, "runtime_env": runtime_env, **options}
        self._actor = ray.remote(PartitionOwner)
        self.attached = bool(attach)
        self._keeper = None  # the OwnerKeeper of named owners
        if attach:
            self.actors = [ray.get_actor(self._actor_name(p)) for p in range(self.num_parts)]
            self._keeper = ray.get_actor(f"{name}.keeper")
        else:
            self.actors = []
            try:  # a refused start (bad actor_options) kills what started (a detached keeper holds its name)
                if name is not None:
                    keep = {k: self._options[k] for k in ("lifetime", "namespace", "runtime_env")
                            if k in self._options}
                    keep.update(num_cpus=0, max_restarts=0, name=f"{name}.keeper")
                    self._keeper = _remote(ray.remote(OwnerKeeper), keep, (name, self._options, (
                        self.folder, self.fingerprint, threads, self.book.digest)))
                for p in range(self.num_parts):
                    self.actors.append(self._start(p))
            except BaseException:
                self._kill_started()
                raise
        try:
            if not attach:
                self._get({p: a.freeze_gc.remote() for p, a in enumerate(self.actors)}, "freeze_gc")
            infos = self._get({p: a.info.remote() for p, a in enumerate(self.actors)}, "info")
            self.infos = [self._checked(p, infos[p]) for p in range(self.num_parts)]
        except BaseException:
            if not attach:
                self.close()
            raise

    @classmethod
    def attach(cls, folder: str, name: str, expect: str | None = None) -> RayOwners:
        """The owners another process of the cluster started with ``name`` (checked against the folder).

        Raises
        ------
        ValueError
            No actor of that name (Ray's error); `graphrl.partition.PartitionError` as the constructor.
        """
        return cls(folder, expect, name=name, attach=True)

    def _actor_name(self, part: int) -> str:
        return _owner_name(self.name, part)

    def _start(self, part: int):
        options = dict(self._options)
        if self.name is not None:
            options["name"] = self._actor_name(part)
        return _remote(self._actor, options, (self.folder, part, self.fingerprint, self.threads,
                                              self.book.digest))

    def _start_by_keeper(self, part: int):
        """Owner ``part`` started again by the `OwnerKeeper` of the group that started the owners."""
        ray = self._ray
        try:
            return ray.get(self._keeper.start.remote(part))
        except ray.exceptions.RayActorError as e:
            raise OwnerError(f"partition owner {part} ({self.folder}) cannot be started again: the keeper "
                             f"{self.name}.keeper is gone (the group that started the owners closed or "
                             f"ended); start them again with RayOwners(..., name={self.name!r})", part) from e
        except ray.exceptions.RayTaskError as e:
            raise OwnerError(f"partition owner {part} ({self.folder}) failed to start again: {e.cause!r}",
                             part) from e

    def counters(self) -> dict[int, dict]:
        """Each owner's `PartitionOwner.counters` (one request per owner, not counted in `stats`)."""
        return self._get({p: a.counters.remote() for p, a in enumerate(self.actors)}, "counters")

    def info(self, part: int) -> dict:
        """`PartitionOwner.info` of one owner (as it reported when started)."""
        return self.infos[part]

    def _get(self, refs: dict[int, Any], method: str, timeout_s: float | None = None) -> dict[int, Any]:
        pending = self._pending(method, {}, refs, timeout_s)
        self.wait_any([pending])
        if pending.error is not None:
            raise pending.error
        return {p: pending.results[p] for p in refs}

    def _pending(self, method: str, requests: Mapping[int, tuple], refs: dict[int, Any],
                 timeout_s: float | None) -> OwnerCall:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return OwnerCall(method, requests, time.perf_counter(), waiting={ref: p for p, ref in refs.items()},
                         deadline=deadline)

    def start(self, method: str, requests: Mapping[int, tuple]) -> OwnerCall:
        """Send ``owner.method(*args)`` to each ``{part: args}`` (`call` in steps: `wait_any`, `finish`).

        Raises
        ------
        TypeError, ValueError
            A bad part; the owners are closed.
        """
        self._check_parts(requests)
        if self.closed:
            raise ValueError(f"the owners of {self.folder} are closed: start new ones (RayOwners)")
        refs = {p: getattr(self.actors[p], method).remote(*args) for p, args in requests.items()}
        return self._pending(method, requests, refs, self.timeout_s)

    def wait_any(self, calls: Sequence[OwnerCall]) -> int:
        """The index in ``calls`` of one that is `OwnerCall.done`, taking answers as they come (so the
        first failure of a call surfaces at once: a dead owner as soon as Ray reports its process gone;
        a call past its ``timeout_s`` fails naming the owners that did not answer)."""
        ray = self._ray
        while True:
            for i, c in enumerate(calls):
                if c.done:
                    return i
            timed = [c for c in calls if c.deadline is not None]
            first = min(timed, key=lambda c: c.deadline) if timed else None
            left = None if first is None else max(first.deadline - time.monotonic(), 0.0)
            done, _ = ray.wait([ref for c in calls for ref in c.waiting], num_returns=1, timeout=left)
            if not done:
                late = sorted(first.waiting.values())
                first.error = TimeoutError(
                    f"partition owners {late} ({self.folder}) did not answer {first.method} within timeout_s="
                    f"{self.timeout_s} (alive but hung or overloaded); restart them with restart(part)")
                continue
            self._answer(next(c for c in calls if done[0] in c.waiting), done[0])

    def _answer(self, call: OwnerCall, ref: Any) -> None:
        ray = self._ray
        p = call.waiting.pop(ref)
        try:
            try:
                call.results[p] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                if e.actor_init_failed:  # its constructor raised: a damaged folder, a bad part, ...
                    cause = str(e).strip().splitlines()[-1]  # the constructor's error, after the traceback
                    raise OwnerError(f"partition owner {p} failed to start from {self.folder}: {cause}",
                                     p) from e
                pid = self.infos[p]["pid"] if hasattr(self, "infos") else "?"
                raise OwnerError(f"partition owner {p} (Ray actor, pid {pid}, {self.folder}) died during "
                                 f"{call.method}: restart it with restart({p})", p) from e
            except ray.exceptions.RayTaskError as e:
                raise OwnerError(f"partition owner {p} ({self.folder}) failed {call.method}: {e.cause!r}",
                                 p) from e
        except OwnerError as err:
            call.error = err
            call.waiting.clear()

    def restart(self, part: int) -> None:
        """Start owner ``part`` again from the folder (verified); the old actor is killed if alive.

        Named owners (``name``, `attach`): when another process of the cluster already started a new
        owner ``part`` under the name, this group attaches to it instead, so every trainer that saw the
        owner die calls ``restart`` and goes on, whichever called it first. A group that attached has the
        `OwnerKeeper` start the new owner, so that it outlives this group's process as the first owners
        do (it lives as long as the group that started them, or on if they are detached).

        Raises
        ------
        TypeError, ValueError
            ``part`` not an int in [0, P) (no owner is touched).
        OwnerError
            The new owner failed to start (a damaged part, a folder written again: named), or the keeper
            is gone (the group that started the owners closed or ended).
        """
        self._check_parts({part: ()}, "part")
        if self.name is not None and self._attach_new(part):
            return
        self._ray.kill(self.actors[part], no_restart=True)
        self.actors[part] = self._start_by_keeper(part) if self.attached else self._start(part)
        self._get({part: self.actors[part].freeze_gc.remote()}, "freeze_gc")
        info = self._get({part: self.actors[part].info.remote()}, "info")[part]
        self.infos[part] = self._checked(part, info)

    def _attach_new(self, part: int) -> bool:
        """Attach the live actor named for ``part`` if it is not this group's (another process restarted
        it); False when the name is free, or held by this group's actor or a dead one."""
        try:
            actor = self._ray.get_actor(self._actor_name(part))
        except ValueError:
            return False
        if actor == self.actors[part]:
            return False
        try:
            info = self._get({part: actor.info.remote()}, "info")[part]
        except OwnerError:  # a dead actor whose name Ray has not freed yet
            return False
        self.infos[part] = self._checked(part, info)
        self.actors[part] = actor
        return True

    def close(self) -> None:
        """Kill every owner actor (named: those under the names, which another group may have started
        again, and the keeper); calls then raise ``ValueError`` (closed)."""
        self.closed = True
        ray = self._ray
        self._kill_started()
        for p in range(self.num_parts) if self.name is not None else ():
            try:
                ray.kill(ray.get_actor(self._actor_name(p)), no_restart=True)
            except ValueError:  # none under the name
                pass

    def _kill_started(self) -> None:
        """Kill this group's owner actors and the keeper (not other actors under the names)."""
        for a in self.actors:
            self._ray.kill(a, no_restart=True)
        if self._keeper is not None:
            self._ray.kill(self._keeper, no_restart=True)

    def __getstate__(self) -> dict:
        """Refused: Ray's actor handles belong to this driver.

        Raises
        ------
        TypeError
            Always; in another process, ``RayOwners.attach(folder, name)`` to owners started with ``name``.
        """
        raise TypeError("RayOwners cannot be pickled: in another process (a DataLoader worker, a trainer) "
                        "use RayOwners.attach(folder, name) on owners started with name=...")
