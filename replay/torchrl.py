"""TorchRL adapter: store a collector's TensorDict rollouts as episodes, and name the fields as TorchRL does.

A TorchRL collector (``torchrl.collectors.SyncDataCollector``, ...) yields TensorDicts of batch size
``[T]`` (one env) or ``[N_envs, T]`` (a batched env), holding per step ``"observation"``, ``"action"``,
``("next", "observation")``, ``("next", "reward")``, ``("next", "done")``, ``("next", "terminated")``,
``("next", "truncated")`` and ``("collector", "traj_ids")``. `TorchRLWriter` writes them through one
`replay.writer.TrajectoryWriter` per env: a step whose ``("next", "done")`` (or ``terminated`` /
``truncated``) is set ends its episode, a change of trajectory id ends it too, and an episode still
running at the end of a rollout stays open and continues with the next rollout. The trajectory-id and
end keys follow the user's mapping (``keys={"traj_ids": "episode", "done": "done"}``), as
``SliceSampler``'s ``traj_key`` / ``end_key``; a mapping the writer cannot honour is refused.

`DEFAULT_KEYS` maps store field names to TorchRL keys (``"reward"`` <-> ``("next", "reward")``,
``"next_observation"`` <-> ``("next", "observation")``, ``"traj_ids"`` <-> ``("collector",
"traj_ids")``, ...); a user mapping overrides entries (``None`` drops one), and a field it does not
name is read under its own name. `Batch.to_tensordict` uses the same mapping backwards, giving
batches laid out as TorchRL's ``SliceSampler`` gives them (docs/architecture.md#replay-composition).

>>> spec = torchrl_spec(collector_rollout)           # fields, shapes and dtypes of the rollout
>>> store = ReplayStore(spec, capacity_steps=100_000)
>>> with TorchRLWriter(store) as writer:
...     for rollout in collector:
...         writer.extend(rollout)
>>> with store.sample(32, window=8) as batch:
...     loss = DQNLoss(actor, action_space="one-hot")(batch.to_tensordict())

This module needs no TorchRL to import; rollouts are read through the TensorDict interface
(``batch_size``, ``get``, ``keys(include_nested=True)``).

References
----------
TorchRL's collectors (rollout layout, ``("collector", "traj_ids")``) and ``SliceSampler``
(``("next", "truncated")`` at slice ends, ``"is_init"`` at slice starts, ``strict_length``,
``("collector", "mask")``); Reverb's ``TrajectoryWriter``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from replay.spec import TrajectorySpec

if TYPE_CHECKING:
    from replay.writer import TrajectoryWriter

__all__ = [
    "DEFAULT_KEYS",
    "END_KEYS",
    "TorchRLWriter",
    "check_key",
    "field_names",
    "next_key",
    "torchrl_keys",
    "torchrl_spec",
    "transitions",
]

NestedKey = str | tuple[str, ...]

#: store field name -> TorchRL key of a collector's rollout (and of a SliceSampler batch)
DEFAULT_KEYS: dict[str, NestedKey] = {
    "observation": "observation",
    "action": "action",
    "next_observation": ("next", "observation"),
    "reward": ("next", "reward"),
    "done": ("next", "done"),
    "terminated": ("next", "terminated"),
    "truncated": ("next", "truncated"),
    "traj_ids": ("collector", "traj_ids"),
}

#: rollout keys whose True value ends an episode after its step (under the default mapping)
END_KEYS: tuple[NestedKey, ...] = (("next", "done"), ("next", "terminated"), ("next", "truncated"))
TRAJ_KEY: NestedKey = ("collector", "traj_ids")
MASK_KEY: NestedKey = ("collector", "mask")
#: fields whose rollout entries `TorchRLWriter` reads to cut episodes (stored too when the spec has them)
END_FIELDS: tuple[str, ...] = ("done", "terminated", "truncated")
TRAJ_FIELD = "traj_ids"
#: the trajectory-id key read when the rollout lacks the default one and ``keys`` names none (TorchRL's)
EPISODE_KEY: NestedKey = "episode"


def _key(key: NestedKey) -> NestedKey:
    """A nested key in its canonical form: a plain str, or a tuple of two or more strs."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(f"a TorchRL key is a str or a tuple of str, got {key!r}")


