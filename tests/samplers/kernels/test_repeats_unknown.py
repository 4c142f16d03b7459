"""Unknown repeats (`samplers.kernels.cuda.layer.DeviceRows.repeats` None) size a chained fanout -1 layer by
its rows' degrees, not as distinct rows: `full_capacity` takes None for unknown and 0 for distinct rows, and
its callers pass the rows' value as it is (a 0 in place of None capped four repeats of a node of degree 7 at
the graph's 12 edges, an overflow). Under numba's CUDA simulator in a subprocess."""

from __future__ import annotations

import textwrap

import pytest

SIM_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import config, cuda
    assert config.ENABLE_CUDASIM
    from samplers.kernels.cuda.bounded import DegreeBound, full_capacity, sample_edges_bounded
    from samplers.kernels.cuda.graph import CudaGraph
    from samplers.kernels.cuda.layer import DeviceRows
    from samplers.kernels.cuda.workspace import CudaWorkspace

    indptr = np.array([0, 3, 3, 10, 12], np.int64)  # in-degrees 3, 0, 7, 2: 12 edges
    indices = np.array([1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0, 3], np.int32)
    degrees = DegreeBound.of(indptr)
    graph = CudaGraph.build(indptr, indices)
    for repeats, room in ((None, 28), (3, 12 + 3 * 7)):  # unknown: 4 rows x 7; known: E + 3 x 7
        assert full_capacity(4, degrees, True, repeats=repeats) == min(room, 28)
        chain = cuda.to_device(np.array([4, 0, 0, 0], np.int64))
        rows = DeviceRows(cuda.to_device(np.full(4, 2, np.int64)), chain, 0, repeats=repeats)
        got = sample_edges_bounded(graph, rows, -1, False, 0, False, None, CudaWorkspace(), degrees=degrees)
        nnz = int(got.nnz.copy_to_host()[0])
        assert nnz == 28 and got.eids.shape[0] >= 28, (repeats, nnz, got.eids.shape)
        assert sorted(got.eids.copy_to_host()[:28].tolist()) == sorted(list(range(3, 10)) * 4), repeats
    print("OK")
    """
)


@pytest.mark.simulated(SIM_SCRIPT)
def test_unknown_repeats_size_by_the_degrees(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output
