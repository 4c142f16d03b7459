"""Fixtures of the Ray store's tests: ``cluster``, the session's one local Ray cluster (``ray_cluster`` of
``tests/conftest.py``: the tests that use it run last, the cluster shuts down after the last of them)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cluster(ray_cluster) -> None:
    """The session's local Ray cluster of this machine (2 CPUs), shared with every Ray test."""
