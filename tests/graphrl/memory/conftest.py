"""Fixtures of the graphrl.memory tests: a manager per test, and a check that /dev/shm is left clean."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from graphrl.memory import MemoryManager

SHM = Path("/dev/shm")
_PREFIXES: list[str] = []  # every manager made here; checked for leaks at the end of each module


def _shm_names(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(prefix + "*"))


def _managed(*args, **kwargs) -> MemoryManager:
    manager = MemoryManager(*args, **kwargs)
    _PREFIXES.append(manager.shm_prefix)
    return manager


@pytest.fixture(scope="session")
def shm_names():
    """``shm_names(prefix)``: the /dev/shm names that start with ``prefix``, sorted."""
    return _shm_names


@pytest.fixture(scope="session")
def managed():
    """``managed(*args, **kwargs)``: a `MemoryManager` whose segments the leak check watches."""
    return _managed


@pytest.fixture
def mm():
    manager = _managed()
    yield manager
    manager.close()
    assert _shm_names(manager.shm_prefix) == []


@pytest.fixture(scope="module", autouse=True)
def no_shm_left_by_this_module():
    yield
    gc.collect()  # managers a failed test left open clean up when collected
    leaked = [name for prefix in _PREFIXES for name in _shm_names(prefix)]
    assert leaked == [], f"shared memory left in /dev/shm: {leaked}"
