"""ChunkEncode: many chunks of steps compressed in one compiled call, with numcodecs' bundled LZ4 and Zstd.

`replay.chunk_codec.ChunkRing` compresses the chunks a commit fills with `ChunkEncode.encode`: one call
of `encode_chunks` (numba) runs the codec library's own C entry points (numcodecs' bundled LZ4 and LZ4
HC, ``ZSTD_compressCCtx``) over every chunk, with no Python per chunk. Chunk formats, by codec:

- ``"lz4"``: numcodecs' LZ4 format, the 4-byte little-endian decompressed size then one LZ4 block
  (``numcodecs.LZ4`` reads it; LZ4 HC writes the same block format, compressed harder);
- ``"zstd"``: one zstd frame with its content size (``numcodecs.Zstd`` reads it);
- ``"lz4dict"``: the chunk's first step kept raw as a key, each later step one LZ4 block compressed with
  the key as its dictionary (LZ4's own dictionary mode): ``C`` little-endian uint32 part ends (bytes
  after the header), then the parts. A sampled step costs one raw copy or one dictionary decode, whose
  matches into the key are long: busy frames that change little within a chunk decode fast. By default
  the steps are written by `replay.aligned_lz4`'s parse (every match at the key's same byte; level
  `ALIGNED`), not by LZ4 HC: it compresses Atari frames as well, several times faster, into blocks
  that decode faster.

A chunk that compresses to its raw size or more is stored raw instead (its length is then exactly the
raw chunk's bytes, which is how readers tell it, `stored_raw`: a compressed chunk is always shorter), so
a chunk never takes more than its raw bytes. Each chunk's checksum is XXH64 (zstd's bundled
``ZSTD_XXH64``) of its stored bytes seeded with its chunk index (`chunk_checksum`): over the stored bytes,
not the raw ones, as it is checked before decoding (restore, Ray transport: a decode of some rows cannot
check the whole raw chunk) and costs a pass over the fewer bytes; the seed ties the bytes to the chunk
they belong to.

`replay.chunk_decode` decompresses them.

Each `ChunkEncode` holds its codec state (the LZ4 state, or a ``ZSTD_CCtx`` freed by `close` or when
the object is collected); use one per thread.

>>> enc = ChunkEncode("lz4")
>>> blob, sizes, sums = enc.encode(rows, chunk=4, first=k)  # rows [n * 4, *shape]: chunks k .. k + n - 1
>>> # blob uint8 (the chunks one after another), sizes and checksums int64 [n]

References
----------
LZ4 block format and LZ4 HC (lz4.org); Zstandard (RFC 8878); xxHash (XXH64); numcodecs.
"""

from __future__ import annotations

import ctypes
import weakref

import llvmlite.binding as llvm
import numba as nb
import numcodecs.lz4
import numcodecs.zstd
import numpy as np

from graphrl.kernels.copies import copy_bytes
from replay.aligned_lz4 import ALIGNED, MIN_MATCH, encode_aligned
from replay.spec import CODECS

__all__ = [
    "LZ4DICT_LEVEL", "LZ4_LEVEL", "ZSTD_LEVEL", "ChunkEncode", "chunk_checksum", "encode_chunks",
    "stored_raw", "verify_chunks",
]

LZ4_LEVEL = 2  # LZ4 HC level for "lz4" (0: LZ4's fast mode, acceleration 1); docs/performance.md
ZSTD_LEVEL = 1  # zstd level for "zstd"
LZ4DICT_LEVEL = ALIGNED  # "lz4dict" steps: ALIGNED (-1), 0 LZ4 fast, 1-12 LZ4 HC; docs/performance.md
_LZ4, _ZSTD, _LZ4DICT = 0, 1, 2
_KIND = {"lz4": _LZ4, "zstd": _ZSTD, "lz4dict": _LZ4DICT}
_HEADER = 4  # numcodecs' LZ4 prefix: the decompressed size, uint32 little-endian


