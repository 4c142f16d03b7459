"""Stand-ins for CUDA objects in tests that run without a GPU. Imported as ``from _fakes import FakeEvent``
(``tests/`` holds the root conftest, so pytest puts it on ``sys.path``)."""

from __future__ import annotations


class FakeEvent:
    """A CUDA event's ``query`` / ``synchronize``, completed when the test says (``done = True``).

    ``queries`` and ``synchronized`` count the calls, so a test can tell a host wait (``synchronize``) from a
    poll (``query``)."""

    def __init__(self) -> None:
        self.done = False
        self.queries = 0
        self.synchronized = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        self.done = True
