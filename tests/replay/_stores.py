"""Test data shared by the replay tests that check a sampled row against its position.

``SPEC`` is a four-field trajectory (int64 ``pos``, float32 ``obs`` [3], int16 ``tag``, bool
``done``); ``steps(start, n)`` gives ``n`` steps whose every field is a function of ``pos``, so a
torn, shifted or mixed-up row in a sample would not match its ``pos``. Import it from a test file in
``tests/replay`` as ``from _stores import SPEC, steps``.
"""

from __future__ import annotations

import numpy as np

from replay import TrajectorySpec

SPEC = TrajectorySpec(
    {"pos": ((), "int64"), "obs": ((3,), "float32"), "tag": ((), "int16"), "done": ((), "bool")}
)


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    """``n`` steps from position ``start``: ``pos`` int64 [n], ``obs`` float32 [n, 3] (``pos * 10 + j``),
    ``tag`` int16 [n] (``pos % 30000``), ``done`` bool [n] (``pos % 3 == 0``)."""
    p = np.arange(start, start + n, dtype=np.int64)
    return {
        "pos": p,
        "obs": (p[:, None] * 10 + np.arange(3)).astype(np.float32),
        "tag": (p % 30000).astype(np.int16),
        "done": p % 3 == 0,
    }
