"""`AddressIndex`: which live region holds a memory address, the lookup behind `MemoryManager.tier_of`.

The manager adds every region that has an address (allocated or registered in place; not a disk
region, not an empty one) under a key of its choosing, removes it when the region is freed, and asks
`AddressIndex.tier_at` for the tier of a tensor's first byte. A view anywhere inside a region counts;
a buffer registered inside another region nests, and the innermost span (the one starting last at or
below the address) answers.

Spans are kept sorted by start, then by end descending (``bisect``), so that of spans starting at one
address the shorter, nested one comes later and answers first. An add or a remove is a binary search
and a list shift, a lookup a binary search and a walk down over the spans that start within the
longest span ever added below the address. Not thread-safe: the manager calls it under its lock.

>>> index = AddressIndex()
>>> index.add(key=1, start=4096, nbytes=1024, tier=Tier.PINNED)
>>> index.tier_at(4100), index.tier_at(5120)
(<Tier.PINNED: 'pinned'>, None)
"""

from __future__ import annotations

import bisect
import math

from graphrl.memory.sizes import Tier

__all__ = ["AddressIndex"]


class AddressIndex:
    """Address ranges of live regions, by start, with the tier of each."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int, int, Tier]] = []  # (start, -end, key, tier), sorted
        self._span_of: dict[int, tuple[int, int, int, Tier]] = {}
        self._longest = 0  # bytes of the longest span ever added (bounds the walk down)

    def add(self, key: int, start: int, nbytes: int, tier: Tier) -> None:
        """Index ``nbytes`` (> 0) from address ``start`` as ``tier``, under ``key`` (unique while live)."""
        span = (start, -(start + nbytes), key, tier)
        bisect.insort(self._spans, span)
        self._span_of[key] = span
        self._longest = max(self._longest, nbytes)

    def remove(self, key: int) -> None:
        """Forget the span added under ``key``; nothing if there is none."""
        span = self._span_of.pop(key, None)
        if span is not None:
            del self._spans[bisect.bisect_left(self._spans, span)]

    def tier_at(self, ptr: int) -> Tier | None:
        """The tier of the innermost span holding address ``ptr``, or None if no span holds it."""
        # the innermost span holding ptr: the one starting last at or below it, the shorter of two
        # starting at one address (a buffer registered inside a region nests); spans starting more
        # than the longest span below ptr cannot hold it
        i = bisect.bisect_right(self._spans, (ptr, math.inf)) - 1
        while i >= 0 and self._spans[i][0] >= ptr - self._longest:
            if ptr < -self._spans[i][1]:
                return self._spans[i][3]
            i -= 1
        return None

    def __len__(self) -> int:
        return len(self._spans)
