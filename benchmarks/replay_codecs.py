"""Which codec for chunks of Atari frames: compression ratio and speed of numcodecs' zstd, lz4 and blosc.

The measurement behind a per-field codec for the replay store (issue 29): chunks of K consecutive 84x84
grey frames (K in ``--chunks``) are compressed with each codec and level, and decompressed into a
preallocated buffer as a sampler would decompress into its staging slot. Frames come from the Arcade
Learning Environment (``ale-py``, its bundled ROMs, random actions, frame skip 4, area-downsampled from
210x160 to 84x84 as DQN's preprocessing does) when it is installed, else from a generator of frames
with Atari-like redundancy (a static background, a few moving sprites, a score strip); the JSON says
which (``frames``).

Columns: ``ratio`` = raw bytes / compressed bytes (steps held in the same memory); ``compress_MBps`` and
``decompress_MBps`` of raw bytes; ``sample_us_per_frame`` = the time to decompress one chunk divided by
the frames a window of ``--window`` steps uses from it (the cost a sampled step pays, against
``raw_copy_us_per_frame``, a ``memcpy`` of one frame; ``lz4dict`` decodes each frame on its own, so its
chunk time is divided by all its frames), through the codec's Python call; ``compiled_us_per_frame`` the
same through the store's compiled decode (`replay.chunk_decode`; not blosc or XOR), and
``verified_us_per_frame`` with its chunk checksum check (as a Ray learner decodes). ``lz4hc-L`` is
numcodecs' LZ4 format compressed by its bundled LZ4 HC at level L (what the store's ``"lz4"`` writes,
`replay.chunk_encode`); ``lz4dict-L`` the store's ``"lz4dict"`` at LZ4 HC level L, ``lz4dict-aligned`` at its
default, the aligned parse (`replay.aligned_lz4`); ``-xor`` XORs each frame of a
chunk with the one before first (a delta filter, undone after decoding). The machine is shared: the JSON
records the 1-minute load average. Run ``python benchmarks/replay_codecs.py --help``; results go to
``benchmarks/results/replay_codecs.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path, and benchmarks/replay.py would shadow
# the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numpy as np  # noqa: E402
from numcodecs import LZ4, Blosc, Zstd  # noqa: E402

from replay.aligned_lz4 import ALIGNED  # noqa: E402
from replay.chunk_decode import LZ4 as LZ4_KIND  # noqa: E402
from replay.chunk_decode import LZ4DICT as LZ4DICT_KIND  # noqa: E402
from replay.chunk_decode import ZSTD as ZSTD_KIND  # noqa: E402
from replay.chunk_decode import (  # noqa: E402
    decode_dict_chunk,
    decode_jobs,
    free_zstd_context,
    new_zstd_context,
)
from replay.chunk_encode import ChunkEncode, chunk_checksum  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay_codecs.json"
class LZ4HC:
    """numcodecs' LZ4 format compressed by its bundled LZ4 HC at ``level`` (`replay.chunk_encode`)."""

    def __init__(self, level: int) -> None:
        self.enc, self.dec = ChunkEncode("lz4", level), LZ4()

    def encode(self, piece: np.ndarray) -> bytes:
        return self.enc.encode(np.ascontiguousarray(piece), len(piece), 0)[0].tobytes()

    def decode(self, data: bytes, out: np.ndarray) -> np.ndarray:
        return self.dec.decode(data, out=out)


class LZ4Dict:
    """The store's ``"lz4dict"`` chunks (`replay.chunk_encode`): the first frame raw, the others LZ4 blocks
    with it as dictionary, written by LZ4 HC at ``level`` or by the aligned parse (``ALIGNED``)."""

    def __init__(self, level: int) -> None:
        self.enc = ChunkEncode("lz4dict", level)

    def encode(self, piece: np.ndarray) -> bytes:
        return self.enc.encode(np.ascontiguousarray(piece), len(piece), 0)[0].tobytes()

    def decode(self, data: bytes, out: np.ndarray) -> np.ndarray:
        steps = out.size // (84 * 84)
        assert decode_dict_chunk(np.frombuffer(data, np.uint8), steps, 84 * 84, out.reshape(-1))
        return out


