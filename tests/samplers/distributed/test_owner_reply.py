"""An owner's int32 reply written in place by the kernel (uniform loops) equals the packed fresh draws.

`PartitionOwner.sample_rows` samples a uniform loop's K batches with one set-up
(`samplers.distributed.core.sample_owned_segments`), each batch's draws written into its part of the
reply: low-degree rows, hubs, then low-degree rows again (two batches a request, keys far apart), each
reply equal to `pack_reply` of `sample_owned_rows` batch by batch.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.datasets import synthetic_graph
from graphrl.partition import write_partitions
from samplers.distributed.assemble import pack_reply
from samplers.distributed.core import owner_loop, sample_owned_rows, sample_owned_segments
from samplers.distributed.owner import PartitionOwner

N, E = 400, 6000


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parts")
    write_partitions(synthetic_graph(N, E, "powerlaw", seed=5), folder, 2, method="ldg")
    return PartitionOwner(str(folder), 0, threads=1)


@pytest.mark.parametrize(("fanout", "replace"), [(3, False), (-1, False), (4, True)])
def test_the_reply_equals_the_packed_draws(owner, fanout, replace):
    p = owner.partition
    deg = np.diff(p.indptr)
    low, hubs = p.owned[np.argsort(deg, kind="stable")[:30]], p.owned[np.argsort(-deg, kind="stable")[:30]]
    assert deg.max() > 3 * max(deg.min(), 1)
    for rows in (low, hubs, low):
        dst = np.concatenate([rows, rows[::-1]])
        bounds = np.array([0, rows.shape[0], dst.shape[0]], dtype=np.int64)
        keys = np.array([11, 2**63 + 5], dtype=np.uint64)
        got, weights = owner.sample_rows(dst.astype(np.int32), bounds, fanout, replace, keys, False)
        loop = owner_loop(owner.indptr, p.indices, p.edge_ids, p.num_nodes, None, replace)
        want = pack_reply([sample_owned_rows(loop, dst[bounds[b]:bounds[b + 1]], fanout, int(keys[b]),
                                             int(keys[b]), 1) for b in range(2)], False)
        assert weights is None and got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_only_uniform_loops_are_written_in_place(owner):
    p = owner.partition
    loop = owner_loop(owner.indptr, p.indices, p.edge_ids, p.num_nodes, None, False, "labor")
    with pytest.raises(ValueError, match="uniform loops; got a labor loop"):
        sample_owned_segments(loop, p.owned[:3], np.array([0, 3]), 2, np.array([1], dtype=np.uint64), 1, list)
