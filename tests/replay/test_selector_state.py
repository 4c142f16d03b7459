"""SelectorState: priority validation, initial priorities, exhausted items, state_dict round trip."""

from __future__ import annotations

import numpy as np
import pytest

from replay.selector_state import SelectorState
from replay.selectors import Prioritized, Uniform, check_priorities

FILL = [7, 30, 0, 50]  # items per shard: shards of different sizes, one empty


def filled(selector, max_times_sampled=0, seed=0, capacity=50):
    state = SelectorState(selector, len(FILL), capacity, max_times_sampled=max_times_sampled, seed=seed)
    seq = 0
    for s, n in enumerate(FILL):
        state.insert(s, np.arange(n), np.arange(seq, seq + n))
        seq += n
    return state


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0, -np.inf])
def test_bad_priorities_raise_and_change_nothing(bad):
    state = filled(Prioritized())
    state.update(1, np.arange(3), [1.0, 2.0, 3.0])
    before = state.state_dict()
    tree = state.wtree.copy()
    with pytest.raises(ValueError, match="NaN, infinite or negative"):
        state.update(1, np.arange(3), [4.0, bad, 5.0])
    after = state.state_dict()
    assert np.array_equal(before["priority"], after["priority"]) and np.array_equal(tree, state.wtree)
    assert before["max_priority"] == after["max_priority"]
    with pytest.raises(ValueError, match="expected 3 values"):
        check_priorities([1.0, 2.0], 3)


def test_new_items_get_the_max_priority_seen():
    state = SelectorState(Prioritized(), 1, 10, seed=0)
    state.insert(0, np.arange(2), np.arange(2))
    assert state.priority[0, 1] == 1.0
    state.update(0, [0], [7.5])
    state.insert(0, np.array([2]), np.array([2]))
    assert state.priority[0, 2] == 7.5
    fixed = SelectorState(Prioritized(initial_priority=0.25), 1, 10)
    fixed.insert(0, np.arange(3), np.arange(3))
    assert np.all(fixed.priority[0, :3] == 0.25)


def test_insert_reports_replaced_exhausted_items():
    state = filled(Uniform(), max_times_sampled=1)
    sh, sl, _, _ = state.sample(5)
    slots_in_shard3 = sl[sh == 3]
    replaced = state.insert(3, np.arange(50), np.arange(1000, 1050))
    assert replaced == len(slots_in_shard3)
    assert state.live_count(3) == 50


def test_same_seed_same_draws_and_state_round_trip():
    a, b = filled(Prioritized(), seed=11), filled(Prioritized(), seed=11)
    for s in (a, b):
        s.update(1, np.arange(30), np.linspace(0, 3, 30))
    assert all(np.array_equal(x, y) for x, y in zip(a.sample(64)[:3], b.sample(64)[:3], strict=True))
    saved = a.state_dict()
    first = a.sample(64)
    c = SelectorState(Prioritized(), len(FILL), 50, seed=999)
    c.load_state_dict(saved)
    assert np.allclose(c.wtree, a.wtree)  # trees are rebuilt from the priorities
    again = c.sample(64)
    assert all(np.array_equal(x, y) for x, y in zip(first[:3], again[:3], strict=True))


def test_deterministic_selectors_come_from_their_config_and_an_unknown_key_is_refused():
    from dataclasses import dataclass

    from replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Selector

    assert [s.deterministic for s in (Uniform(), Prioritized(), Fifo(), Lifo(), MinHeap(), MaxHeap())] == [
        False, False, True, True, True, True]

    @dataclass(frozen=True)
    class Newest(Selector):  # a new deterministic selector that forgot its key
        kind = "newest"
        deterministic = True

    state = SelectorState(Newest(), 1, 8)
    assert state.deterministic
    with pytest.raises(ValueError, match="'newest' has no key"):
        state.key_of(0, np.arange(3))
    heap = SelectorState(MaxHeap(), 1, 8)
    heap.priority[0, :3] = [1.0, 5.0, 2.0]
    np.testing.assert_array_equal(heap.key_of(0, np.arange(3)), [-1.0, -5.0, -2.0])
