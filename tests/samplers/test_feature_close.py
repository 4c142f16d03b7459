"""FeatureStore.close drops the store's references to its table, cache and staging regions, so a closed
store that is still referenced leaves its blocks to the pool: the next store fits the same budget. A
tensor the caller keeps holds its block; the budget error then names the pool's live blocks first."""

from __future__ import annotations

import gc

import pytest
import torch

from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers.features import FeatureStore

ROWS, COLS = 1000, 1000  # a 4,000,000-byte float32 table: two do not fit a 6 MiB budget


def budgeted() -> MemoryManager:
    return MemoryManager(budgets={"device": "6MiB", "pinned": "1MiB", "host": "1KiB", "shared": "1KiB"})


def test_a_closed_store_still_referenced_leaves_room_for_the_next():
    x = torch.randn(ROWS, COLS)
    ids = torch.tensor([5, 999, 0, 5])
    with budgeted() as mm:
        first = FeatureStore(x, memory=mm)
        assert first.table_tier == "device"
        assert torch.equal(first.gather(ids), x[ids])
        first.close()
        assert first.table is None
        assert sum(u["used"] for u in mm.usage().values()) == 0
        stats = first.stats()  # statistics stay readable
        assert stats["rows"] == ROWS and stats["row_bytes"] == 4 * COLS and stats["gathered_rows"] == 4
        second = FeatureStore(x, memory=mm)  # `first` is alive: its blocks went back to the pool
        assert torch.equal(second.gather(ids), x[ids])
        second.close()
        with pytest.raises(ValueError, match="closed"):
            first.gather(ids)


def test_a_kept_table_holds_its_block_and_the_error_says_so_first():
    x = torch.randn(ROWS, COLS)
    with budgeted() as mm:
        store = FeatureStore(x, memory=mm)
        kept = store.table  # the caller's view of the table region, kept past close
        store.close()
        assert sum(u["used"] for u in mm.usage().values()) == 0  # not counted, but still allocated
        assert torch.equal(kept, x)
        with pytest.raises(MemoryBudgetError) as info:
            FeatureStore(x, memory=mm)
        message = str(info.value)
        assert message.startswith("allocator failed:") and "live blocks" in message
        assert message.index("live blocks") < message.index("asked for")
        del kept
        gc.collect()
        again = FeatureStore(x, memory=mm)  # the view is gone: the block is free again
        assert torch.equal(again.gather(torch.tensor([3])), x[3:4])
        again.close()
