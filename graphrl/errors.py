"""Exception types the packages share, defined once in the core (docs/architecture.md#errors).

`GPUUnavailableError`: a GPU was asked for (``device="cuda"``) where none can run the work. It is both a
``RuntimeError`` and a ``ValueError``, so code written against either of the types the engines raised
for this failure before keeps catching it.

>>> from graphrl import GPUUnavailableError
>>> try:
...     NeighborSampler(graph, [10], device="cuda")
... except GPUUnavailableError as err:  # the message names the argument and the remedy
...     sampler = NeighborSampler(graph, [10], device="cpu")
"""

from __future__ import annotations

__all__ = ["GPUUnavailableError"]


class GPUUnavailableError(RuntimeError, ValueError):
    """``device="cuda"`` (or another GPU argument) where no usable GPU is present.

    Raised at the public boundary by every engine (samplers, feature stores, replay stores) with a
    message that names the argument and its value (``device='cuda'``) and the remedy (``device='cpu'``).
    A subclass of both ``RuntimeError`` and ``ValueError``: ``except RuntimeError`` and
    ``except ValueError`` both catch it.
    """
