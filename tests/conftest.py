"""Shared fixtures. GRAPHRL_DATA defaults to ../shared/data (relative to the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("GRAPHRL_DATA", str(REPO.parent / "shared" / "data"))
DATA = Path(os.environ["GRAPHRL_DATA"])


# Run before each simulated script: the simulator iterates a device function's module globals in every
# simulated thread at every call, and a warning's first appearance in a module (the RNG's uint64 wrap-around)
# adds ``__warningregistry__`` to them meanwhile ("dictionary changed size during iteration"): every module
# loaded from source gets its registry before it runs. (A 20-us switch interval halved the simulated tests'
# CPU time but let two of them see CPU != CUDA results once in three clean runs: the default interval is kept
# until that is understood.)
SIMULATOR_PRELUDE = """
import importlib.abc
import importlib.machinery
import sys


class _RegistryFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                    run = spec.loader.exec_module

                    def exec_module(module, run=run):
                        module.__dict__.setdefault("__warningregistry__", {})
                        run(module)

                    spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _RegistryFirst())
"""


def _simulate(script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", SIMULATOR_PRELUDE + script], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def simulate():
    """``simulate(script, timeout=600)``: run a Python script in a fresh interpreter under numba's CUDA
    simulator (``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is imported), with the repository on
    ``PYTHONPATH`` and the repository root as working folder; returns the ``subprocess.CompletedProcess``
    (text output captured)."""
    return _simulate


def _compile_ptx(script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception:  # noqa: BLE001 - any failure means no libNVVM to compile with
        pytest.skip("libNVVM not found: cannot compile numba.cuda kernels to PTX here")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def compile_ptx():
    """``compile_ptx(script, timeout=600)``: run a script that compiles numba.cuda kernels to PTX (no GPU
    needed, libNVVM is) in a fresh interpreter without the simulator; skips the test where libNVVM is absent.
    Returns the ``subprocess.CompletedProcess``."""
    return _compile_ptx


def _need(sub: str) -> Path:
    path = DATA / sub
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}: set GRAPHRL_DATA to the shared data folder")
    return path


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real-data folder; tests using it skip with a reason when it is absent (CI always has it)."""
    _need("")
    return DATA


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``gpu`` where torch finds no CUDA, with the reason said once (the count is in
    pytest's short summary: ``SKIPPED [N] ... no CUDA device``)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # here, not at import: collecting a test file must not depend on torch's CUDA state

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: no CUDA device here (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def tiny_gowalla(tmp_path) -> Path:
    """A data folder with a tiny Gowalla-format set (40 users, 30 items), for CLI runs that must be quick."""
    import numpy as np

    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    folder = root / "gowalla"
    folder.mkdir(parents=True)
    rows = [(u, rng.choice(30, size=8, replace=False)) for u in range(40)]
    (folder / "train.txt").write_text("".join(" ".join(map(str, [u, *i[:6]])) + "\n" for u, i in rows))
    (folder / "test.txt").write_text("".join(" ".join(map(str, [u, *i[6:]])) + "\n" for u, i in rows))
    return root