def check_key(key: Any, name: str) -> NestedKey:
    """``key`` as a TorchRL nested key in canonical form (a str, or a tuple of two or more strs).

    Parameters
    ----------
    key : str or tuple of str
    name : str
        The argument's name, for the message.

    Raises
    ------
    TypeError
        ``key`` is not a str or a non-empty tuple of str.
    """
    try:
        return _key(key)
    except TypeError:
        raise TypeError(f"{name} must be a str or a tuple of str (a TorchRL key), got {key!r}") from None


def torchrl_keys(keys: Mapping[str, NestedKey | None] | None = None) -> dict[str, NestedKey]:
    """`DEFAULT_KEYS` updated by ``keys`` (field name -> TorchRL key; ``None`` drops the default).

    Raises
    ------
    TypeError
        A key that is not a str or a tuple of str.
    ValueError
        Two fields mapped to one TorchRL key.
    """
    out = dict(DEFAULT_KEYS)
    for field, key in (keys or {}).items():
        if key is None:
            out.pop(field, None)
        else:
            out[field] = _key(key)
    seen: dict[NestedKey, str] = {}
    for field, key in out.items():
        if key in seen:
            raise ValueError(f"keys: fields {seen[key]!r} and {field!r} both map to {key!r}")
        seen[key] = field
    return out


def next_key(key: NestedKey) -> tuple[str, ...]:
    """The TorchRL key of a key's value after the step: ``"observation"`` -> ``("next", "observation")``."""
    return ("next", *key) if isinstance(key, tuple) else ("next", key)


def _has(td: Any, key: NestedKey) -> bool:
    return td.get(key, None) is not None


def torchrl_spec(rollout: Any, keys: Mapping[str, NestedKey | None] | None = None) -> TrajectorySpec:
    """A `TrajectorySpec` with one field per mapped key the rollout holds, of its per-step shape and dtype.

    Parameters
    ----------
    rollout : tensordict.TensorDictBase
        A collector's rollout, batch size ``[T]`` or ``[N_envs, T]`` (the last dim is time).
    keys : mapping of str to TorchRL key, optional
        Overrides of `DEFAULT_KEYS` (see `torchrl_keys`); fields whose key the rollout lacks are left out.

    Raises
    ------
    ValueError
        None of the mapped keys is in the rollout, or the rollout has no batch dims.
    """
    dims = len(rollout.batch_size)
    if dims not in (1, 2):
        raise ValueError(f"rollout: batch size must be [T] or [N_envs, T], got {list(rollout.batch_size)}")
    fields = {}
    for field, key in torchrl_keys(keys).items():
        value = rollout.get(key, None)
        if value is not None:
            fields[field] = (tuple(value.shape[dims:]), value.dtype)
    if not fields:
        raise ValueError(f"rollout holds none of the keys {sorted(map(str, torchrl_keys(keys).values()))}")
    return TrajectorySpec(fields)


def field_names(value: Any, name: str) -> tuple[str, ...]:
    """``value`` (the ``name`` argument) as a tuple of field names; ``ValueError`` for a bare str (refused,
    not iterated by character) or an item that is not a str."""
    if isinstance(value, str) or not all(isinstance(f, str) for f in value):
        raise ValueError(f"{name}={value!r}: give a sequence of field names, such as ('observation',)")
    return tuple(value)


