"""StepStager: validate steps through a spec and stage them in ``chunk_steps`` rows of numpy columns.

The staging half both writers share: `replay.writer.TrajectoryWriter` (commits to the local store's
shards) and `replay.distributed.writer.RayTrajectoryWriter` (ships columns to a shard actor). A stager
owns no memory: the writer hands it one buffer per field, ``[chunk_steps, *field_shape]`` (a
memory-manager region, a plain numpy array), and a callback ``on_full(columns, count)`` that takes
the staged rows away when a step arrives and every row is taken. After the callback returns, the
rows are free (``pending`` is 0); if it raises, the steps stay staged (a retry sends them again).

- ``append(step)`` validates one step (`replay.spec.TrajectorySpec.validate_step`) and writes its row;
- ``extend(steps)`` validates columns ``[T, ...]`` and copies them in runs of rows: exactly the rows,
  calls of ``on_full`` and chunk boundaries that T appends give;
- ``hand_off(send)`` gives the staged rows to ``send(columns, count)`` (an episode's end, a flush),
  with the same rule as ``on_full``; a callback that may raise after it took the rows calls `clear`
  first.

>>> stager = StepStager(spec, {n: np.empty((64, *f.shape), f.dtype) for n, f in spec.items()}, commit)
>>> stager.append(step); stager.hand_off(commit)   # commit(columns, count): rows [:count] are the steps

References
----------
DeepMind Reverb's ``TrajectoryWriter`` (steps buffered per column, sent in chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from replay.spec import TrajectorySpec

__all__ = ["Send", "StepStager"]

Send = Callable[[dict[str, np.ndarray], int], None]
"""``send(columns, count)``: the buffers (``[chunk_steps, *field_shape]`` each) and the staged rows."""


class StepStager:
    """Steps of one writer staged in rows of per-field numpy buffers; see the module docstring.

    Parameters
    ----------
    spec : TrajectorySpec
        The fields of a step (steps are validated against it).
    columns : dict of str to numpy.ndarray
        One buffer per field of ``spec``, ``[chunk_steps, *field_shape]`` of the field's dtype.
    on_full : callable
        ``on_full(columns, count)``, called with ``count == chunk_steps`` before a step that finds
        every row taken.

    Attributes
    ----------
    pending : int
        Rows staged (0 <= pending <= chunk_steps).
    chunk_steps : int
        Rows of each buffer.
    """

    __slots__ = ("chunk_steps", "columns", "on_full", "pending", "spec")

    def __init__(self, spec: TrajectorySpec, columns: dict[str, np.ndarray], on_full: Send) -> None:
        self.spec = spec
        self.columns = columns
        self.chunk_steps = int(next(iter(columns.values())).shape[0])
        self.on_full = on_full
        self.pending = 0

    def append(self, step: Mapping[str, Any]) -> None:
        """Validate one step and stage it (calling ``on_full`` first if every row is taken).

        Raises
        ------
        ValueError, TypeError
            As `replay.spec.TrajectorySpec.validate_step` (the step is not staged); whatever
            ``on_full`` raises (the staged steps stay).
        """
        values = self.spec.validate_step(step)
        if self.pending == self.chunk_steps:
            self.hand_off(self.on_full)
        row = self.pending
        columns = self.columns
        for name, v in values.items():
            columns[name][row] = v
        self.pending = row + 1

    def extend(self, steps: Mapping[str, Any]) -> None:
        """Validate T steps given as columns ``[T, *field_shape]`` and stage them: same as T appends.

        Raises
        ------
        ValueError, TypeError
            As `replay.spec.TrajectorySpec.validate_steps` (nothing of the call is staged); whatever
            ``on_full`` raises (the steps up to it are staged or sent, the rest are not).
        """
        t, cols = self.spec.validate_steps(steps)
        done = 0
        while done < t:
            if self.pending == self.chunk_steps:
                self.hand_off(self.on_full)
            k = min(self.chunk_steps - self.pending, t - done)
            for name, col in cols.items():
                self.columns[name][self.pending : self.pending + k] = col[done : done + k]
            self.pending += k
            done += k

    def hand_off(self, send: Send) -> None:
        """``send(columns, pending)``, then free the rows; if ``send`` raises, the steps stay staged."""
        send(self.columns, self.pending)
        self.pending = 0

    def hand_off_with(self, step: Mapping[str, Any], send: Send) -> None:
        """`append` ``step`` as the last staged step, then `hand_off` to ``send``; if ``send`` raises and
        leaves the rows staged (a rate limiter's timeout), ``step`` is unstaged again and the steps before
        it stay, so retrying the same call stages it once (`replay.writer.end_with_final`).

        Raises
        ------
        ValueError, TypeError
            As `append` (nothing staged); whatever ``on_full`` or ``send`` raises.
        """
        self.append(step)
        row = self.pending
        try:
            self.hand_off(send)
        except BaseException:
            if self.pending == row:  # still staged: drop ``step``, keep the steps before it
                self.pending = row - 1
            raise

    def clear(self) -> None:
        """Drop the staged steps (a writer's close, or a ``send`` that took the rows)."""
        self.pending = 0
