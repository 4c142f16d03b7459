"""The Ray store's codec fields under a demanding user (issue 29): an "lz4dict" field travels compressed
through a shard and the client's batch equals a raw shard's byte for byte (chunks of 1, 4 and 8 steps,
windows of 3, wrapped rings); a writer overwriting old windows while the shard samples never yields a
torn window; after a shard's codec arena refuses a shipment the writer's next steps start a new
episode, as in the local writer (not a continuation flagged as a Ray restart); with ``max_inflight=0`` an
episode its shard's rate limiter refuses stays staged for a retry, as in the local writer; a chunk whose
bytes or checksum changed in transit is refused by the learner's decode naming the shard, the field and
the chunk (each codec)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from graphrl.memory import MemoryBudgetError, MemoryManager  # noqa: E402
from replay import Fifo, MinSize, Queue, ReplayStore, TrajectorySpec, Uniform  # noqa: E402
from replay.chunk_codec import ChunkRing  # noqa: E402
from replay.chunk_decode import free_zstd_context, new_zstd_context  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.distributed.chunk_transport import CODEC_KINDS, gather_chunks, pack_field, unpack_field  # noqa: E402
from replay.distributed.shard import ShardActor  # noqa: E402
from replay.distributed.transport import place  # noqa: E402


def spec(codec: str | None, chunk: int | None) -> TrajectorySpec:
    extra = (codec, 0.5, chunk) if codec else ()
    return TrajectorySpec({"id": ((), "int64"), "img": ((3, 16), "uint8", *extra), "r": ((), "float32")})


def steps(ids: np.ndarray) -> dict[str, np.ndarray]:
    img = np.zeros((len(ids), 3, 16), np.uint8)
    img[:, 0, :8] = (ids % 251)[:, None]
    img[:, 1] = (ids[:, None] * 7 + np.arange(16)) % 13
    img[:, 2] = 5
    return {"id": ids, "img": img, "r": (ids * 0.5).astype(np.float32)}


def shard_of(sp: TrajectorySpec, capacity: int) -> ShardActor:
    config = {
        "spec": sp.to_config(), "capacity": capacity, "num_shards": 1, "selector": Uniform().to_config(),
        "rate_limiter": MinSize(1).to_config(), "max_times_sampled": 0, "chunk_steps": capacity,
        "insert_headroom": float("inf"), "insert_counts": (0, 0, 0),
        "tier": "host", "timeout": 10.0, "staging_slots": 1, "seed": 5,
    }
    return ShardActor(0, config, None)


def sample(shard: ShardActor, sp: TrajectorySpec, b: int, window: int) -> tuple[np.ndarray, dict, np.ndarray]:
    rep = shard.sample(b, window, "tail", 10.0, None)
    out = {n: np.full((b, window, *f.shape), 0xAB, f.dtype) for n, f in sp.items()}
    mask = np.zeros((b, window), bool)
    flat = tuple(out[n].reshape(-1).view(np.uint8) for n in sp)
    row_bytes = np.array([f.row_bytes for f in sp.values()], np.int64)
    place(rep, [ray.get(p[0]) for p in rep["parts"]], flat, mask, row_bytes, 0, window, False, 0)
    return rep["keys"], out, mask


@pytest.mark.parametrize("chunk", [1, 4, 8])
def test_an_lz4dict_field_travels_through_a_shard_byte_for_byte(cluster, chunk):
    # CODEC_KINDS knew lz4 and zstd only: sampling a shard with an "lz4dict" field raised KeyError
    lengths = [5, 11, 3, 9, 12, 7, 10]  # 57 steps in a ring of 48: wrapped
    got = []
    for sp in (spec(None, None), spec("lz4dict", chunk)):
        shard = shard_of(sp, 48)
        try:
            at = 0
            for key, n in enumerate(lengths):
                shard.insert(key, steps(np.arange(at, at + n, dtype=np.int64)), True, 10.0)
                at += n
            got.append([sample(shard, sp, 16, 3) for _ in range(2)])
        finally:
            shard.close()
    for (k0, f0, m0), (k1, f1, m1) in zip(*got, strict=True):
        assert (k0 == k1).all() and (m0 == m1).all()
        for name in f0:
            assert f0[name].tobytes() == f1[name].tobytes(), name


@pytest.mark.parametrize("codec", ["zstd", "lz4dict"])
def test_a_writer_overwriting_old_windows_never_yields_a_torn_window(cluster, codec):
    sp = spec(codec, 4)
    shard = shard_of(sp, 32)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        k = 0
        while not stop.is_set():
            n = 1 + k % 7
            shard.insert(k, steps(np.arange(written[0], written[0] + n, dtype=np.int64)), True, 10.0)
            written[0] += n
            k += 1

    shard.insert(-1, steps(np.arange(0, 20, dtype=np.int64)), True, 10.0)
    written[0] = 20
    th = threading.Thread(target=write)
    th.start()
    try:
        dctx = new_zstd_context()
        try:
            end, rounds = time.monotonic() + 0.6, 0
            while time.monotonic() < end or rounds < 5:
                rep = shard.sample(16, 4, "tail", 10.0, None)
                out = {n: np.full((16, 4, *f.shape), 0xAB, f.dtype) for n, f in sp.items()}
                mask = np.zeros((16, 4), bool)
                flat = tuple(out[n].reshape(-1).view(np.uint8) for n in sp)
                rb = np.array([f.row_bytes for f in sp.values()], np.int64)
                place(rep, [ray.get(p[0]) for p in rep["parts"]], flat, mask, rb, 0, 4, False, dctx)
                for b, n in enumerate(rep["n"].tolist()):
                    ids = out["id"][b, :n]
                    assert (np.diff(ids) == 1).all()
                    want = steps(ids)
                    for name in sp:
                        assert (out[name][b, :n] == want[name]).all(), name
                        assert (out[name][b, n:] == 0).all(), name
                rounds += 1
        finally:
            free_zstd_context(dctx)
    finally:
        stop.set()
        th.join()
        shard.close()
    assert written[0] > 64  # the ring of 32 wrapped while sampling


def test_after_a_refused_shipment_the_next_steps_start_a_new_episode(cluster):
    sp = TrajectorySpec({"id": ((), "int64"), "img": ((4, 16), "uint8", "lz4", 4.0, 2)})

    def part(first: int, n: int, noise: bool = False) -> dict[str, np.ndarray]:
        ids = np.arange(first, first + n, dtype=np.int64)
        img = np.zeros((n, 4, 16), np.uint8)
        img[:, 0, 0] = ids
        if noise:  # incompressible: its chunks overflow the arena (a quarter of the raw ring)
            img[:] = np.random.default_rng(first).integers(0, 256, img.shape)
        return {"id": ids, "img": img}

    far = RayReplayStore(sp, 32, 1, seed=1, timeout=10.0)
    local = ReplayStore(sp, 32, 1, seed=1, timeout=10.0)
    try:
        fw, lw = far.writer(chunk_steps=4, max_inflight=0), local.writer(chunk_steps=4)
        for w in (fw, lw):
            w.extend(part(0, 4))
            w.flush()
            with pytest.raises(MemoryBudgetError, match="field 'img'"):
                w.extend(part(4, 12, noise=True))
                w.flush()
            w.extend(part(16, 2))
            w.end_episode()  # the Ray writer raised ShardError ("shard 0 was restarted by Ray")
            w.close()
        want = [(e.start, e.length, e.open, e.continuation, e.data["id"].tolist()) for e in local.episodes()]
        got = [(e.start, e.length, e.open, e.continuation, e.data["id"].tolist()) for e in far.episodes()]
        assert got == want
        assert want[-1][2:] == (False, False, [16, 17])  # a new episode, whole
    finally:
        far.close()
        local.close()


def test_an_episode_the_rate_limiter_refuses_stays_staged_as_in_the_local_writer(cluster):
    # max_inflight=0: the shard's TimeoutError dropped the episode (pending 0, end_episode had nothing
    # to retry); the local writer leaves it staged and end_episode stores it once sampling made room
    sp = TrajectorySpec({"a": ((), "int32"), "img": ((8,), "uint8", "zstd", 1.0, 2)})

    def ep(first: int, n: int) -> dict[str, np.ndarray]:
        return {"a": np.arange(first, first + n, dtype=np.int32), "img": np.zeros((n, 8), np.uint8)}

    held = []
    for make, kw in ((ReplayStore, {}), (RayReplayStore, {"max_inflight": 0})):
        s = make(sp, 16, 1, selector=Fifo(), rate_limiter=Queue(4), max_times_sampled=1, seed=1, timeout=0.2)
        try:
            w = s.writer(**kw)
            w.add_episode(ep(0, 4))
            with pytest.raises(TimeoutError):
                w.add_episode(ep(10, 2))
            assert w.pending == 2
            with s.sample(4, 1, timeout=5.0) as b:
                assert sorted(b["a"][:, 0].tolist()) == [0, 1, 2, 3]
            w.end_episode()
            w.close()
            held.append([e.data["a"].tolist() for e in s.episodes()])
        finally:
            s.close()
    assert held[0] == held[1] == [[0, 1, 2, 3], [10, 11]]


def test_a_zstd_field_placed_without_a_context_is_refused_not_a_crash(cluster):
    # place(..., dctx=0) on a zstd field crashed the process (ZSTD_decompressDCtx on a null context)
    sp = spec("zstd", 4)
    shard = shard_of(sp, 32)
    try:
        shard.insert(0, steps(np.arange(0, 20, dtype=np.int64)), True, 10.0)
        with pytest.raises(ValueError, match=r"field 1: a zstd field needs dctx.*got 0"):
            sample(shard, sp, 8, 2)
    finally:
        shard.close()


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
@pytest.mark.parametrize("fault", ["bytes", "checksum"])
def test_a_chunk_damaged_in_transit_raises_naming_the_shard_field_and_chunk(cluster, codec, fault):
    sp = spec(codec, 4)
    shard = shard_of(sp, 32)
    dctx = new_zstd_context()
    try:
        shard.insert(0, steps(np.arange(0, 30, dtype=np.int64)), True, 10.0)
        rep = shard.sample(8, 3, "tail", 10.0, None)
        pieces = [[np.array(x) for x in ray.get(p[0])] for p in rep["parts"]]  # writable copies
        (_, num_runs, _, (pack,)) = rep["parts"][0]
        assert len(pack.jobs) and len(pieces[0]) == 2 * num_runs + 1  # raw fields' runs, then the blob
        if fault == "bytes":  # a byte of the first chunk a job reads, as a bad link or buffer would change it
            pieces[0][-1][pack.jobs[0, 0] + pack.jobs[0, 1] // 2] ^= 0x01
        else:  # the chunk's record: its checksum
            pack.jobs[pack.jobs[:, 0] == pack.jobs[0, 0], 7] += 1
        out = {n: np.zeros((8, 3, *f.shape), f.dtype) for n, f in sp.items()}
        flat = tuple(out[n].reshape(-1).view(np.uint8) for n in sp)
        rb = np.array([f.row_bytes for f in sp.values()], np.int64)
        k = int(pack.jobs[0, 6])
        with pytest.raises(RuntimeError, match=rf"shard 0, field 'img': compressed chunk {k} it shipped"):
            place(rep, pieces, flat, np.zeros((8, 3), bool), rb, 0, 3, False, dctx)
    finally:
        free_zstd_context(dctx)
        shard.close()


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
def test_a_later_run_whose_chunk_record_changed_in_transit_is_refused(codec):
    # a chunk read by several runs is verified once; a later run whose length changed to the raw chunk's
    # (its record differs from the verified run's) must be verified, not read as raw rows
    ring = ChunkRing.create(MemoryManager(), "img", (3, 16), np.uint8, codec, capacity=32, chunk=4,
                            arena_bytes=4096)
    ring.write(steps(np.arange(22, dtype=np.int64))["img"], 0)
    first = np.array([0, 2, 6, 10, 14, 17], np.int64)  # windows of 3 over chunks 0 .. 4, two runs in chunk 0
    n, dst = np.full(6, 3, np.int64), np.zeros(6, np.int64)
    pack = pack_field(ring, 1, CODEC_KINDS[codec], first, n, dst, 3, 0)
    blob = gather_chunks(ring, pack)
    runs = np.flatnonzero(pack.jobs[:, 6] == 0)
    assert len(runs) == 2 and pack.jobs[runs[1], 0] + ring.chunk_bytes <= blob.size  # read raw, it fits
    pack.jobs[runs[1], 1] = ring.chunk_bytes
    out = np.zeros(6 * 3 * ring.chunk_bytes // 4, np.uint8)
    dctx = new_zstd_context()
    try:
        with pytest.raises(RuntimeError, match=r"shard 0, field 'img': compressed chunk 0 it shipped failed"):
            unpack_field(pack, blob, out, 0, 3, ring.chunk_bytes // 4, dctx)
    finally:
        free_zstd_context(dctx)


@pytest.mark.parametrize(("table", "word", "damage", "what"), [
    ("jobs", 2, "next window", "output byte offset"),  # rows of a window written into the next one's
    ("jobs", 5, "far window", "window"),
    ("jobs", 3, -1, "first row in the chunk"),
    ("jobs", 4, "past the chunk", "rows"),
    ("copies", 2, "next window", "output byte offset"),
    ("copies", 3, "far window", "window"),
    ("copies", 0, -1, "tail byte offset"),
    ("copies", 1, "past the tail", "bytes"),
])
def test_a_job_or_copy_record_damaged_in_transit_is_refused_before_any_copy(
    cluster, table, word, damage, what
):
    # the records' output offset, first row and rows went unchecked into compiled copies: a damaged one
    # wrote out of bounds or put rows into another window, no error
    sp = spec("lz4", 4)
    shard = shard_of(sp, 32)
    b, length, rb = 16, 3, sp["img"].row_bytes
    try:
        shard.insert(0, steps(np.arange(0, 30, dtype=np.int64)), True, 10.0)
        rep = shard.sample(b, length, "tail", 10.0, None)
        pieces = [[np.array(x) for x in ray.get(p[0])] for p in rep["parts"]]
        pack = rep["parts"][0][3][0]
        rec = getattr(pack, table)
        win = 5 if table == "jobs" else 3
        assert len(rec) and (rec[:, win] < b - 1).any()
        i = int(np.flatnonzero(rec[:, win] < b - 1)[0])
        if damage == "next window":
            rec[i, word] += length * rb
        elif damage == "far window":
            rec[i, word] = b
        elif damage == "past the chunk":
            rec[i, word] = pack.chunk - rec[i, 3] + 1
        elif damage == "past the tail":
            rec[i, word] = pack.tail.size - rec[i, 0] + rb
        else:
            rec[i, word] = damage * rb if table == "copies" else damage
        out = {n: np.zeros((b, length, *f.shape), f.dtype) for n, f in sp.items()}
        flat = tuple(out[n].reshape(-1).view(np.uint8) for n in sp)
        rows = np.array([f.row_bytes for f in sp.values()], np.int64)
        name = rf"job {i} \(chunk \d+\)" if table == "jobs" else f"open-chunk copy {i}"
        msg = rf"shard 0, field 'img': the {what} of {name} it shipped is out of bounds"
        with pytest.raises(RuntimeError, match=msg):
            place(rep, pieces, flat, np.zeros((b, length), bool), rows, 0, length, False, 0)
        assert not out["img"].any()  # refused before any copy
    finally:
        shard.close()
