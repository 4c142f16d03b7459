"""ChunkEncode: chunks compressed in one compiled call are numcodecs' own LZ4 / Zstd bytes (numcodecs decodes
them back exactly), at the documented levels, with XXH64 checksums seeded by the chunk index; a chunk
that does not compress is stored raw; bad input and misuse raise naming the value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs import LZ4, Zstd

try:
    import xxhash
except ImportError:  # pragma: no cover - the reference is optional
    xxhash = None

from replay.chunk_decode import decode_dict_chunk
from replay.chunk_encode import LZ4_LEVEL, ZSTD_LEVEL, ChunkEncode, chunk_checksum, stored_raw


def rows(n: int, seed: int) -> np.ndarray:
    """Rows that compress (a flat background) with a few random bytes each."""
    rng = np.random.default_rng(seed)
    out = np.full((n, 6, 7), 9, np.uint8)
    out[:, rng.integers(0, 6), :] = rng.integers(0, 256, (n, 7), dtype=np.uint8)
    return out


@settings(max_examples=12, deadline=None)
@given(codec=st.sampled_from(["lz4", "zstd"]), level=st.sampled_from([None, 0, 1, 3, 9]),
       chunk=st.sampled_from([1, 3, 8]), n=st.integers(0, 5), seed=st.integers(0, 2**31 - 1))
def test_chunks_decode_with_numcodecs_to_the_rows(codec, level, chunk, n, seed):
    data = rows(n * chunk, seed)
    enc = ChunkEncode(codec, None if codec == "zstd" and level == 0 else level)
    try:
        blob, sizes, sums = enc.encode(data, chunk, first=5)
    finally:
        enc.close()
    assert sizes.shape == sums.shape == (n,) and blob.size == sizes.sum()
    dec = LZ4() if codec == "lz4" else Zstd()
    at = 0
    for i, size in enumerate(sizes.tolist()):
        one = blob[at : at + size].tobytes()
        if xxhash is not None:  # the reference XXH64 (a dependency of other packages, when installed)
            assert sums[i] == np.uint64(xxhash.xxh64_intdigest(one, seed=5 + i)).view(np.int64)
        got = np.frombuffer(one if size == chunk * 42 else dec.decode(one), np.uint8)
        assert np.array_equal(got, data[i * chunk : (i + 1) * chunk].reshape(-1))
        at += size


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
def test_a_chunk_that_does_not_compress_is_stored_raw(codec):
    noise = np.random.default_rng(1).integers(0, 256, (8, 300), dtype=np.uint8)
    noise[4:] = 3  # the second chunk compresses
    blob, sizes, sums = ChunkEncode(codec).encode(noise, 4, first=2)
    assert sizes[0] == 1200 and sizes[1] < 400
    assert np.array_equal(blob[:1200], noise[:4].reshape(-1))
    assert sums[0] != sums[1] and sums[0] == chunk_checksum(blob, 0, 1200, 2)
    assert chunk_checksum(blob, 0, 1200, 3) != sums[0]  # the seed ties the bytes to their chunk
    assert stored_raw(sizes[0], 1200) and not stored_raw(sizes[1], 1200)  # the readers' one rule


def test_lz4_chunks_carry_numcodecs_size_prefix_and_compress():
    data = np.zeros((4, 100), np.uint8)
    enc = ChunkEncode("lz4")
    blob, sizes, _ = enc.encode(data, 2, first=0)
    assert int.from_bytes(blob[:4].tobytes(), "little") == 200  # numcodecs' header: the raw size
    assert sizes.tolist()[0] < 40 and (LZ4_LEVEL, ZSTD_LEVEL) == (2, 1)


@settings(max_examples=10, deadline=None)
@given(level=st.sampled_from([None, 0, 9]), chunk=st.sampled_from([1, 2, 5]), n=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
def test_lz4dict_chunks_keep_the_first_step_raw_and_decode_to_the_rows(level, chunk, n, seed):
    data = rows(n * chunk, seed)
    enc = ChunkEncode("lz4dict", level)
    blob, sizes, _ = enc.encode(data, chunk, first=0)
    row = data[0].nbytes
    at = 0
    for i, size in enumerate(sizes.tolist()):
        one = blob[at : at + size]
        if size == chunk * row:  # does not compress: stored raw
            assert np.array_equal(one, data[i * chunk : (i + 1) * chunk].reshape(-1))
            at += size
            continue
        ends = one[: 4 * chunk].view("<u4")
        assert ends[0] == row and (np.diff(ends) > 0).all() and ends[-1] == size - 4 * chunk
        assert np.array_equal(one[4 * chunk : 4 * chunk + row], data[i * chunk].reshape(-1))  # the key, raw
        out = np.empty(chunk * row, np.uint8)
        assert decode_dict_chunk(one, chunk, row, out)
        assert np.array_equal(out, data[i * chunk : (i + 1) * chunk].reshape(-1))
        bad = one.copy()
        bad[4 : 4 * chunk] = 0xFF  # part ends past the chunk: refused, nothing read out of bounds
        assert chunk == 1 or not decode_dict_chunk(bad, chunk, row, out)
        at += size


def test_bad_input_raises():
    with pytest.raises(ValueError, match="codec must be one of .*'snappy'"):
        ChunkEncode("snappy")
    with pytest.raises(ValueError, match=r"level of lz4 must be in \[0, 12\], got 13"):
        ChunkEncode("lz4", 13)
    with pytest.raises(ValueError, match=r"level of zstd must be in \[1, 22\], got 0"):
        ChunkEncode("zstd", 0)
    enc = ChunkEncode("zstd")
    with pytest.raises(ValueError, match=r"multiple of chunk=2 long, got shape \(3, 6, 7\)"):
        enc.encode(rows(3, 0), 2, first=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        enc.encode(rows(4, 0)[::2], 1, first=0)
    with pytest.raises(TypeError, match="first"):  # no default: a forgotten one seeded every checksum 0
        enc.encode(rows(4, 0), 2)
    enc.close()
    enc.close()  # twice is harmless
