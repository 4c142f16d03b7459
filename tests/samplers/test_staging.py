"""RowStaging: leases of reusable staging buffers that grow with the batch."""

from __future__ import annotations

import torch

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
