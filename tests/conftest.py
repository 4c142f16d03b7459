"""Shared fixtures. GRAPHRL_DATA defaults to ../shared/data (relative to the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("GRAPHRL_DATA", str(REPO.parent / "shared" / "data"))
DATA = Path(os.environ["GRAPHRL_DATA"])


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