def _symbols() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """Register the compressors of numcodecs' extension modules with the JIT's linker."""
    lz4 = ctypes.CDLL(numcodecs.lz4.__file__)
    zstd = ctypes.CDLL(numcodecs.zstd.__file__)
    for lib, names in (
        (lz4, ("LZ4_compress_HC_extStateHC_fastReset", "LZ4_compress_fast_extState", "LZ4_loadDictHC",
               "LZ4_compress_HC_continue", "LZ4_loadDict", "LZ4_compress_fast_continue",
               "LZ4_resetStreamHC_fast")),
        (zstd, ("ZSTD_compressCCtx", "ZSTD_XXH64")),
    ):
        for name in names:
            llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    lz4.LZ4_initStreamHC.restype = ctypes.c_void_p
    lz4.LZ4_initStreamHC.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lz4.LZ4_initStream.restype = ctypes.c_void_p
    lz4.LZ4_initStream.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    zstd.ZSTD_createCCtx.restype = ctypes.c_void_p
    zstd.ZSTD_freeCCtx.argtypes = [ctypes.c_void_p]
    zstd.ZSTD_compressBound.restype = ctypes.c_size_t
    zstd.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
    return lz4, zstd


_LIB_LZ4, _LIB_ZSTD = _symbols()
_i32 = nb.types.int32
_lz4_hc = nb.types.ExternalFunction(
    "LZ4_compress_HC_extStateHC_fastReset",
    _i32(nb.types.voidptr, nb.types.voidptr, nb.types.voidptr, _i32, _i32, _i32),
)
_lz4_fast = nb.types.ExternalFunction(
    "LZ4_compress_fast_extState",
    _i32(nb.types.voidptr, nb.types.voidptr, nb.types.voidptr, _i32, _i32, _i32),
)
_vp = nb.types.voidptr
_lz4_load_dict_hc = nb.types.ExternalFunction("LZ4_loadDictHC", _i32(_vp, _vp, _i32))
_lz4_reset_hc = nb.types.ExternalFunction("LZ4_resetStreamHC_fast", nb.types.void(_vp, _i32))
_lz4_hc_continue = nb.types.ExternalFunction("LZ4_compress_HC_continue", _i32(_vp, _vp, _vp, _i32, _i32))
_lz4_load_dict = nb.types.ExternalFunction("LZ4_loadDict", _i32(_vp, _vp, _i32))
_lz4_fast_continue = nb.types.ExternalFunction("LZ4_compress_fast_continue",
                                               _i32(_vp, _vp, _vp, _i32, _i32, _i32))
_zstd_compress = nb.types.ExternalFunction(
    "ZSTD_compressCCtx",
    nb.types.uint64(nb.types.uintp, nb.types.voidptr, nb.types.uint64, nb.types.voidptr, nb.types.uint64,
                    _i32),
)

_xxh64 = nb.types.ExternalFunction(
    "ZSTD_XXH64", nb.types.uint64(nb.types.voidptr, nb.types.uintp, nb.types.uint64)
)


@nb.njit(cache=True, nogil=True)
def chunk_checksum(data, at, size, k):  # pragma: no cover - numba
    """The checksum of chunk ``k`` stored as ``data[at : at + size]``: XXH64 (zstd's ``ZSTD_XXH64``)
    seeded with ``k``. Numba-compiled; callable from Python.

    Parameters
    ----------
    data : numpy.ndarray, uint8, contiguous
        Bytes holding the chunk (an arena, a blob).
    at, size : int
        The chunk's byte offset in ``data`` and its stored length in bytes.
    k : int
        The chunk's index (the seed: the same bytes as another chunk give another checksum).

    Returns
    -------
    numpy.int64
        The XXH64 digest's 64 bits as int64.

    Raises
    ------
    Nothing: bounds are not checked (a compiled kernel trusts its input); the caller keeps
    ``0 <= at``, ``0 <= size <= data.size - at`` (`verify_chunks` does).
    """
    return np.int64(_xxh64(data[at:].ctypes.data, size, np.uint64(k)))


@nb.njit(cache=True, nogil=True)
def stored_raw(length, raw_bytes):  # pragma: no cover - numba
    """Whether a chunk stored as ``length`` bytes is stored raw: `encode_chunks` stores a chunk that
    does not compress shorter than its ``raw_bytes`` raw bytes as those bytes, and a compressed chunk
    is always shorter. Numba-compiled; callable from Python and from compiled readers."""
    return length == raw_bytes


@nb.njit(cache=True, nogil=True)
def verify_chunks(blob, ks, sizes, sums):  # pragma: no cover - numba
    """The first chunk record whose bytes run past ``blob`` or fail their `chunk_checksum`.
    Numba-compiled; callable from Python.

    Parameters
    ----------
    blob : numpy.ndarray, uint8 [sum of sizes], contiguous
        The chunks' stored bytes, one after another.
    ks, sizes, sums : numpy.ndarray, int64 [K]
        Per chunk, in blob order: chunk index, stored length in bytes, checksum.

    Returns
    -------
    int
        The first record ``i`` whose length is negative or runs past ``blob`` or whose checksum is not
        ``sums[i]``; -1 when all hold (bytes left over after the last are not checked).

    Raises
    ------
    Nothing: a bad record is reported by the returned index, never read past ``blob``.
    """
    at = 0
    for i in range(ks.shape[0]):
        n = sizes[i]
        if n < 0 or n > blob.shape[0] - at or chunk_checksum(blob, at, n, ks[i]) != sums[i]:  # no overflow
            return i
        at += n
    return -1


