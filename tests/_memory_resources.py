"""Memory resources for tests of the manager's locking (``tests/graphrl/memory``). Imported as
``from _memory_resources import SlowCapacity`` (``tests/`` holds the root conftest, so pytest puts it on
``sys.path``)."""

from __future__ import annotations

import threading

from graphrl.memory.resources import HostResource


class SlowCapacity(HostResource):
    """A host resource whose ``capacity()`` (asked with the manager's lock held) sets ``holding`` and waits
    up to ``join_s`` seconds for ``release``: a test holds the manager's lock on another thread as long as it
    likes."""

    def __init__(self, join_s: float) -> None:
        self.join_s = join_s
        self.holding = threading.Event()
        self.release = threading.Event()

    def capacity(self) -> int:
        self.holding.set()
        self.release.wait(self.join_s)
        return 1 << 20
