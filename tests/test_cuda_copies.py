"""The simulator read-back counter of the GPU tests (`tests/_cuda_copies.py`), checked under numba's CUDA
simulator in a subprocess: copies and scalar reads on the main thread count, views, reads from other
threads (the simulated kernels') and blocks' conversion to tensors do not; a second wrapping is refused."""

from __future__ import annotations

import textwrap

import pytest
from _cuda_copies import count_host_copies
from numba import config

SCRIPT = textwrap.dedent(
    """
    import sys
    import threading
    import numpy as np
    from numba import cuda
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies
    import samplers.layers as layers

    copies = count_host_copies()
    d = cuda.to_device(np.arange(5, dtype=np.int64))
    assert copies.readbacks == 0, copies.seen
    assert d.copy_to_host().tolist() == [0, 1, 2, 3, 4] and d[3] == 3
    view = d[1:3]  # a device view: no read
    assert copies.readbacks == 2, copies.seen
    other = threading.Thread(target=lambda: (d.copy_to_host(), d[0]))
    other.start()
    other.join()
    assert layers.cuda_to_torch(view).tolist() == [1, 2]
    assert copies.readbacks == 2, copies.seen
    counted = copies.counting("alloc", cuda.device_array)
    counted(3, np.int64)
    assert copies.seen == {"readback": 2, "alloc": 1}, copies.seen
    copies.clear()
    assert copies.readbacks == 0 and not copies.seen
    try:
        count_host_copies()
    except RuntimeError as e:
        assert "already called" in str(e), e
    else:
        raise AssertionError("a second wrapping was accepted")
    d.copy_to_host()
    assert copies.readbacks == 1, copies.seen  # still counted once
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT, patches=True, timeout=120)
def test_counts_host_copies_and_scalar_reads_only(simulated_part) -> None:
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


@pytest.mark.skipif(bool(config.ENABLE_CUDASIM), reason="this process runs under the simulator")
def test_refuses_to_count_outside_the_simulator() -> None:
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM=1"):
        count_host_copies()