@nb.njit(cache=True, nogil=True)
def _encode_dict(level, state, src, steps, row_bytes, dst, cap):  # pragma: no cover - numba
    """One "lz4dict" chunk of ``steps`` rows of ``src`` into ``dst`` (``cap`` bytes); its size, or -1."""
    hdr = 4 * steps
    at = hdr + row_bytes
    if at > cap:
        return -1
    dst[hdr:at] = src[:row_bytes]
    key = src.ctypes.data
    for i in range(steps):
        if i > 0:
            s = src[i * row_bytes :].ctypes.data
            d = dst[at:].ctypes.data
            if level < 0:  # the aligned parse: matches at the key's same byte only
                got = encode_aligned(src, i * row_bytes, src, 0, row_bytes, MIN_MATCH, dst, at, cap)
                got = got - at if got >= 0 else -1
            elif level > 0:  # the key as dictionary (loading it resets the state, keeping the level)
                _lz4_reset_hc(state.ctypes.data, level)
                _lz4_load_dict_hc(state.ctypes.data, key, row_bytes)
                got = _lz4_hc_continue(state.ctypes.data, s, d, row_bytes, cap - at)
            else:
                _lz4_load_dict(state.ctypes.data, key, row_bytes)
                got = _lz4_fast_continue(state.ctypes.data, s, d, row_bytes, cap - at, 1)
            if got <= 0:
                return -1
            at += got
        end = at - hdr
        for b in range(4):
            dst[4 * i + b] = (end >> (8 * b)) & 0xFF
    return at


