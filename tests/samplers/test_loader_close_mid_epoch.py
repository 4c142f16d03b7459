"""A loader closed during an epoch, from another thread, makes the consumer's next() raise ValueError
naming how far the epoch got, not StopIteration (a loop would take the shortened epoch for a whole one);
an iterator the user closes, or one a new epoch replaced, still stops quietly."""

from __future__ import annotations

import threading

import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import NeighborLoader

N = 60


def _loader(prefetch: int) -> NeighborLoader:
    src = torch.arange(N).repeat_interleave(3)
    dst = (src * 7 + torch.arange(3 * N) % 3 + 1) % N
    return NeighborLoader(CSCGraph.from_edges(src.numpy(), dst.numpy(), N), torch.arange(N), [2],
                          batch_size=10, seed=0, prefetch=prefetch)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_close_from_another_thread_raises_in_the_consumer(prefetch):
    loader = _loader(prefetch)
    first, closed = threading.Event(), threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for batch in loader:
                seen.append(int(batch.index))
                first.set()
                closed.wait(30)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            errors.append(err)

    thread = threading.Thread(target=consume)
    thread.start()
    assert first.wait(30)
    loader.close()
    closed.set()
    thread.join(30)
    assert not thread.is_alive() and seen == [0]
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert "closed during the epoch after 1 of 6 batches" in str(errors[0])


def test_a_users_close_or_a_new_epoch_still_stops_quietly():
    loader = _loader(2)
    it = iter(loader)
    next(it)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    a = iter(loader)
    next(a)
    b = iter(loader)
    with pytest.raises(StopIteration):
        next(a)
    assert sum(1 for _ in b) == 6
    loader.close()
    with pytest.raises(StopIteration):  # an epoch that ended stays ended
        next(b)
