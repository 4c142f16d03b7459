"""RateLimiterState: a rate limiter bound to its counters, blocking admission with timeouts.

See docs/architecture.md#replay-composition.

`replay.rate_limiter` holds the rules (a `RateLimiter` says whether ``counts = (inserts, samples,
deletes)`` admit one more insert or sample, and explains a refusal); this module applies them to live
counters: an int64 array ``[inserts, samples, deletes, cancelled]`` (indices `INSERTS`, `SAMPLES`,
`DELETES`, `CANCELLED`; the store keeps it in its control block, in shared memory) guarded by a
condition variable (``threading.Condition`` here; the store passes a process-shared one so that actor
and learner processes block too).

- `RateLimiterState.await_insert` / `await_sample` block until the limiter admits one step, on the
  condition variable with a deadline; they never sleep-poll and never hang past their timeout, and
  raise ``TimeoutError`` with the limiter's own explanation (`RateLimiter.explain_insert_block` /
  `explain_sample_block`, a subclass's own rule included), ``ValueError`` once the store closed
  (`cancel`), or, in an attached process, the owner's end (`replay.owner_watch.OwnerWatch`).
- `insert` / `sample` / `delete` count steps and wake waiters; `state` / `load_state` are the
  checkpointed counters.

References
----------
DeepMind Reverb: ``reverb/cc/rate_limiter.cc`` (the state behind ``reverb/rate_limiters.py``'s
configurations: AwaitCanInsert, AwaitAndFinalizeSample, checkpointed counters).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replay.owner_watch import OwnerWatch

if TYPE_CHECKING:
    from replay.rate_limiter import RateLimiter

__all__ = ["CANCELLED", "DELETES", "INSERTS", "SAMPLES", "RateLimiterState"]

INSERTS, SAMPLES, DELETES, CANCELLED = 0, 1, 2, 3  # the counters' layout


class RateLimiterState:
    """A rate limiter bound to counters and a condition variable: blocking admission with timeouts.

    Parameters
    ----------
    limiter : RateLimiter
    counters : numpy.ndarray, int64 [4], optional
        ``[inserts, samples, deletes, cancelled]``; the store passes an array in shared memory. Default
        a fresh zeroed array.
    condition : threading.Condition-like, optional
        Guards ``counters``; the store passes a process-shared one. Default a new
        ``threading.Condition``.
    owner : replay.owner_watch.OwnerWatch, optional
        In a process attached to a store (a learner): a wait also ends when the store's owner process has
        ended, with `replay.owner_watch.OwnerWatch.ended`'s ``ValueError`` instead of a ``TimeoutError``
        blaming the limiter (or, without a timeout, waiting for good).

    Examples
    --------
    >>> rl = RateLimiterState(SampleToInsertRatio(2.0, min_size=10, error_buffer=50))
    >>> rl.await_insert(timeout=1.0); rl.insert(10)
    >>> rl.await_sample(timeout=1.0); rl.sample(8)
    """

    def __init__(
        self, limiter: RateLimiter, counters: np.ndarray | None = None, condition: Any = None,
        owner: OwnerWatch | None = None,
    ) -> None:
        self.limiter = limiter
        self.counters = np.zeros(4, dtype=np.int64) if counters is None else counters
        # the four counters as Python ints, read in index order (a memoryview's tolist: no slice, no array)
        self._read_counts = memoryview(self.counters[:4]).tolist
        self.cond = condition if condition is not None else threading.Condition()
        self.owner = owner  # (its `gone` is False where this process does not watch: the owner itself)

    # -- waiting
    def _wait(
        self, predicate: Any, timeout: float | None, explain: Any, what: str, given: float | None
    ) -> None:
        start = time.monotonic()
        owner = self.owner
        with self.cond:
            ok = self.cond.wait_for(
                lambda: predicate() or self.counters[CANCELLED] != 0 or (owner is not None and owner.gone()),
                timeout,
            )
            if self.counters[CANCELLED]:
                raise ValueError(f"{what}: the store was closed")
            waited = time.monotonic() - start
            if owner is not None and owner.gone(fresh=not ok):  # not the limiter's fault
                raise owner.ended(
                    f"{what} (after {waited:.3g} s of rate-limiter wait)",
                    f"no {what} can be admitted any more",
                )
            if not ok:
                raise TimeoutError(
                    f"{what} waited {waited:.3g} s (timeout={timeout if given is None else given}): "
                    f"{explain(self.counters)}"
                )

    def await_insert(self, timeout: float | None, given: float | None = None) -> None:
        """Block until one step may be inserted.

        ``given``: the timeout the caller's user gave (quoted by the ``TimeoutError``; default
        ``timeout``), when ``timeout`` is what is left of it.

        Raises
        ------
        TimeoutError
            Not admitted within ``timeout`` seconds (the message says why).
        ValueError
            The limiter was cancelled (the store closed).
        """
        self._wait(
            lambda: self.limiter.can_insert(self.counters),
            timeout,
            self.limiter.explain_insert_block,
            "insert",
            given,
        )

    def await_sample(
        self, timeout: float | None | Callable[[], float | None], given: float | None = None, need: int = 1
    ) -> None:
        """Block until one step may be sampled and the store holds at least ``need`` sampleable items.

        ``timeout``: seconds, None (no limit), or a function giving the seconds left (such as
        `replay.sampler.Deadline`), called only when the sample is not admitted at once (an admitted one
        reads no clock).

        ``given``: the timeout the caller's user gave (quoted by the ``TimeoutError``; default
        ``timeout``), when ``timeout`` is what is left of it. ``need`` > 1 is for a table whose
        ``max_times_sampled`` removes what it draws: a batch waits until it can be drawn whole, so a
        timeout never drops items that were drawn (and removed) for a batch that is not returned.

        An admissible sample returns without taking the condition variable: the counters are read
        once, in index order (inserts first), with no lock. Between restores inserts, samples and
        deletes only grow, and admission grows with inserts and shrinks with the other two, so counts
        read after the inserts can only make the check stricter: an admitted read was admissible at
        the instant the inserts were read, as under the lock (which is released before the caller
        draws anyway). Anything else (blocked, cancelled) takes the locked wait, unchanged.

        Raises
        ------
        TimeoutError
            Not admitted within ``timeout`` seconds: below ``min_size``, or samples ahead of inserts.
        ValueError
            The limiter was cancelled (the store closed).
        """
        counts = self._read_counts()  # inserts, samples, deletes, cancelled: read in index order
        if not counts[CANCELLED] and self.limiter.can_sample(counts) and counts[0] - counts[2] >= need:
            return

        def explain(c: Sequence[int]) -> str:
            size = int(c[0]) - int(c[2])
            if self.limiter.can_sample(c) and size < need:
                return (f"the store holds {size} sampleable items and this batch needs {need} "
                        "(max_times_sampled removes what it draws): insert more steps")
            return self.limiter.explain_sample_block(c)

        if callable(timeout):
            timeout = timeout()
        self._wait(
            lambda: self.limiter.can_sample(self.counters) and self.counters[0] - self.counters[2] >= need,
            timeout,
            explain,
            "sample",
            given,
        )

    # -- counting
    def _add(self, index: int, n: int) -> None:
        with self.cond:
            self.counters[index] += int(n)
            self.cond.notify_all()

    def insert(self, n: int) -> None:
        """Count ``n`` inserted steps and wake waiters."""
        self._add(INSERTS, n)

    def sample(self, n: int) -> None:
        """Count ``n`` sampled (real) steps and wake waiters."""
        self._add(SAMPLES, n)

    def delete(self, n: int) -> None:
        """Count ``n`` deleted items (overwritten or exhausted; negative corrects an over-count)."""
        self._add(DELETES, n)

    def cancel(self) -> None:
        """Wake every waiter with ``ValueError`` (the store is closing)."""
        self._add(CANCELLED, 1)

    @property
    def size(self) -> int:
        """Items that can be drawn: inserts - deletes."""
        return int(self.counters[INSERTS] - self.counters[DELETES])

    def state(self) -> dict[str, int]:
        """Counters for checkpoints: inserts, samples, deletes."""
        with self.cond:
            return {
                "inserts": int(self.counters[INSERTS]),
                "samples": int(self.counters[SAMPLES]),
                "deletes": int(self.counters[DELETES]),
            }

    def load_state(self, state: dict[str, int]) -> None:
        """Set the counters from `state` and wake waiters."""
        with self.cond:
            self.counters[INSERTS] = int(state["inserts"])
            self.counters[SAMPLES] = int(state["samples"])
            self.counters[DELETES] = int(state["deletes"])
            self.cond.notify_all()