def transitions(
    windows: Any, fields: Sequence[str] = ("observation",),
    keys: Mapping[str, NestedKey | None] | None = None, init_key: NestedKey | None = "is_init",
) -> Any:
    """TorchRL transitions from windows of two steps of a store that keeps no ``next_*`` fields.

    A store written by ``TorchRLWriter(store, final_fields=("observation",))`` on a spec without
    ``next_observation`` holds each observation once, and each episode's final step (the terminal
    observation, every other field zero). A transition is two consecutive steps of one episode: per
    window of ``store.sample(B, 2)`` (either padding) whose two steps are real, this gives step 0's
    entries with ``("next", key)`` of each of ``fields`` from step 1, as cpprb's ``next_of``. A window
    holding a final step and nothing after it (or an episode's first step and nothing before it) is
    dropped, so a final step never comes out as a transition: exactly the transitions a
    ``torchrl.data.ReplayBuffer`` fed the same rollouts holds (also dropped: the last committed step of
    an open episode, and a cut by another writer, docs/architecture.md#the-commit-protocol).

    Parameters
    ----------
    windows : tensordict.TensorDictBase
        ``batch.to_tensordict(init_key=None)`` of ``store.sample(B, 2)``: batch size ``[B, 2]``, with
        its ``"mask"`` (``init_key=None``: the window marker would be True at every step 0).
    fields : sequence of str
        The store fields whose next value a transition needs (default ``("observation",)``).
    keys : mapping of str to TorchRL key, optional
        The mapping ``to_tensordict`` used (see `torchrl_keys`); ``fields`` are read under it.
    init_key : str or tuple of str, or None
        Where ``to_tensordict`` puts its window-start marker (default TorchRL's ``"is_init"``, as it): an
        entry there True at every window's first real step is that marker, and is refused. None: no check.

    Returns
    -------
    tensordict.TensorDict
        Batch size ``[B']``, ``B' <= B`` (the windows with two real steps, in the batch's order): every
        entry of step 0 (``("next", "reward")``, ``("next", "done")`` ... as stored, ``"keys"`` and
        ``"priority_weight"`` of the window: ``store.update_priorities(td["keys"], ...)`` updates the
        anchors), plus ``("next", key)`` of each field; no ``("collector", "mask")`` (every row is real).
        Entries are copies, not views of the batch's staging slot.

    Raises
    ------
    ValueError
        ``windows`` is not ``[B, 2]`` or has no ``"mask"``; ``fields`` is a str, or a field of it is
        missing, or its ``("next", key)`` is already there (the store keeps next values: ``sample(B, 1)``
        gives the transitions, and ``final_fields`` is refused); the entry under ``init_key`` is True at
        every window's first real step (``to_tensordict()``'s marker: pass ``init_key=None`` to it).
    """
    if len(windows.batch_size) != 2 or windows.batch_size[1] != 2 or windows.get("mask", None) is None:
        raise ValueError(
            "windows: give batch.to_tensordict() of store.sample(B, 2) (batch size [B, 2], with 'mask'), got "
            f"batch size {list(windows.batch_size)}"
        )
    mapping, mask = torchrl_keys(keys), windows.get("mask")
    pairs = {}
    for field in field_names(fields, "fields"):
        key = mapping.get(field, field)
        if windows.get(key, None) is None:
            raise ValueError(f"fields: windows have no {key!r} for field {field!r}")
        if windows.get(next_key(key), None) is not None:
            raise ValueError(
                f"fields: windows already hold {next_key(key)!r} for field {field!r}: the store keeps the "
                "value after each step, so sample(B, 1) gives its transitions"
            )
        pairs[key] = next_key(key)
    init = None if init_key is None else windows.get(check_key(init_key, "init_key"), None)
    if init is not None and bool(mask.any()):  # the marker: True at each window's first real step
        some = mask.any(1)
        if bool(init.reshape(*mask.shape, -1)[some.nonzero()[:, 0], mask[some].long().argmax(1)].all()):
            raise ValueError(
                f"windows: {init_key!r} is True at every window's first real step, the window-start marker "
                "of batch.to_tensordict(), not the episode starts: pass to_tensordict(init_key=None)"
            )
    real = windows[mask.all(-1)]  # [B', 2], a copy
    out = real[:, 0]
    for key, nxt in pairs.items():
        out.set(nxt, real.get(key)[:, 1])
    if out.get(MASK_KEY, None) is not None:
        out = out.exclude(MASK_KEY)
        if not out.get(MASK_KEY[0]).keys():
            out = out.exclude(MASK_KEY[0])
    return out