@nb.njit(cache=True, nogil=True)
def encode_chunks(
    kind, level, state, zctx, src, n, chunk_bytes, bound, dst, sizes, sums, steps, first
):  # pragma: no cover - numba
    """Compress chunks ``src[i * chunk_bytes : (i + 1) * chunk_bytes]`` (``steps`` rows each, chunk
    index ``first + i``), i < n, into ``dst`` (uint8, at least ``n * bound`` bytes), one after another;
    ``sizes`` (int64 [n]) gets each one's bytes and ``sums`` (int64 [n]) its `chunk_checksum`. A chunk
    whose compressed form is not shorter than ``chunk_bytes`` is stored raw (``chunk_bytes`` long).

    ``kind`` 0: LZ4 (``level`` > 0: HC at that level in the initialised HC ``state``; 0: fast mode,
    acceleration 1, in the initialised fast ``state``), with numcodecs' 4-byte size prefix; 1: Zstd at
    ``level`` in the context ``zctx``; 2: "lz4dict" (the module docstring) with ``state`` as for 0.
    Returns the total bytes, or -1 - i when chunk i failed.
    """
    at = 0
    for i in range(n):
        s = src[i * chunk_bytes :]
        if kind == 0:
            v = chunk_bytes
            for b in range(4):
                dst[at + b] = (v >> (8 * b)) & 0xFF
            d = dst[at + 4 :]
            if level > 0:
                got = _lz4_hc(state.ctypes.data, s.ctypes.data, d.ctypes.data, chunk_bytes, bound - 4, level)
            else:
                got = _lz4_fast(state.ctypes.data, s.ctypes.data, d.ctypes.data, chunk_bytes, bound - 4, 1)
            if got <= 0:
                return -1 - i
            size = got + 4
        elif kind == 2:
            size = _encode_dict(level, state, s, steps, chunk_bytes // steps, dst[at:], bound)
            if size < 0:
                return -1 - i
        else:
            r = _zstd_compress(zctx, dst[at:].ctypes.data, bound, s.ctypes.data, chunk_bytes, level)
            if r > bound:  # a zstd error code (a huge size_t)
                return -1 - i
            size = np.int64(r)
        if size >= chunk_bytes:  # incompressible: raw (the length tells readers)
            copy_bytes(dst, at, s, 0, chunk_bytes)
            size = chunk_bytes
        sizes[i] = size
        sums[i] = chunk_checksum(dst, at, size, first + i)
        at += size
    return at


def _free_zstd(ctx: int) -> None:
    _LIB_ZSTD.ZSTD_freeCCtx(ctx)


class ChunkEncode:
    """The compressor of a codec field's chunks (see the module docstring).

    Parameters
    ----------
    codec : str
        ``"lz4"`` (LZ4 HC level `LZ4_LEVEL`), ``"zstd"`` (level `ZSTD_LEVEL`) or ``"lz4dict"`` (level
        `LZ4DICT_LEVEL`: the aligned parse).
    level : int or None
        Another level (LZ4: 0 for its fast mode, 1-12 HC; "lz4dict" also `ALIGNED`, -1; zstd: 1-22);
        None: the codec's default.

    Raises
    ------
    ValueError
        ``codec`` not one of `replay.spec.CODECS`, or ``level`` out of its range.
    MemoryError
        zstd could not allocate its context.
    """

    def __init__(self, codec: str, level: int | None = None) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
        self.codec = codec
        self.kind = _KIND[codec]
        if level is None:
            level = {"lz4": LZ4_LEVEL, "zstd": ZSTD_LEVEL, "lz4dict": LZ4DICT_LEVEL}[codec]
        low, top = {"lz4": (0, 12), "zstd": (1, 22), "lz4dict": (ALIGNED, 12)}[codec]
        if not low <= level <= top:
            raise ValueError(f"level of {codec} must be in [{low}, {top}], got {level!r}")
        self.level = int(level)
        self.zctx = 0
        self.state = np.zeros(0, np.uint64)
        if self.kind == _ZSTD:
            self.zctx = int(_LIB_ZSTD.ZSTD_createCCtx() or 0)
            if not self.zctx:
                raise MemoryError("ZSTD_createCCtx returned NULL")
            self._finalizer = weakref.finalize(self, _free_zstd, self.zctx)
        else:  # the LZ4 state, initialised once (each chunk then resets it cheaply)
            hc = self.level > 0
            size = _LIB_LZ4.LZ4_sizeofStateHC() if hc else _LIB_LZ4.LZ4_sizeofState()
            self.state = np.zeros((size + 7) // 8, np.uint64)
            init = _LIB_LZ4.LZ4_initStreamHC if hc else _LIB_LZ4.LZ4_initStream
            if not init(self.state.ctypes.data, size):
                raise MemoryError(f"LZ4 could not initialise its state of {size} bytes")

    def bound(self, chunk_bytes: int, steps: int = 1) -> int:
        """The most bytes one compressed chunk of ``chunk_bytes`` raw bytes (``steps`` rows) can take."""
        if self.kind == _LZ4:
            return _HEADER + chunk_bytes + chunk_bytes // 255 + 16
        if self.kind == _LZ4DICT:
            row = chunk_bytes // steps
            return 4 * steps + row + (steps - 1) * (row + row // 255 + 16)
        return int(_LIB_ZSTD.ZSTD_compressBound(chunk_bytes))

    def encode(
        self, rows: np.ndarray, chunk: int, first: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Compress ``rows`` ``[n * chunk, ...]`` (C-contiguous) as n chunks of ``chunk`` rows, chunk
        indices ``first .. first + n - 1`` (the checksums' seeds: required, as a wrong one makes every
        checksum fail where the chunk is read back).

        Returns the chunks' bytes one after another (uint8), each one's length and each one's
        `chunk_checksum` (int64 [n] both).

        Raises
        ------
        ValueError
            ``rows`` not C-contiguous or not a whole number of chunks.
        RuntimeError
            The codec library reported an error.
        """
        if not rows.flags.c_contiguous or rows.shape[0] % chunk:
            raise ValueError(
                f"rows must be C-contiguous and a multiple of chunk={chunk} long, got shape {rows.shape}"
            )
        n = rows.shape[0] // chunk
        src = rows.reshape(-1).view(np.uint8)
        chunk_bytes = src.size // n if n else 0
        bound = self.bound(chunk_bytes, chunk)
        dst = np.empty(n * bound, np.uint8)
        sizes = np.empty(n, np.int64)
        sums = np.empty(n, np.int64)
        if n == 0:
            return dst, sizes, sums
        got = encode_chunks(self.kind, self.level, self.state, self.zctx, src, n, chunk_bytes, bound, dst,
                            sizes, sums, chunk, first)
        if got < 0:
            raise RuntimeError(f"{self.codec} failed to compress chunk {-1 - got} of {n}")
        return dst[:got], sizes, sums

    def close(self) -> None:
        """Free the zstd context (no `encode` may run any more)."""
        if self.zctx:
            self._finalizer()
            self.zctx = 0
