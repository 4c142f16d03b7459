"""The splitmix stream written once (`samplers.kernels.rng`): its plain-Python functions and their CPU
compilation give the reference's numbers bit for bit (the GPU compilation is checked against the CPU
kernels under the simulator, tests/samplers/test_sampler_cuda_sim.py)."""

from __future__ import annotations

import warnings

import numpy as np

from samplers.kernels import reference as ref
from samplers.kernels import rng
from samplers.kernels.cpu import rng as cpu_rng

KEYS = [0, 1, ref.layer_key(7, 3, 2), 2**64 - 1]
NODES = [0, 5, 2**31 - 1, 2**40 + 3]


def _expected(key: int, node: int, t: int, n: int) -> tuple[int, int, int, float, float]:
    state0 = ref.mix(key ^ ((node * ref.GOLDEN) & ref.MASK64))
    r = ref.mix((state0 + t * ref.GOLDEN) & ref.MASK64)
    return state0, r, (r * n) >> 64, (r >> 11) * 2.0**-53, ((r >> 11) + 1) * 2.0**-53


def test_plain_and_cpu_compiled_streams_equal_the_reference():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around (plain Python)
        for impl in (rng, cpu_rng):
            for key in KEYS:
                for node in NODES:
                    for t, n in ((1, 7), (2, 64), (15, 10**6), (3, 2**40), (9, 2**63 + 5)):
                        state0, r, b, u, uo = _expected(key, node, t, n)
                        got0 = impl.row_state(np.uint64(key), np.int64(node))
                        got = np.uint64(impl.draw(np.uint64(got0), t))  # numba returns a Python int
                        assert int(got0) == state0 and int(got) == r
                        assert int(impl.bounded(got, np.uint64(n))) == b < n
                        assert impl.unit(got) == u and impl.unit_open(got) == uo
                        assert int(impl.mix(np.uint64(key))) == ref.mix(key)


def test_compile_for_binds_each_target_to_its_own_compiled_functions():
    calls = []

    def jit(fn):
        calls.append(fn.__name__)
        return fn

    compiled = rng.compile_for(jit)
    assert calls == [f.__name__ for f in rng.FUNCTIONS]
    assert compiled.draw.__globals__["mix"] is compiled.mix  # the copy calls the target's compiled mix
    assert rng.draw.__globals__["mix"] is rng.mix  # the plain functions stay plain
