"""Helpers of the GPU samplers' memory-tier scripts (``tests/samplers/test_cuda_tiers*.py``): a manager whose
device tier is where the device is (CUDA on a GPU, the host under numba's CUDA simulator), the regions alive
per tier and owner, and the budget error a build must raise. For scripts that tests run under the simulator
(the ``simulated`` mark of ``tests/conftest.py``, from the repository root) or exec on a real GPU::

    import sys
    sys.path.insert(0, "tests")
    from _cuda_tiers import DEVICE, budget_error, manager, tiers
"""

from __future__ import annotations

from collections.abc import Callable

from graphrl import cuda as gcuda
from graphrl.memory import MemoryBudgetError, MemoryManager

DEVICE = "cuda" if gcuda.has_cuda() else "cpu"  # where the manager's device tier must be


def manager(**budgets: int) -> MemoryManager:
    """A `MemoryManager` on `DEVICE` with these per-tier ``budgets`` (bytes; none: no budgets)."""
    return MemoryManager(device=DEVICE, budgets=budgets or None)


def tiers(mm: MemoryManager) -> dict[tuple[str, str], tuple[int, int]]:
    """``{(tier, owner): (bytes, regions)}`` of the regions alive now in ``mm``."""
    out = {}
    for tier, owners in mm.stats().items():
        if tier == "pools" or not isinstance(owners, dict):
            continue
        for owner, st in owners.items():
            if isinstance(st, dict) and st.get("regions"):
                out[(tier, owner)] = (st["bytes"], st["regions"])
    return out


def budget_error(build: Callable[[], object], tier: str, owner: str) -> MemoryBudgetError:
    """The `MemoryBudgetError` ``build()`` raises, checked to name ``tier`` and ``owner`` (its attributes and
    its message). Raises AssertionError if ``build`` raises none or names another tier or owner."""
    try:
        build()
    except MemoryBudgetError as err:
        assert str(err.tier) == tier and err.owner == owner, (err.tier, err.owner, str(err))
        assert f"tier '{tier}'" in str(err) and repr(owner) in str(err), str(err)
        return err
    raise AssertionError(f"no MemoryBudgetError for {owner} on {tier}")
