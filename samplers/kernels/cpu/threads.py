"""Chunks of work run by the caller and `graphrl.kernels.parallel_for`'s helper threads."""

from __future__ import annotations

from collections.abc import Callable

from graphrl.kernels import parallel_for

__all__ = ["parallel_chunks"]


def parallel_chunks(fn: Callable[[int], None], num_chunks: int, helpers: int) -> None:
    """`graphrl.kernels.parallel_for` with ``helpers`` threads besides the caller."""
    parallel_for(fn, num_chunks, helpers + 1)
