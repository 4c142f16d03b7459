"""A learner process's ``sample(device="cuda")``: the GPU gather from the shared rings mapped in the learner,
run under numba's CUDA simulator in a subprocess (chosen before numba.cuda is imported); every window's
bytes are checked against what the writer wrote."""

from __future__ import annotations

import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import numpy as np
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from replay import Prioritized, ReplayStore, TrajectorySpec

    SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32"), "rgb": ((3,), "uint8")})

    def cols(start, n):
        pos = np.arange(start, start + n, dtype=np.int64)
        obs = (pos[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
        return {"pos": pos, "obs": obs, "rgb": (pos[:, None] * 7 + np.arange(3)).astype(np.uint8)}

    def child(learner, episodes, out):
        learner.device_gather_min_bytes = 0  # every batch through the GPU kernel, however small
        checked = 0
        for b, length, pad in [(5, 4, "tail"), (7, 9, "head"), (5, 4, "head"), (3, 16, "tail")]:
            with learner.sample(b, window=length, pad=pad, device="cuda") as batch:
                mask, lengths = batch.mask.numpy(), batch.lengths.numpy()
                assert (mask.sum(1) == lengths).all()
                for i in range(b):
                    pos = batch["pos"][i].numpy()[mask[i]]
                    assert any(lo <= pos[0] and pos[-1] < hi for lo, hi in episodes)  # one episode
                    assert np.array_equal(pos, np.arange(pos[0], pos[0] + len(pos)))
                    want = cols(int(pos[0]), len(pos))
                    for name in ("obs", "rgb"):
                        assert np.array_equal(batch[name][i].numpy()[mask[i]], want[name]), name
                    checked += 1
        out.send(checked)

    store = ReplayStore(SPEC, 60, 3, selector=Prioritized(0.6), seed=7, timeout=10.0)
    rng = np.random.default_rng(3)
    episodes, start = [], 0
    with store.writer() as w:
        for _ in range(12):
            n = int(rng.integers(2, 9))
            w.extend(cols(start, n)); w.end_episode()
            episodes.append((start, start + n)); start += n
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=child, args=(store.learner(), episodes, theirs))
    proc.start()
    checked = ours.recv()
    proc.join(60)
    assert proc.exitcode == 0
    store.close()
    print("OK", checked)
    """
)


@pytest.mark.simulated(SCRIPT)
def test_a_learner_process_gathers_on_the_simulated_gpu(simulated_part):
    part = simulated_part
    assert part.ok and part.output.split()[-2:] == ["OK", "20"], part.output[-3000:]