class TorchRLWriter:
    """Writes TorchRL collector rollouts into a replay store as episodes, one open writer per env.

    Parameters
    ----------
    target : ReplayStore, AttachedStore or any object with ``writer(**kw)``; or a TrajectoryWriter
        Where the steps go. A store makes one `TrajectoryWriter` per env (lazily); a single writer
        takes rollouts of one env only (batch size ``[T]`` or ``[1, T]``).
    keys : mapping of str to TorchRL key, optional
        Overrides of `DEFAULT_KEYS` (``None`` drops one). Every field of the store's spec is read from
        the rollout under ``keys.get(field, field)``; other rollout entries are ignored. The episode
        boundaries follow the mapping too: ``keys["done"]``, ``keys["terminated"]`` and
        ``keys["truncated"]`` are the end keys and ``keys["traj_ids"]`` the trajectory-id key (as
        ``SliceSampler(end_key=..., truncated_key=..., traj_key=...)``), whether or not the spec stores
        those fields. ``None`` for one of these four stops storing it but not cutting on it: the
        default key is still read when the rollout has it.
    final_fields : sequence of str, optional
        Fields of the spec (``("observation",)``) whose value after an episode's last step, read from
        the rollout under ``("next", keys[field])``, is stored when the episode ends, through
        ``end_episode(final=...)`` (one more step, every other field zero: `replay.writer.final_step`).
        For a spec that does not store ``("next", keys[field])`` (``torchrl_spec(rollout,
        keys={"next_observation": None})``: each observation stored once): a transition is then two
        consecutive steps, `transitions` of ``store.sample(B, 2)`` gives them (the terminal one
        included, a final step never as a transition of its own), and frame stacks reach the terminal
        transition (docs/architecture.md#windows, stacked frames). ``sample(B, 1)`` and longer windows
        draw final steps as steps (mask True), and ``len(store)`` counts them (T + 1 per ended
        episode). Refused where the spec stores the field's next value (below). Default none.
    **writer_kwargs
        Passed to ``target.writer`` (``chunk_steps``, ``timeout``).

    Attributes
    ----------
    spec : TrajectorySpec
    keys : dict of str to TorchRL key
        The key each spec field is read from.
    end_keys : tuple of TorchRL key
        The rollout keys whose True value ends an episode after its step.
    traj_key : TorchRL key
        The rollout key of the trajectory ids.
    final_keys : dict of str to TorchRL key
        Per field of ``final_fields``, the rollout key of its value after each step (``("next", key)``).
    steps_written, episodes_written : int
        Steps handed to the writers, episodes ended.

    Raises
    ------
    ValueError
        ``keys`` maps a field that is neither in the store's spec nor one of ``"done"``,
        ``"terminated"``, ``"truncated"``, ``"traj_ids"`` (the writer could not honour it; the message
        names the field and its key); two fields mapped to one key (`torchrl_keys`); a name of
        ``final_fields`` not in the spec, or one whose ``("next", key)`` a spec field already stores
        (``next_observation`` of `torchrl_spec`: every step is then a whole transition, and a final
        step would be sampled as one more, fabricated transition; the message names both fields).
    TypeError
        ``target`` is neither a store nor a writer; a key not a str or a tuple of str.

    Notes
    -----
    An episode ends after a step whose end keys (those the rollout has; by default ``("next",
    "done")``, ``("next", "terminated")`` and ``("next", "truncated")``) hold True, and also when the
    step's trajectory id (by default ``("collector", "traj_ids")``) differs from the previous step's of
    the same env (within a rollout or across rollouts); without a ``traj_ids`` entry in ``keys``, a
    rollout that lacks ``("collector", "traj_ids")`` has its ids read from ``"episode"`` when it holds
    one (``SliceSampler``'s traj_key detection). An end or trajectory key that ``keys`` names
    explicitly must be in every rollout (ValueError otherwise); a default one is read when present.
    Steps whose ``("collector", "mask")`` is False (padding of some collectors) are skipped. An episode
    open at a rollout's end continues in the next `extend`; `close` (or the end of a ``with`` block
    without an exception) ends every open episode.
    """

    def __init__(
        self,
        target: Any,
        keys: Mapping[str, NestedKey | None] | None = None,
        *,
        final_fields: Sequence[str] = (),
        **writer_kwargs: Any,
    ) -> None:
        self._store = None if hasattr(target, "append") and hasattr(target, "end_episode") else target
        self._writers: dict[int, TrajectoryWriter] = {}
        if self._store is None:
            self._writers[0] = target
            if writer_kwargs:
                raise ValueError(f"writer_kwargs {sorted(writer_kwargs)} need a store, not a writer")
        elif not hasattr(target, "writer"):
            raise TypeError(
                f"target must be a replay store or a TrajectoryWriter, got {type(target).__name__}"
            )
        self._writer_kwargs = writer_kwargs
        self.spec: TrajectorySpec = target.spec
        mapping = torchrl_keys(keys)
        given = {field: key for field, key in (keys or {}).items() if key is not None}
        control = (*END_FIELDS, TRAJ_FIELD)
        for field, key in given.items():
            if field not in self.spec and field not in control:
                raise ValueError(
                    f"keys[{field!r}]={key!r}: {field!r} is not a field of the store's spec "
                    f"({sorted(self.spec)}) nor one the writer reads to cut episodes ({list(control)}), "
                    "so the writer cannot honour it; drop it or add the field to the spec"
                )
        self.keys = {field: mapping.get(field, field) for field in self.spec}
        if any(f not in self.spec for f in field_names(final_fields, "final_fields")):
            raise ValueError(
                f"final_fields={final_fields!r}: give a sequence of the spec's fields {list(self.spec)}"
            )
        #: field -> rollout key of its value after each step, for the final step of an episode
        self.final_keys: dict[str, NestedKey] = {f: next_key(self.keys[f]) for f in final_fields}
        stored = {key: field for field, key in self.keys.items()}
        for field, key in self.final_keys.items():
            if key in stored:
                raise ValueError(
                    f"final_fields={tuple(final_fields)!r}: the store's spec already holds "
                    f"{stored[key]!r} (TorchRL key {key!r}), the value of {field!r} after every step, so "
                    "each stored step is a whole transition and a final step is redundant: it would add one "
                    f"step per episode that samples as a transition of its own ({field!r} = the terminal "
                    f"value, {stored[key]!r} and every other field zero), which a TorchRL ReplayBuffer "
                    f"never holds. Drop final_fields (sample(B, 1) then gives exactly the rollouts' "
                    f"transitions), or leave {stored[key]!r} out of the spec (torchrl_spec(rollout, "
                    f"keys={{{stored[key]!r}: None}})) and take transitions from windows of two steps "
                    "(replay.torchrl.transitions)"
                )
        self._final: dict[int, dict[str, np.ndarray]] = {}  # env -> final fields after its last written step
        self.end_keys: tuple[NestedKey, ...] = tuple(
            mapping[f] if f in given else DEFAULT_KEYS[f] for f in END_FIELDS
        )
        self.traj_key: NestedKey = mapping[TRAJ_FIELD] if TRAJ_FIELD in given else TRAJ_KEY
        self._traj_fallback = TRAJ_FIELD not in given  # then "episode" when the rollout lacks traj_key
        self._required = {mapping[f]: f for f in given if f in control}  # named by the user: must exist
        self._last_traj: dict[int, int] = {}  # env -> trajectory id of its open episode
        self._open_envs: set[int] = set()  # envs with steps written since their last end
        self.steps_written = 0
        self.episodes_written = 0
        self._closed = False

    @property
    def writers(self) -> dict[int, TrajectoryWriter]:
        """The writer of each env (index in the rollout's first batch dim) that has written steps."""
        return dict(self._writers)

    def _writer(self, env: int) -> TrajectoryWriter:
        w = self._writers.get(env)
        if w is None:
            w = self._writers[env] = self._store.writer(**self._writer_kwargs)
        return w

    def extend(self, rollout: Any) -> int:
        """Write a rollout's steps, env by env and in time order; returns the number of steps written.

        Parameters
        ----------
        rollout : tensordict.TensorDictBase
            Batch size ``[T]`` or ``[N_envs, T]`` (time last, as collectors give), holding every key in
            `keys`, each ``[*batch, *field_shape]`` of the field's dtype.

        Raises
        ------
        ValueError
            A batch size of other than 1 or 2 dims, a missing key (naming field and key), a wrong
            per-step shape; or a closed writer or store (the message names the call). Nothing of the
            rollout is written.
        TypeError
            A wrong dtype (naming the field). Nothing of the rollout is written.
        TimeoutError
            A commit waited for the rate limiter past the writer's timeout. The rollout was written up
            to that commit: the episodes it ended before are stored, its steps up to the refused
            commit are staged (the message says how many steps of the rollout were written, per env),
            the rest is not written and `steps_written` counts what was. Retry the refused commit with
            `end_episodes` or `close` (or go on with the next rollout: its first step ends the open
            episode again); do not call ``extend(rollout)`` again, which would store the episodes
            written before the refusal twice.
        """
        self._check_open("extend")
        dims = len(rollout.batch_size)
        if dims not in (1, 2):
            raise ValueError(
                f"rollout: batch size must be [T] or [N_envs, T], got {list(rollout.batch_size)}"
            )
        for key, field in self._required.items():
            if not _has(rollout, key):
                raise ValueError(
                    f"rollout has no {key!r}, the key keys[{field!r}] names for cutting episodes "
                    "(pass keys with the rollout's own key)"
                )
        cols = {}
        for field, key in self.keys.items():
            value = rollout.get(key, None)
            if value is None:
                raise ValueError(f"rollout has no {key!r} for field {field!r} (pass keys={{{field!r}: ...}})")
            cols[field] = value if dims == 2 else value.unsqueeze(0)
        n_env, t = (1, *rollout.batch_size) if dims == 1 else tuple(rollout.batch_size)
        if self._store is None and n_env != 1:
            raise ValueError(
                f"a TorchRLWriter on one TrajectoryWriter takes rollouts of one env, got {n_env} envs: "
                "give it the store instead"
            )
        arrays = {field: f.check(cols[field], (n_env, t)) for field, f in self.spec.items()}  # all, first
        finals = {}
        for field, key in self.final_keys.items():
            value = rollout.get(key, None)
            if value is None:
                raise ValueError(
                    f"rollout has no {key!r}, the value after each step of field {field!r} that "
                    "final_fields asks for"
                )
            finals[field] = self.spec[field].check(value if dims == 2 else value.unsqueeze(0), (n_env, t))
        ends = torch.zeros(n_env, t, dtype=torch.bool)
        for key in self.end_keys:
            if _has(rollout, key):
                e = rollout.get(key).reshape(n_env, t, -1)
                ends |= e.any(-1).cpu()
        traj = rollout.get(self.traj_key, None)
        if traj is None and self._traj_fallback:
            traj = rollout.get(EPISODE_KEY, None)
        traj = None if traj is None else traj.reshape(n_env, t).cpu().numpy()
        valid = rollout.get(MASK_KEY, None)
        valid = None if valid is None else valid.reshape(n_env, t).cpu().numpy()
        ends_np = ends.numpy()
        steps0, episodes0 = self.steps_written, self.episodes_written
        written = 0
        for env in range(n_env):
            try:
                written += self._write_env(
                    env,
                    {n: a[env] for n, a in arrays.items()},
                    {n: a[env] for n, a in finals.items()},
                    ends_np[env],
                    None if traj is None else traj[env],
                    None if valid is None else valid[env],
                )
            except TimeoutError as exc:
                mine = self.steps_written - steps0 - written
                whole = f"envs 0..{env - 1} whole, " if env else ""
                raise TimeoutError(
                    f"TorchRLWriter.extend(): a commit of env {env} was refused ({exc}). Of this rollout, "
                    f"{self.steps_written - steps0} steps were written ({whole}{mine} of env {env}) and "
                    f"{self.episodes_written - episodes0} episode(s) ended before the refusal; the rest is "
                    "not written. Retry the refused commit with end_episodes() or close() (or go on with "
                    "the next rollout), not extend(rollout) again: that would store the steps written "
                    "before the refusal twice"
                ) from exc
        return written

    def _write_env(
        self,
        env: int,
        cols: dict[str, np.ndarray],
        finals: dict[str, np.ndarray],
        ends: np.ndarray,
        traj: np.ndarray | None,
        valid: np.ndarray | None,
    ) -> int:
        rows = np.arange(len(ends)) if valid is None else np.flatnonzero(valid)
        if rows.size == 0:
            return 0
        w = self._writer(env)
        # segment boundaries: after an end step, and before a step whose trajectory id changes
        cut_after = ends[rows].copy()
        if traj is not None:
            ids = traj[rows]
            prev = self._last_traj.get(env)
            if env in self._open_envs and ids[0] != prev:  # the open episode was cut off
                self._end(env)
            cut_after[:-1] |= ids[1:] != ids[:-1]
        start = 0
        for stop in [*(np.flatnonzero(cut_after) + 1).tolist(), rows.size]:
            if stop <= start:
                continue
            sel = rows[start:stop]
            before = w.steps_written + w.pending
            try:
                w.extend({n: c[sel] for n, c in cols.items()})
            finally:  # a refused chunk commit leaves the steps before it taken: account for them, only them
                taken = min(sel.size, w.steps_written + w.pending - before)
                if taken > 0:
                    self.steps_written += taken
                    self._open_envs.add(env)
                    last = sel[taken - 1]
                    if finals:  # copies: a collector may reuse the rollout's memory
                        self._final[env] = {n: c[last].copy() for n, c in finals.items()}
                    if traj is not None:
                        self._last_traj[env] = int(traj[last])
            if cut_after[stop - 1]:
                self._end(env)
            start = stop
        return int(rows.size)

    def _end(self, env: int) -> None:
        self._writers[env].end_episode(final=self._final.get(env))  # kept for a retry if it raises
        self._final.pop(env, None)
        self._open_envs.discard(env)
        self._last_traj.pop(env, None)
        self.episodes_written += 1

    def _target_closed(self) -> bool:
        """Whether the store (or the one given writer) is closed: anything written now would be lost."""
        if self._store is not None and getattr(self._store, "closed", False):
            return True
        return any(getattr(w, "closed", False) for w in self._writers.values())

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ValueError(f"TorchRLWriter.{call}(): this TorchRLWriter is closed")
        if self._target_closed():
            raise ValueError(
                f"TorchRLWriter.{call}(): the replay store (or writer) it writes to is closed; nothing "
                "more can be written (what was committed before stays in the store's checkpoints)"
            )

    def flush(self) -> None:
        """Commit every env's staged steps, keeping their episodes open (they become sampleable).

        With several envs writing to one shard, their commits interleave, so each flushed part of an
        episode becomes its own record (a continuation: windows never reach back across the cut, see
        docs/architecture.md#the-commit-protocol). To keep episodes whole, flush only when you must see
        the steps at once, or give the store at least as many shards as envs (each open episode then
        goes to its own shard).
        """
        self._check_open("flush")
        for w in self._writers.values():
            w.flush()

    def end_episodes(self) -> None:
        """End every env's open episode (the next rollout's steps start new ones)."""
        self._check_open("end_episodes")
        for env in sorted(self._open_envs):
            self._end(env)

    def close(self) -> None:
        """End the open episodes and close the writers this object made (a given writer stays open)."""
        if self._closed:
            return
        try:
            if not self._target_closed():  # the store is gone: staged steps cannot be committed
                self.end_episodes()
        finally:
            self._closed = True
            if self._store is not None:
                for w in self._writers.values():
                    w.close()

    def __enter__(self) -> TorchRLWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None and self._store is not None:
            for w in self._writers.values():
                w.close()  # drops staged steps, as TrajectoryWriter does after an exception
            self._closed = True
        self.close()

    def __repr__(self) -> str:
        return (
            f"TorchRLWriter(envs={len(self._writers)}, steps_written={self.steps_written}, "
            f"episodes_written={self.episodes_written})"
        )
