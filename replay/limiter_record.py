"""How a store's rate limiter travels: to other processes (the object, pickled) and into checkpoints.

A `replay.rate_limiter.RateLimiter` subclass is code (its own ``can_insert`` / ``can_sample``), so it
must reach every process that admits inserts or samples as the object itself, never as a config
rebuilt into its base class:

- `check_picklable`: a store's handle (`replay.storage.StoreHandle`, carried by actor and learner
  processes) holds the limiter object; one that cannot be pickled is refused when the handle is made.
- `limiter_record` / `restored_limiter`: a checkpoint records the limiter's settings (``to_config``)
  and, for a class other than the built-ins, its qualified name under ``"class"`` and its own settings
  under ``"settings"`` (`replay.rate_limiter.RateLimiter.record_settings`, checked by ``plain_settings``:
  by default its constructor's arguments read back from public attributes of the same names and plain
  types, such as a cap; settings, not state, so a counter it keeps is not recorded; a subclass keeping a
  setting under another name or type overrides it). Restoring rebuilds a built-in from its settings; a
  subclass is not rebuilt by import (a checkpoint holds no code): the user passes it,
  ``restore(path, rate_limiter=...)``, and it must be of the recorded class with the recorded
  ``to_config`` and ``record_settings``, else ``ValueError`` says what differs and what to pass. (A
  checkpoint written before ``"settings"`` was recorded is checked on its class and ``to_config`` only.)

>>> cfg["rate_limiter"] = limiter_record(store.rate_limiter)            # checkpoint
>>> limiter = restored_limiter(cfg["rate_limiter"], given, "ReplayStore.restore")  # restore

References
----------
DeepMind Reverb checkpoints a rate limiter's settings and counters (``RateLimiterCheckpoint``) and
rebuilds its built-in limiters from them; TorchRL's replay buffers save only state and load it into
components the user constructs (``ReplayBuffer.loads`` / ``load_state_dict``): a user's class comes
back as the user's object.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

from replay.rate_limiter import RateLimiter, rate_limiter_from_config

__all__ = ["check_picklable", "class_name", "limiter_record", "restored_limiter"]

def class_name(limiter: RateLimiter) -> str:
    """``module.QualName`` of ``limiter``'s class."""
    cls = type(limiter)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_picklable(limiter: RateLimiter, who: str) -> RateLimiter:
    """``limiter``, refused if it cannot travel to another process.

    Raises
    ------
    TypeError
        ``pickle.dumps(limiter)`` fails (a class defined inside a function, an attribute such as a lock
        or a lambda): the message names the limiter, its class and the remedy.
    """
    try:
        pickle.dumps(limiter)
    except Exception as exc:
        raise TypeError(
            f"{who}: the store's rate limiter {limiter!r} ({class_name(limiter)}) cannot be pickled "
            f"({type(exc).__name__}: {exc}), so the processes attached by this handle could not apply its "
            "rule: define its class at a module's top level (importable there) and keep its attributes "
            "picklable"
        ) from exc
    return limiter


RECORD_KEYS = ("class", "settings")  # what limiter_record adds to to_config() for a subclass


def limiter_record(limiter: RateLimiter) -> dict[str, Any]:
    """What a checkpoint records of ``limiter``: ``to_config()``, plus ``"class"`` (`class_name`) and
    ``"settings"`` (its `replay.rate_limiter.RateLimiter.record_settings`) for a class other than the
    built-ins (the classes of `replay.rate_limiter`, which `rate_limiter_from_config` rebuilds from their
    config alone)."""
    record = dict(limiter.to_config())
    if type(limiter).__module__ != RateLimiter.__module__:
        record["class"] = class_name(limiter)
        record["settings"] = limiter.plain_settings()
    return record


def _plain(config: dict[str, Any]) -> Any:
    """``config`` as a checkpoint's JSON gives it back (tuples as lists)."""
    return json.loads(json.dumps(config))


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON text (so a recorded NaN equals a given NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def restored_limiter(record: dict[str, Any], given: RateLimiter | None, who: str) -> RateLimiter:
    """The limiter a store restored from a checkpoint uses: ``given`` (checked) or the built-in rebuilt.

    Parameters
    ----------
    record : dict
        `limiter_record`'s (a checkpoint written before the ``"class"`` key: a built-in's).
    given : RateLimiter or None
        The ``rate_limiter`` passed to ``restore``.
    who : str
        The call, for messages (``"ReplayStore.restore"``).

    Raises
    ------
    ValueError
        The record names a subclass and ``given`` is None; ``given`` is not of the recorded class, its
        ``to_config()`` differs from the recorded settings, or its ``record_settings()`` from the
        recorded ``"settings"`` (where the checkpoint has them).
    TypeError
        ``given`` is not a `replay.rate_limiter.RateLimiter`.
    """
    config = {k: v for k, v in record.items() if k not in RECORD_KEYS}
    recorded = record.get("class")
    if given is None:
        if recorded is None:
            return rate_limiter_from_config(config)
        own = record.get("settings")
        raise ValueError(
            f"{who}: the checkpoint's rate limiter is {recorded}, a RateLimiter subclass; a checkpoint "
            f"holds its settings {config}"
            + ("" if own is None else f", its record_settings() {own}")
            + " and class name, not its code: pass the limiter, "
            f"restore(path, rate_limiter={recorded.rpartition('.')[2]}(...)), with those settings"
        )
    if not isinstance(given, RateLimiter):
        raise TypeError(
            f"{who}: rate_limiter must be a replay.rate_limiter.RateLimiter, got {type(given).__name__}"
        )
    want = recorded if recorded is not None else class_name(rate_limiter_from_config(config))
    if class_name(given) != want or not _same(_plain(given.to_config()), _plain(config)):
        raise ValueError(
            f"{who}: rate_limiter={given!r} ({class_name(given)}, settings {given.to_config()}) is not the "
            f"checkpoint's: {want} with settings {config}; pass that limiter, or none for a built-in one"
        )
    if "settings" in record and not _same(given.plain_settings(), record["settings"]):
        raise ValueError(
            f"{who}: rate_limiter={given!r} ({class_name(given)}) has record_settings() "
            f"{given.plain_settings()}, the checkpoint's {want} had {record['settings']} (by default its "
            "constructor's arguments read back from attributes of the same names: replay.rate_limiter."
            "RateLimiter.record_settings); pass the limiter the checkpoint was written with, or, if what "
            "differs is state rather than a setting, override record_settings to return its settings only"
        )
    return given
