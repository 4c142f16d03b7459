"""The replay benchmarks' workload: two step layouts and episodes of random lengths in [64, 512].

``small``: obs of 4 float32, action int64, reward float32, done bool (29 bytes a step); ``image``: obs
3x64x64 uint8 plus the same scalars (12301 bytes a step). `spec_for` gives a layout's
`replay.TrajectorySpec`; `make_episodes` makes episodes of it (random values, the last step of each done)
that hold ``steps`` steps. ``benchmarks/replay.py``, ``replay_learners.py`` and ``replay_per_call.py``
write them.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported as
``_replay_workload``, after the script has imported the ``replay`` package (see `_report`).

>>> spec = spec_for("small")
>>> sum(len(ep["obs"]) for ep in make_episodes(spec, 1000))
1000
"""

from __future__ import annotations

import numpy as np

from replay import TrajectorySpec

__all__ = ["LAYOUTS", "make_episodes", "spec_for"]

LAYOUTS = {"small": (4,), "image": (3, 64, 64)}  # obs shape of each layout


def spec_for(layout: str) -> TrajectorySpec:
    """The step layout ``layout`` (``"small"``: float32 obs; ``"image"``: uint8 obs) with action int64,
    reward float32 and done bool.

    Raises
    ------
    KeyError
        ``layout`` is neither ``"small"`` nor ``"image"``.
    """
    obs_dtype = "float32" if layout == "small" else "uint8"
    return TrajectorySpec(
        {"obs": (LAYOUTS[layout], obs_dtype), "action": ((), "int64"), "reward": ((), "float32"),
         "done": ((), "bool")}
    )


def make_episodes(spec: TrajectorySpec, steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Episodes of ``spec`` of random lengths in [64, 512] (the last shorter where fewer steps are left),
    ``steps`` steps in all: uint8 fields random bytes, bool fields False but the last step, others standard
    normal values cast to their dtype. The same ``seed`` gives the same episodes."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, np.ndarray]] = []
    total = 0
    while total < steps:
        n = int(min(rng.integers(64, 513), steps - total))
        ep: dict[str, np.ndarray] = {}
        for name, f in spec.items():
            if f.dtype == np.uint8:
                ep[name] = rng.integers(0, 256, (n, *f.shape), dtype=np.uint8)
            elif f.dtype == np.bool_:
                ep[name] = np.zeros((n, *f.shape), dtype=bool)
                ep[name][-1] = True
            else:
                ep[name] = rng.standard_normal((n, *f.shape)).astype(f.dtype)
        out.append(ep)
        total += n
    return out
