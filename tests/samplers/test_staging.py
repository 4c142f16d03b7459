"""RowStaging: leases of reusable staging buffers that grow with the batch, and buffers of their own while
kept leases hold every slot."""

from __future__ import annotations

import pytest
import torch

from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers.staging import RowStaging


def test_row_staging_grows_and_frees_old_pools_when_released(mm):
    staging = RowStaging(mm, (4,), torch.float32, slots=2, owner="t.staging")
    first = staging.acquire(10)
    assert staging.capacity == 10 and first.tensor.shape == (10, 4)
    bigger = staging.acquire(11)  # needs a larger pool: 1.25 x 10 rounded up = 13 rows
    assert staging.capacity == 13 and bigger.tensor.shape == (11, 4)
    assert mm.stats()["pinned"]["t.staging"]["regions"] == 2  # the old pool lives while leased
    first.release()
    first.release()  # idempotent
    assert mm.stats()["pinned"]["t.staging"]["regions"] == 1
    bigger.release()
    staging.close()
    assert mm.stats()["pinned"]["t.staging"]["bytes"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_kept_lease_makes_the_next_one_a_buffer_of_its_own_freed_with_its_last_tensor(mm, dtype):
    staging = RowStaging(mm, (3,), dtype, slots=1, owner="t.staging")
    first = staging.acquire(4)
    kept = first.tensor[1:3]  # a view the user keeps
    kept.copy_(torch.arange(6).reshape(2, 3).to(dtype))
    first.release_when_unused()
    first.release_when_unused()  # idempotent
    del first
    second = staging.acquire(3)  # the only slot is viewed by `kept`: never handed out, no wait
    assert second.own_buffer and second.tensor.shape == (3, 3) and second.tensor.dtype == dtype
    assert staging.own_buffers == 1 and regions(mm) == 2
    second.tensor.fill_(7)
    assert torch.equal(kept, torch.arange(6).reshape(2, 3).to(dtype))
    view = second.tensor[1:]
    second.release_when_unused()
    del second
    assert staging.own_buffers == 1  # `view` holds it
    del view
    assert staging.own_buffers == 0 and regions(mm) == 1  # freed with its last tensor, no call needed
    third = staging.acquire(2)  # `kept` still holds the slot
    assert third.own_buffer
    third.release()  # the user's word: freed at once though its tensor lives
    assert staging.own_buffers == 0 and regions(mm) == 1 and third.tensor.shape == (2, 3)
    del kept
    fourth = staging.acquire(2)  # nothing views the slot now: the pool's buffer again
    assert not fourth.own_buffer
    fourth.release()
    staging.close()
    assert regions(mm) == 0


def test_buffers_of_their_own_are_counted_against_the_budget():
    with MemoryManager(budgets={"pinned": 2 * (2 * 4 * 4), "host": 0}, device="cpu") as mm:
        staging = RowStaging(mm, (4,), torch.float32, slots=1, owner="t.staging")
        first = staging.acquire(2)
        kept = first.tensor
        first.release_when_unused()
        second = staging.acquire(2)  # the budget's other 32 bytes (the pool holds the first 32)
        assert second.own_buffer
        with pytest.raises(MemoryBudgetError, match="kept past the next batch"):
            staging.acquire(2)
        second.release()
        del second  # its tensor viewed the block: the pool reuses no block a tensor still views
        third = staging.acquire(2)  # the freed bytes serve the next one
        assert third.own_buffer and kept.shape == (2, 4)
        third.release()
        staging.close()


def regions(mm: MemoryManager) -> int:
    return len(mm.regions(owner="t.staging"))