class XorDelta:
    """Each frame of a chunk XORed with the one before (the first kept) before ``inner`` compresses it;
    decoding undoes it with a running XOR (numpy)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def encode(self, piece: np.ndarray) -> bytes:
        d = piece.copy()
        d[1:] ^= piece[:-1]
        return self.inner.encode(d)

    def decode(self, data: bytes, out: np.ndarray) -> np.ndarray:
        self.inner.decode(data, out=out)
        view = out.reshape(-1, 84 * 84)
        np.bitwise_xor.accumulate(view, axis=0, out=view)
        return out


CODECS = {
    "lz4hc-2": lambda: LZ4HC(2),
    "lz4hc-4": lambda: LZ4HC(4),
    "lz4hc-9": lambda: LZ4HC(9),
    "lz4hc-2-xor": lambda: XorDelta(LZ4HC(2)),
    "lz4dict-aligned": lambda: LZ4Dict(ALIGNED),
    "lz4dict-2": lambda: LZ4Dict(2),
    "lz4dict-6": lambda: LZ4Dict(6),
    "lz4dict-9": lambda: LZ4Dict(9),
    "lz4-xor": lambda: XorDelta(LZ4(acceleration=1)),
    "blosc-lz4-bitshuffle": lambda: Blosc("lz4", 5, Blosc.BITSHUFFLE),
    "zstd-1": lambda: Zstd(level=1),
    "zstd-3": lambda: Zstd(level=3),
    "zstd-9": lambda: Zstd(level=9),
    "lz4": lambda: LZ4(acceleration=1),
    "blosc-lz4-shuffle": lambda: Blosc("lz4", 5, Blosc.SHUFFLE),
    "blosc-zstd1-shuffle": lambda: Blosc("zstd", 1, Blosc.SHUFFLE),
    "blosc-zstd1-noshuffle": lambda: Blosc("zstd", 1, Blosc.NOSHUFFLE),
}


def ale_frames(n: int, game: str, seed: int) -> np.ndarray | None:
    """uint8 [n, 84, 84] frames of ``game`` under random actions, or None when ale-py is missing."""
    try:
        from ale_py import ALEInterface, roms
    except ImportError:
        return None
    ale = ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setInt("frame_skip", 4)
    ale.loadROM(roms.get_rom_path(game))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(seed)
    out = np.empty((n, 84, 84), dtype=np.uint8)
    for t in range(n):
        ale.act(actions[rng.integers(len(actions))])
        if ale.game_over():
            ale.reset_game()
        screen = ale.getScreenGrayscale().astype(np.float32)  # [210, 160]
        out[t] = area_resize(screen, 84, 84)
    return out


def area_resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Area (box-filter) resize of a 2-D float image to [h, w], rounded to uint8."""
    rows = np.linspace(0, img.shape[0], h + 1).astype(int)
    cols = np.linspace(0, img.shape[1], w + 1).astype(int)
    out = np.add.reduceat(np.add.reduceat(img, rows[:-1], axis=0), cols[:-1], axis=1)
    out /= np.outer(np.diff(rows), np.diff(cols))
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def synthetic_frames(n: int, seed: int) -> np.ndarray:
    """uint8 [n, 84, 84]: a fixed background of flat bands, 6 moving 4x4 sprites, a changing score strip."""
    rng = np.random.default_rng(seed)
    bands = rng.integers(0, 120, (12, 1), dtype=np.uint8)
    background = np.repeat(bands, 7, axis=0) * np.ones((1, 84), np.uint8)
    pos = rng.integers(10, 74, (6, 2)).astype(np.float64)
    vel = rng.uniform(-2, 2, (6, 2))
    out = np.empty((n, 84, 84), dtype=np.uint8)
    for t in range(n):
        f = background.copy()
        pos += vel
        vel[(pos < 8) | (pos > 76)] *= -1
        for y, x in pos.astype(int):
            f[y - 2 : y + 2, x - 2 : x + 2] = 200
        f[:6, 60:80] = 150 + (t // 16) % 50
        out[t] = f
    return out


def compiled_us(name: str, encoded: list, chunk_bytes: int, steps: int) -> tuple[float, float] | None:
    """Microseconds a chunk of ``encoded`` (``steps`` frames, numcodecs lz4 or zstd, or lz4dict) takes to
    decompress through the replay store's compiled path (`replay.chunk_decode.decode_jobs`: the codec's C
    entry point called from numba, no Python per chunk), best of 5 passes over all chunks, without and
    with its checksum check (``verify``); None for the blosc codecs and the XOR filter."""
    kind = {"lz4": LZ4_KIND, "lz4hc": LZ4_KIND, "zstd": ZSTD_KIND, "lz4dict": LZ4DICT_KIND}.get(
        name.split("-")[0])
    if kind is None or name.startswith("blosc") or name.endswith("xor"):
        return None
    blobs = [np.frombuffer(e, dtype=np.uint8) for e in encoded]
    arena = np.concatenate(blobs)
    jobs = np.zeros((len(blobs), 8), dtype=np.int64)
    jobs[:, 0] = np.concatenate([[0], np.cumsum([b.size for b in blobs])[:-1]])
    jobs[:, 1] = [b.size for b in blobs]
    jobs[:, 4] = steps  # the whole chunk, straight into the output
    jobs[:, 6] = np.arange(len(blobs))
    jobs[:, 7] = [chunk_checksum(arena, int(o), int(n), i) for i, (o, n) in enumerate(jobs[:, :2].tolist())]
    out = np.empty(chunk_bytes, dtype=np.uint8)
    ctx = new_zstd_context()
    try:
        best = [float("inf"), float("inf")]
        for _ in range(5):
            for verify in (False, True):
                t0 = time.perf_counter()
                assert decode_jobs(kind, ctx, arena, jobs, len(blobs), steps, chunk_bytes // steps, out,
                                   verify) == 0
                best[verify] = min(best[verify], time.perf_counter() - t0)
    finally:
        free_zstd_context(ctx)
    return best[0] / len(blobs) * 1e6, best[1] / len(blobs) * 1e6


@click.command()
@click.option("--frames", "n_frames", default=4096, show_default=True, help="Frames to generate.")
@click.option("--game", default="breakout", show_default=True, help="ALE game (when ale-py is installed).")
@click.option("--chunks", default="1,4,16,64", show_default=True, help="Frames a chunk, comma-separated.")
@click.option("--window", default=4, show_default=True, help="Frames a sampled window uses from a chunk.")
@click.option("--synthetic", is_flag=True, help="Use the generated frames even when ale-py is installed.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(n_frames: int, game: str, chunks: str, window: int, synthetic: bool, output: str) -> None:
    """Compression ratio and speed of codecs on chunks of 84x84 Atari frames."""
    load_before = os.getloadavg()[0]
    frames = None if synthetic else ale_frames(n_frames, game, 0)
    source = f"ale-py {game}" if frames is not None else "synthetic"
    if frames is None:
        frames = synthetic_frames(n_frames, 0)
    frame_bytes = frames[0].nbytes
    one = np.empty(frame_bytes, dtype=np.uint8)
    flat = frames.reshape(len(frames), -1)
    idx = np.random.default_rng(1).integers(0, len(frames), 2000)
    start = time.perf_counter()
    for i in idx:
        np.copyto(one, flat[i])
    raw_us = (time.perf_counter() - start) / len(idx) * 1e6
    rows = []
    for k in (int(x) for x in chunks.split(",")):
        pieces = [np.ascontiguousarray(frames[i : i + k]) for i in range(0, len(frames) - k + 1, k)]
        raw = sum(p.nbytes for p in pieces)
        for name, make in CODECS.items():
            codec = make()
            buf = np.empty(pieces[0].nbytes, dtype=np.uint8)
            codec.decode(codec.encode(pieces[0]), out=buf)  # untimed: compiled paths load or compile here
            t0 = time.perf_counter()
            encoded = [codec.encode(p) for p in pieces]
            t_enc = time.perf_counter() - t0
            t0 = time.perf_counter()
            for e in encoded:
                codec.decode(e, out=buf)
            t_dec = time.perf_counter() - t0
            ratio = raw / sum(len(e) for e in encoded)
            per_chunk_us = t_dec / len(encoded) * 1e6
            compiled, verified = compiled_us(name, encoded, pieces[0].nbytes, k) or (None, None)
            used = k if name.startswith("lz4dict") else min(k, window)  # lz4dict decodes only the frames used
            rows.append({"case": f"{name} chunk={k}", "metric": "ratio", "ours": ratio,
                         "baseline": "raw", "baseline_value": 1.0, "ratio": ratio,
                         "compress_MBps": raw / t_enc / 1e6, "decompress_MBps": raw / t_dec / 1e6,
                         "sample_us_per_frame": per_chunk_us / used,
                         "compiled_us_per_frame": None if compiled is None else compiled / used,
                         "verified_us_per_frame": None if verified is None else verified / used,
                         "raw_copy_us_per_frame": raw_us})
    load = (load_before, os.getloadavg()[0])
    click.echo(f"frames: {source}, {len(frames)} of 84x84; raw copy {raw_us:.2f} us a frame")
    click.echo(f"{'codec / chunk':<30} {'ratio':>6} {'comp MB/s':>10} {'dec MB/s':>9} {'us/frame':>9} "
               f"{'compiled':>9} {'verified':>9}")
    for r in rows:
        c, v = r["compiled_us_per_frame"], r["verified_us_per_frame"]
        click.echo(f"{r['case']:<30} {r['ratio']:>6.1f} {r['compress_MBps']:>10.0f} "
                   f"{r['decompress_MBps']:>9.0f} {r['sample_us_per_frame']:>9.2f} "
                   f"{'-' if c is None else f'{c:.2f}':>9} {'-' if v is None else f'{v:.2f}':>9}")
    click.echo(f"1-min load average {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} CPUs")
    import numcodecs

    info = machine(numcodecs=numcodecs.__version__, load_average_1min=load)
    write_result("replay_codecs", rows, info, output, frames=source, window=window)


if __name__ == "__main__":
    main()
