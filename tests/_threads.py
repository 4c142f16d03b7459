"""Run test code on a thread joined with a timeout, and keep the garbage collector to where a test calls it:
for tests of finalizers and locks (``tests/graphrl/memory``), where a deadlock must fail the test instead of
hanging it. Imported as ``from _threads import no_automatic_gc, run_joined`` (``tests/`` holds the root
conftest, so pytest puts it on ``sys.path``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def run_joined(fn: Callable[[], object], join_s: float = 60.0) -> object:
    """``fn()`` on a daemon thread, joined for ``join_s`` seconds; what it returned (``None`` when nothing).

    Fails with ``AssertionError("deadlock: ...")`` if the thread is still running after ``join_s``; an
    exception ``fn`` raised is re-raised on the caller's thread."""
    out: list[object] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as err:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(join_s)
    assert not thread.is_alive(), "deadlock: the call did not return"
    if errors:
        raise errors[0]
    return out[0] if out else None


@contextmanager
def no_automatic_gc() -> Iterator[None]:
    """Garbage is collected only where a test says (``gc.collect``, in a hook or not); automatic collection
    is back on at the end if it was on before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
