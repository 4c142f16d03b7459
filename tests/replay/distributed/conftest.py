"""Fixtures of the Ray store's tests: one local Ray cluster for the whole folder.

Starting a cluster costs seconds (a head process, a raylet, workers importing torch), so the test files
of this folder share one, started by the first test that asks for ``cluster`` and shut down as soon as the
last test of the folder is done: the tests after it fork processes, which must not inherit a Ray driver.
Each test still makes (and closes) its own stores and actors; nothing is named, so nothing leaks between
tests. A cluster someone started before the tests is used and left running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STARTED = pytest.StashKey[bool]()


def _shutdown(config: pytest.Config) -> None:
    if config.stash.get(STARTED, False):
        import ray

        ray.shutdown()
        config.stash[STARTED] = False


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A local Ray cluster of this machine (2 CPUs), shared by this folder's tests."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")
    if not ray.is_initialized():
        # address="local": a cluster of its own, even where someone runs `ray start --head` on this machine
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
        request.config.stash[STARTED] = True
    yield
    _shutdown(request.config)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the folder's last test (and its module fixtures' teardown: this runs after pytest's own)."""
    if nextitem is None or HERE not in Path(nextitem.path).resolve().parents:
        _shutdown(item.config)
