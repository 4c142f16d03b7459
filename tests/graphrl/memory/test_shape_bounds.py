"""Integer arguments of the memory manager that reach torch or numpy as machine integers are range-checked
at the boundary: dimensions, number of dimensions, the byte span of a shape (sizes of 0 included); a freed
region refuses every use, its handle included."""

from __future__ import annotations

import pytest

from graphrl.memory.sizes import MAX_DIMS, parse_shape


@pytest.mark.parametrize("tier", ["host", "shared", "pinned", "device"])
@pytest.mark.parametrize(("shape", "match"), [
    ((0, 2**63), r"spans 9223372036854775808 bytes"),
    ((0, 2**70), r"spans \d+ bytes \(sizes of 0 counted as 1\)"),
    ((0, 2**61), r"of 4-byte items spans 9223372036854775808 bytes"),
    ((0, 2**40, 2**40), r"more than a tensor can address"),
    ((1,) * 65, r"65 dimensions, more than the 64"),
], ids=["dim-2^63", "dim-2^70", "float32-span", "stride-overflow", "ndim-65"])
def test_allocate_refuses_shapes_torch_cannot_address(mm, tier, shape, match):
    with pytest.raises(ValueError, match=match):
        mm.allocate(shape, "float32", tier, owner="o")
    assert mm.regions() == []


def test_largest_addressable_shapes_still_parse(mm):
    assert parse_shape((0, 2**63 - 1)) == (0, 2**63 - 1)
    assert parse_shape((1,) * MAX_DIMS) == (1,) * MAX_DIMS
    r = mm.allocate((0, 2**60), "float32", "host", owner="o")  # empty, span 2**62 bytes: fine
    assert r.nbytes == 0 and tuple(r.tensor().shape) == (0, 2**60)
    r.free()


def test_a_freed_shared_region_gives_no_handle(mm):
    import pickle

    r = mm.allocate(4, "int64", "shared", owner="o")
    r.free()
    with pytest.raises(ValueError, match="was freed; it cannot be used"):
        r.handle()
    with pytest.raises(ValueError, match="was freed"):
        pickle.dumps(r)
