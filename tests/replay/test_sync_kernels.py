"""`replay.sync_kernels`' int64 atomics: `compare_exchange` swaps only on a match and returns the old
value; `fetch_add` adds; both refuse at typing an array whose items are not int64 (read and written as
8 bytes, an int32 array's item 1 would take items 1 and 2)."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from numba.core.errors import TypingError

from replay._sync import futex_syscall
from replay.sync_kernels import compare_exchange, fetch_add, futex_wait, futex_wake


@nb.njit
def _cas(arr, i, expected, new):
    return compare_exchange(arr, i, expected, new)


@nb.njit
def _add(arr, i, v):
    return fetch_add(arr, i, v)


def test_compare_exchange_swaps_only_on_a_match():
    a = np.array([5, 7, 9], dtype=np.int64)
    assert _cas(a, 1, 6, 100) == 7 and a.tolist() == [5, 7, 9]  # no match: unchanged
    assert _cas(a, 1, 7, 1 << 40) == 7 and a.tolist() == [5, 1 << 40, 9]
    assert _add(a, 2, -4) == 9 and _add(a, 2, 0) == 5 and a.tolist() == [5, 1 << 40, 5]


@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint64])
def test_the_atomics_refuse_other_item_types(dtype):
    a = np.zeros(4, dtype=dtype)
    for call in (lambda: _cas(a, 1, 0, 1), lambda: _add(a, 1, 1)):
        with pytest.raises(TypingError):
            call()
    assert (a == 0).all()


@pytest.mark.parametrize(
    "machine,byteorder,number",
    [("x86_64", "little", 202), ("aarch64", "little", 98), ("riscv64", "little", None),
     ("x86_64", "big", None), ("s390x", "big", None), ("ppc64le", "little", None)],
)
def test_the_futex_number_is_known_only_for_little_endian_x86_64_and_aarch64(machine, byteorder, number):
    assert futex_syscall(machine, byteorder) == number


@nb.njit
def _wait_wake(arr, expected, n):
    addr = arr.ctypes.data
    return futex_wait(addr, expected), futex_wake(addr, n)


def test_futex_wait_returns_at_once_on_a_changed_word_and_wake_counts_none_woken():
    a = np.array([7, 0], dtype=np.int64)
    assert _wait_wake(a, 6, 5) == (-1, 0)  # the word holds 7, not 6: EAGAIN; nobody sleeps: 0 woken
