"""Neighbour-sampling kernels for NVIDIA GPUs (numba.cuda): arrays in, arrays out.

They follow the specification in `samplers.kernels.reference` (same RNG stream, same choice of
positions, same output order), so their blocks equal the CPU kernels' bit for bit: uniform draws
without replacement (Floyd's algorithm, run by one thread on the row's draws in order), with
replacement (each draw computed from the row's counter), fanout -1, and weighted rows without edge
times (successive sampling by rejection over the per-row float64 prefix sums ``CudaGraph.prefix``, one
thread per row: only multiplications, additions and comparisons, so the same numbers as the CPU's).
Temporal rows draw the reference's float64 exponential keys; GPU ``log`` may differ from the C
library's in the last bit, so a key that ties to the last bit can rarely order differently on a real
GPU (under the CUDA simulator they are identical).

Layout of one layer (DESIGN §3). Uniform layers with 0 <= fanout <= ``THREAD_FANOUT_MAX`` (the usual
minibatch fanouts) run one thread per destination row in two kernels: ``_plan_rows`` counts each row's
outputs, a device scan gives the output offsets (reading the total back, to size the outputs, is the
layer's one synchronisation before relabelling), and ``_sample_rows`` chooses the row's positions (the
same draws as below, Floyd's subset kept in a per-thread array) and writes their sources and edge ids
in the same pass. Every array comes from torch's caching allocator when torch has CUDA (no
``cudaMalloc``/``cudaFree`` per batch). Other layers (fanout -1 or above the limit, weights, edge
times) run one 32-thread block (a warp) per destination row, grid-stride over rows, for the passes that
work per row, and one thread per edge for the gather and relabelling passes:

1. plan: each row's start, degree (masked: the count of eligible edges, a warp reduction)
   and output count; a device scan gives the output offsets (one copy of the total to the host to
   size the outputs).
2. choose: take-all rows are copied by all lanes; with replacement each lane draws positions
   ``mix(state0 + (j + 1) * GOLDEN)``; without replacement lane 0 runs Floyd's algorithm keeping the
   chosen slots sorted in the output (the subset is the same as the CPU's mask/bitmap/hash variants
   choose, which only store it differently); temporal rows without replacement take the k smallest
   exponential keys in k rounds of a warp-wide arg-min above the previous pick (keys are recomputed,
   so no per-edge scratch); with replacement they invert float64 prefix sums that lane 0 writes
   to scratch in position order, each lane binary-searching its own draws. (Weighted rows without
   times and fanout >= 0 run ``_sample_rows_weighted``, a thread per row, instead.)
3. gather: each thread reads one chosen edge's source and edge id (from device memory, or in place from
   page-locked host memory through UVA).
4. relabel: a GPU open-addressing hash table keyed by node id holds, per node, the smallest index at
   which it occurs in (destinations, sampled sources) (``atomic.cas`` to claim a slot,
   ``atomic.min`` for the index); an edge is a node's first occurrence iff the table holds its own
   index; a scan of those flags numbers the new nodes in first-occurrence order. So the local ids do
   not depend on thread timing and equal the CPU's.

Excluded edges (link prediction) follow the reference: each row finds its range of the sorted excluded
positions by binary search; uniform rows choose virtual positions over the non-excluded ones and map
them back (a binary search per output), masked rows skip excluded positions.

Temporal sampling follows the reference's masked rules, as on the CPU: with edge times every row (with
or without weights) goes through the masked plan and choose kernels, where a position is eligible only if
its edge time is <= the row's time (weight 1 without weights); rows draw A-ES keys without replacement
and invert prefix sums with replacement, exactly as weighted rows do. Relabelling keys on (node, time):
each sampled edge takes its row's time key (int64 times as they are, float64 times by their bit pattern,
-0.0 folded into 0.0 once for the seeds), and the hash table's slots hold the index of the entry that
claimed them (a (node, time) pair is two words, too wide for one compare-and-swap), compared through the
input arrays; the smallest index per pair again fixes first-occurrence order.

Importing this module imports ``numba.cuda``; choose the simulator with ``NUMBA_ENABLE_CUDASIM=1``
before that. `require_cuda` raises a clear error where no GPU is usable.

References
----------
Bentley and Floyd, "Programming pearls: a sample of brilliance" (CACM 1987), Floyd's algorithm;
Efraimidis and Spirakis (IPL 2006), A-ES exponential keys, as in GraphBolt's GPU sampler; Pandey et
al., C-SAW (SC 2020) and gSampler (SOSP 2023) for warp-per-row GPU sampling; Min et al., PyTorch-Direct
(PVLDB 2021) for reading pinned host memory from kernels (UVA).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch
from numba import cuda

from samplers.kernels.reference import GOLDEN as _GOLDEN_INT
from samplers.kernels.reference import REJECT_LIMIT as _REJECT_LIMIT
from samplers.kernels.reference import layer_key

__all__ = ["CudaGraph", "require_cuda", "sample_layer_cuda", "relabel_cuda", "sample_block_cuda",
           "relabel_temporal_cuda", "sample_block_temporal_cuda", "layer_key", "exclusive_scan", "KERNELS"]

WARP = 32
_SIM = bool(numba.config.ENABLE_CUDASIM)  # the simulator runs a thread per Python thread: small blocks
SCAN_THREADS = 32 if _SIM else 256
SCAN_ITEMS = 2 if _SIM else 8  # items per scan thread
SCAN_CHUNK = SCAN_THREADS * SCAN_ITEMS
_EDGE_THREADS = 32 if _SIM else 256
_ROW_THREADS = 32 if _SIM else 128  # thread-per-row kernels: long loops per thread, smaller blocks
# the simulator starts a Python thread per GPU thread: few blocks (the kernels stride over rows and edges)
_MAX_ROW_BLOCKS = 2 if _SIM else 65_535 * 4
REJECT_LIMIT = _REJECT_LIMIT
THREAD_FANOUT_MAX = 64  # uniform layers with 0 <= fanout <= this run one thread per row (`_sample_rows`)

_GOLDEN = np.uint64(_GOLDEN_INT)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LO32 = np.uint64(0xFFFFFFFF)
_TWO_M53 = 2.0 ** -53
_EMPTY = np.int64(-1)
_NO_INDEX = np.int64(np.iinfo(np.int64).max)


def require_cuda() -> None:
    """Raise unless numba.cuda can run kernels here (a GPU and driver, or the simulator).

    Raises
    ------
    RuntimeError
        No usable CUDA device: the message says so and names the remedy (``device="cpu"``).
    """
    if not cuda.is_available():
        raise RuntimeError("device='cuda' needs a CUDA GPU with a working driver, and numba.cuda finds none "
                           "here (numba.cuda.is_available() is False); use device='cpu' (same semantics)")


def check_device_index(device: Any) -> None:
    """Raise unless ``device`` (a CUDA ``torch.device``) is the current CUDA device, the one the kernels
    and torch's allocations use: ``cuda`` without an index always is.

    Raises
    ------
    ValueError
        ``cuda:N`` for another GPU, or for one that does not exist (the message names the current one
        and how to choose it), instead of sampling silently on the current device.
    """
    if device.index is None:
        return
    get = getattr(cuda, "get_current_device", None)  # the simulator has one device and no such function
    current = get().id if get is not None else 0
    if _torch_dtypes() and torch.cuda.current_device() != current:
        raise ValueError(f"device={str(device)!r}: torch's current CUDA device (cuda:"
                         f"{torch.cuda.current_device()}) and numba's (cuda:{current}) differ; make them "
                         "the same (torch.cuda.set_device, numba.cuda.select_device) or CUDA_VISIBLE_DEVICES")
    if device.index != current:
        raise ValueError(f"device={str(device)!r}: the samplers run on the current CUDA device "
                         f"(cuda:{current}); make cuda:{device.index} current first (torch.cuda.set_device, "
                         "numba.cuda.select_device) or give each process its GPU with CUDA_VISIBLE_DEVICES")


# --------------------------------------------------------------------------------- device helpers
@cuda.jit(device=True)
def _mix(z):  # pragma: no cover - device
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@cuda.jit(device=True)
def _bounded(r, n):  # pragma: no cover - device
    """floor(r * n / 2^64) for uint64 r, n (the high word of the 128-bit product)."""
    a = r >> np.uint64(32)
    b = r & _LO32
    if n <= _LO32:
        return np.int64((a * n + ((b * n) >> np.uint64(32))) >> np.uint64(32))
    c = n >> np.uint64(32)
    d = n & _LO32
    bd = b * d
    ad = a * d
    bc = b * c
    mid = (bd >> np.uint64(32)) + (ad & _LO32) + (bc & _LO32)
    return np.int64(a * c + (ad >> np.uint64(32)) + (bc >> np.uint64(32)) + (mid >> np.uint64(32)))


@cuda.jit(device=True)
def _row_state(key, node):  # pragma: no cover - device
    return _mix(key ^ (np.uint64(node) * _GOLDEN))


@cuda.jit(device=True)
def _draw(state0, j):  # pragma: no cover - device
    """The (j + 1)-th draw of a row's stream: mix(state0 + (j + 1) * GOLDEN)."""
    return _mix(state0 + np.uint64(j + 1) * _GOLDEN)


@cuda.jit(device=True)
def _count(deg, fanout, replace):  # pragma: no cover - device
    if fanout < 0 or (not replace and deg <= fanout):
        return deg
    if deg == 0:
        return np.int64(0)
    return fanout


@cuda.jit(device=True)
def _key_less(ka, pa, kb, pb):  # pragma: no cover - device
    return ka < kb or (ka == kb and pa < pb)


@cuda.jit(device=True)
def _sort_range(arr, lo, hi):  # pragma: no cover - device
    """Insertion sort of arr[lo:hi] (short rows: one lane)."""
    for i in range(lo + 1, hi):
        x = arr[i]
        q = i
        while q > lo and arr[q - 1] > x:
            arr[q] = arr[q - 1]
            q -= 1
        arr[q] = x


# ----------------------------------------------------------------------------------------- scans
@cuda.jit
def _scan_blocks(inp, out, sums, n):  # pragma: no cover - device
    """Inclusive scan of each SCAN_CHUNK-long chunk of inp into out[1:] (out[0] = 0); chunk totals into
    sums. Each thread sums SCAN_ITEMS consecutive items, the block scans those sums in shared memory,
    then each thread writes its items' running totals."""
    tmp = cuda.shared.array(SCAN_THREADS, numba.int64)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * SCAN_CHUNK + t * SCAN_ITEMS
    own = np.int64(0)
    for q in range(SCAN_ITEMS):
        if base + q < n:
            own += inp[base + q]
    tmp[t] = own
    cuda.syncthreads()
    offset = 1
    while offset < SCAN_THREADS:
        v = tmp[t - offset] if t >= offset else 0
        cuda.syncthreads()
        tmp[t] += v
        cuda.syncthreads()
        offset *= 2
    run = tmp[t] - own
    for q in range(SCAN_ITEMS):
        if base + q < n:
            run += inp[base + q]
            out[base + q + 1] = run
    if base == 0:
        out[0] = 0
    if t == SCAN_THREADS - 1:
        sums[cuda.blockIdx.x] = tmp[t]


@cuda.jit
def _scan_add(out, offsets, n):  # pragma: no cover - device
    """out[i + 1] += offsets[chunk of i]: the exclusive scan of the chunk totals."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        out[i + 1] += offsets[i // SCAN_CHUNK]
        i += stride


@cuda.jit
def _fill(arr, value):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < arr.shape[0]:
        arr[i] = value
        i += stride


def _scan_into(counts: Any, out: Any, n: int) -> None:
    """out[0] = 0, out[i + 1] = counts[0] + ... + counts[i], on the device (no host round trip: the
    chunk totals are scanned by the same kernels, recursively)."""
    chunks = (n + SCAN_CHUNK - 1) // SCAN_CHUNK
    sums = empty(chunks, np.int64)
    _launch(_scan_blocks, (chunks, SCAN_THREADS), counts, out, sums, n)
    if chunks > 1:
        offsets = empty(chunks + 1, np.int64)
        _scan_into(sums, offsets, chunks)
        _launch(_scan_add, (_grid(n, _EDGE_THREADS), _EDGE_THREADS), out, offsets, n)


def exclusive_scan(counts: Any) -> tuple[Any, int]:
    """Offsets of ``counts`` (a device int64 array [n]): a device int64 array [n + 1] and its total.

    The scan stays on the device (``torch.cumsum`` where torch has CUDA: one launch; else these
    kernels); reading the total back (to size the next outputs) is the call's one synchronisation.
    """
    n = counts.shape[0]
    if _torch_dtypes():
        import torch

        out = torch.empty(n + 1, dtype=torch.int64, device="cuda")
        out[:1].zero_()
        if n:
            torch.cumsum(torch.as_tensor(counts, device="cuda"), 0, out=out[1:])
        return out, int(out[n]) if n else 0
    out = empty(n + 1, np.int64)
    if n == 0:
        _launch(_fill, (1, 1), out, np.int64(0))
        return out, 0
    _scan_into(counts, out, n)
    return out, int(out[n:].copy_to_host()[0])


def empty(n: int, dtype: Any) -> Any:
    """An uninitialised device array [n] of a numpy (or torch) dtype: a CUDA tensor from torch's caching
    allocator where torch has CUDA (a batch allocates a dozen arrays per layer: ``cudaMalloc`` and the
    synchronising ``cudaFree`` behind ``cuda.device_array`` would cost more than the kernels), else a
    numba device array (the simulator). Every function of this module takes either kind.
    torch works on its current stream, which must be the legacy default stream numba launches on
    (`default_stream` gives the samplers that context)."""
    dtypes = _torch_dtypes()
    if dtypes:
        return torch.empty(max(n, 0), dtype=dtypes[_np_dtype(dtype)], device="cuda")
    return cuda.device_array(n, dtype=_np_dtype(dtype))


def _np_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    return np.dtype(dtype)


def _is_float64(arr: Any) -> bool:
    return arr.dtype == (torch.float64 if isinstance(arr, torch.Tensor) else np.float64)


def _view_as(arr: Any, dtype: Any) -> Any:
    """The same 8-byte words as int64 or float64 (numpy dtype), for either kind of array."""
    if isinstance(arr, torch.Tensor):
        return arr.view(_torch_dtypes()[np.dtype(dtype)])
    return arr.view(dtype)


def _copy_into(out: Any, src: Any) -> None:
    """Device-to-device copy of ``src`` into ``out`` (same length), for either kind of array."""
    if isinstance(out, torch.Tensor):
        out.copy_(torch.as_tensor(src, device="cuda"))
    else:
        out.copy_to_device(src)


def concat(parts: list, dtype: Any) -> Any:
    """Device arrays of one dtype, concatenated into a new device array (a single part as it is)."""
    if len(parts) == 1:
        return parts[0]
    out = empty(sum(int(p.shape[0]) for p in parts), dtype)
    at = 0
    for part in parts:
        n = int(part.shape[0])
        if n:
            _copy_into(out[at:at + n], part)
        at += n
    return out


def _wrap(arr: Any) -> Any:
    """A numba view of a torch CUDA tensor (for numba's own launches); anything else as it is."""
    return cuda.as_cuda_array(arr, sync=False) if isinstance(arr, torch.Tensor) else arr


def _launch(kernel: Any, config: tuple[int, int], *args: Any) -> None:
    """Launch ``kernel`` with (grid, block) ``config``: through `_FastLauncher` where torch has CUDA and
    numba-cuda's launch internals are the ones it knows, else through numba's dispatcher."""
    launcher = _fast_launcher()
    if launcher is not None:
        launcher(kernel, config, args)
    else:
        kernel[config](*[_wrap(a) for a in args])


class _FastLauncher:
    """Launches compiled kernels with their argument words built straight from torch tensors and numba
    arrays (1-D, contiguous), skipping numba's per-launch typing and argument wrapping: on the H200
    machine those cost 50-100 us per launch and 20 us per wrapped tensor, more than the kernels of a
    minibatch layer. The first launch of each (kernel, argument kinds) goes through numba's dispatcher
    (which compiles it); later ones call ``cuda.core.launch`` on the compiled kernel with the words
    numba's own ``_Kernel._prepare_args`` would build (meminfo 0, parent 0, size, itemsize, data,
    shape, strides per array; ctypes scalars). Needs numba-cuda with the cuda.core launch path
    (0.30.4 on the H200 image)."""

    def __init__(self) -> None:
        from cuda.core import LaunchConfig, launch
        from numba.cuda.cudadrv import driver

        self._launch = launch
        self._config = LaunchConfig
        self._stream = driver._to_core_stream(0)
        self._compiled: dict = {}
        self._configs: dict = {}

    def __call__(self, kernel: Any, config: tuple[int, int], args: tuple) -> None:
        key = (kernel, tuple(_arg_kind(a) for a in args))
        entry = self._compiled.get(key)
        if entry is None:
            wrapped = [_wrap(a) for a in args]
            kernel[config](*wrapped)  # compiles this signature if needed; launches the normal way
            try:
                argtypes = tuple(kernel.typeof_pyval(a) for a in wrapped)
                compiled = kernel.overloads[argtypes]
                entry = (compiled._codelibrary.get_cufunc().kernel, [_packer(t) for t in argtypes])
            except (KeyError, AttributeError, TypeError) as err:  # numba-cuda internals not as expected
                name = getattr(getattr(kernel, "py_func", None), "__name__", "a kernel")
                warnings.warn(f"samplers.kernels.cuda: the fast launcher cannot read {name}'s compiled code "
                              f"({type(err).__name__}: {err}); it launches through numba's dispatcher",
                              RuntimeWarning, stacklevel=3)
                entry = False
            self._compiled[key] = entry
            return
        if entry is False:
            kernel[config](*[_wrap(a) for a in args])
            return
        function, packers = entry
        words: list = []
        for pack, arg in zip(packers, args, strict=True):
            pack(arg, words)
        cfg = self._configs.get(config)
        if cfg is None:
            if len(self._configs) > 4096:
                self._configs.clear()
            cfg = self._configs[config] = self._config(grid=int(config[0]), block=int(config[1]))
        self._launch(self._stream, cfg, function, *words)


def _arg_kind(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.dtype
    dtype = getattr(arg, "dtype", None)
    return (type(arg), None if dtype is None else dtype.str)


def _pack_array(arr: Any, words: list) -> None:
    if isinstance(arr, torch.Tensor):
        if arr.dim() != 1 or not arr.is_contiguous():
            raise ValueError(f"kernel arrays must be 1-D and contiguous, got shape {tuple(arr.shape)}")
        n, size = arr.shape[0], arr.element_size()
        words.extend((0, 0, n, size, arr.data_ptr(), n, size))
    else:
        n, size = arr.shape[0], arr.dtype.itemsize
        words.extend((0, 0, n, size, arr.__cuda_array_interface__["data"][0] or 0, n, arr.strides[0]))


def _packer(ty: Any) -> Any:
    """The word builder of one argument type (numba-cuda's ``_prepare_args`` rules)."""
    if hasattr(ty, "layout"):
        if ty.ndim != 1:
            raise TypeError(f"the fast launcher takes 1-D arrays, got {ty}")
        return _pack_array
    name = str(ty)
    if name == "bool":
        return lambda arg, words: words.append(bool(arg))
    if name == "float64":
        return lambda arg, words: words.append(ctypes.c_double(arg))
    ctype = getattr(ctypes, f"c_{name}")
    return lambda arg, words: words.append(ctype(int(arg)))


def _fast_launcher() -> _FastLauncher | None:
    """The fast launcher where torch has CUDA and numba-cuda's internals match (decided once; without
    them, one warning and numba's dispatcher; ``GRAPHRL_CUDA_LAUNCH=dispatcher`` forces the latter)."""
    if "launcher" not in _LAUNCHER:
        launcher = None
        if _torch_dtypes() and os.environ.get("GRAPHRL_CUDA_LAUNCH", "fast") != "dispatcher":
            try:
                launcher = _FastLauncher()
            except (ImportError, AttributeError) as err:
                warnings.warn(f"samplers.kernels.cuda: numba-cuda's cuda.core launch path is missing "
                              f"({err}); kernels launch through numba's dispatcher (50-100 us more each)",
                              RuntimeWarning, stacklevel=2)
        _LAUNCHER["launcher"] = launcher
    return _LAUNCHER["launcher"]


_LAUNCHER: dict = {}


@contextlib.contextmanager
def default_stream() -> Any:
    """A context in which torch's work (allocations, scans, fills of this module) is ordered with
    numba's launches: torch's default stream, the legacy default stream numba launches on. Where the
    caller works on another stream, the default stream first waits for it (the seeds it made), and on
    exit the caller's stream waits for the default stream (the blocks). A no-op without torch CUDA;
    the samplers run a whole ``sample`` in it."""
    if not _torch_dtypes():
        yield
        return
    caller, default = torch.cuda.current_stream(), torch.cuda.default_stream()
    if caller == default:
        yield
        return
    default.wait_stream(caller)
    with torch.cuda.stream(default):
        yield
    caller.wait_stream(default)


def full(n: int, value: int) -> Any:
    """A device int64 array [n] filled with ``value`` (``torch.full`` where torch has CUDA)."""
    if _torch_dtypes():
        return torch.full((n,), int(value), dtype=torch.int64, device="cuda")
    arr = cuda.device_array(n, dtype=np.int64)
    if n:
        _launch(_fill, (_grid(n, _EDGE_THREADS), _EDGE_THREADS), arr, np.int64(value))
    return arr


def _torch_dtypes() -> dict:
    """numpy -> torch dtypes where torch has CUDA (not under the simulator), else {}; decided once."""
    if not _TORCH_DTYPES:
        usable = torch.cuda.is_available() and not _SIM
        _TORCH_DTYPES["usable"] = usable
        if usable:
            _TORCH_DTYPES.update({np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                                  np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32})
    return _TORCH_DTYPES if _TORCH_DTYPES["usable"] else {}


_TORCH_DTYPES: dict = {}


# ------------------------------------------------------------------------------------------ plan
@cuda.jit(device=True)
def _lower_bound(arr, lo, hi, x):  # pragma: no cover - device
    """First index in [lo, hi) of the sorted arr whose value is >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True)
def _row_span(indptr, excl, n_excl, v):  # pragma: no cover - device
    """Row v's CSC range [s, e) and the range [a, b) of its positions in the sorted excluded array."""
    s = indptr[v]
    e = indptr[v + 1]
    a = np.int64(0)
    b = np.int64(0)
    if n_excl:
        a = _lower_bound(excl, 0, n_excl, s)
        b = _lower_bound(excl, a, n_excl, e)
    return s, e, a, b


@cuda.jit(device=True)
def _excluded(excl, a, b, p):  # pragma: no cover - device
    """Whether CSC position p is among the row's excluded positions excl[a:b]."""
    if a == b:
        return False
    q = _lower_bound(excl, a, b, p)
    return q < b and excl[q] == p


@cuda.jit(device=True)
def _eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):  # pragma: no cover - device
    """Whether CSC position p may be drawn in a masked row: positive weight (with weights), time <= the
    row's time (with times), and not among the row's excluded positions excl[a:b]."""
    if has_w and not weights[p] > 0:
        return False
    if has_t and not times[p] <= t_row:
        return False
    return not _excluded(excl, a, b, p)


@cuda.jit(device=True)
def _virtual_to_real(excl, a, b, s, p):  # pragma: no cover - device
    """Virtual position p (over the row's non-excluded positions) -> CSC position:
    s + p + #{q in [a, b) : excl[q] - s - (q - a) <= p} (that sequence is non-decreasing in q)."""
    lo = a
    hi = b
    while lo < hi:
        mid = (lo + hi) >> 1
        if excl[mid] - s - (mid - a) <= p:
            lo = mid + 1
        else:
            hi = mid
    return s + p + (lo - a)


@cuda.jit
def _plan_uniform(indptr, dst, fanout, replace, excl, row_start, row_deg, row_exlo, row_exhi,
                  counts):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        a = _lower_bound(excl, 0, n_excl, s)
        b = _lower_bound(excl, a, n_excl, e)
        d = e - s - (b - a)
        row_start[i] = s
        row_deg[i] = d
        row_exlo[i] = a
        row_exhi[i] = b
        counts[i] = _count(d, fanout, replace)
        i += stride


@cuda.jit
def _plan_masked(indptr, dst, fanout, replace, weights, has_w, times, row_time, has_t, excl, row_start,
                 row_raw, row_deg, row_exlo, row_exhi, counts):  # pragma: no cover - device
    """Masked rows (weights and/or times): each row's eligible count by a warp reduction."""
    part = cuda.shared.array(WARP, numba.int64)
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    n_excl = excl.shape[0]
    while row < dst.shape[0]:
        v = dst[row]
        s = indptr[v]
        e = indptr[v + 1]
        a = _lower_bound(excl, 0, n_excl, s)
        b = _lower_bound(excl, a, n_excl, e)
        t_row = row_time[row] if has_t else row_time[0]
        c = 0
        p = s + lane
        while p < e:
            if _eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                c += 1
            p += WARP
        part[lane] = c
        cuda.syncthreads()
        if lane == 0:
            total = 0
            for q in range(WARP):
                total += part[q]
            row_start[row] = s
            row_raw[row] = e - s
            row_deg[row] = total
            row_exlo[row] = a
            row_exhi[row] = b
            counts[row] = _count(total, fanout, replace)
        cuda.syncthreads()
        row += cuda.gridDim.x


# ---------------------------------------------------------------------------------------- choose
@cuda.jit
def _choose_uniform(dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key, excl, pos,
                    aux):  # pragma: no cover - device
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    draws = replace and fanout >= 0
    while row < dst.shape[0]:
        o = out_indptr[row]
        c = out_indptr[row + 1] - o
        deg = row_deg[row]
        s = row_start[row]
        a = row_exlo[row]
        b = row_exhi[row]
        shift = s if a == b else 0  # rows with excluded edges choose virtual positions, mapped below
        if c > 0:
            if c == deg and not draws:
                j = lane
                while j < c:
                    pos[o + j] = shift + j
                    j += WARP
            elif draws:
                state0 = _row_state(key, dst[row])
                j = lane
                while j < c:
                    pos[o + j] = shift + _bounded(_draw(state0, j), np.uint64(deg))
                    j += WARP
            elif lane == 0:
                # Floyd's m-subset, kept sorted in out[o:o + m]; m = k, or the d - k left out
                state = _row_state(key, dst[row])
                m = c if 2 * c <= deg else deg - c
                take = m == c
                for n in range(m):
                    j = deg - m + n
                    state += _GOLDEN
                    t = _bounded(_mix(state), np.uint64(j + 1))
                    taken = False
                    for q in range(o, o + n):
                        if (pos[q] if take else aux[q]) == t:
                            taken = True
                    x = j if taken else t
                    q = o + n
                    if take:
                        while q > o and pos[q - 1] > x:
                            pos[q] = pos[q - 1]
                            q -= 1
                        pos[q] = x
                    else:
                        while q > o and aux[q - 1] > x:
                            aux[q] = aux[q - 1]
                            q -= 1
                        aux[q] = x
                if take:
                    for q in range(o, o + c):
                        pos[q] += shift
                else:
                    q = o
                    w = o
                    for p in range(deg):
                        if q < o + m and aux[q] == p:
                            q += 1
                        else:
                            pos[w] = shift + p
                            w += 1
            if a < b:  # map virtual positions to CSC positions, each lane its own outputs
                cuda.syncthreads()
                j = lane
                while j < c:
                    pos[o + j] = _virtual_to_real(excl, a, b, s, pos[o + j])
                    j += WARP
        cuda.syncthreads()
        row += cuda.gridDim.x


@cuda.jit
def _choose_masked(dst, row_start, row_raw, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key,
                   weights, has_w, times, row_time, has_t, excl, pos, scratch,
                   scratch_off):  # pragma: no cover - device
    """Masked rows: every eligible position, A-ES keys (k warp-wide arg-mins), or prefix-sum inversion."""
    bkey = cuda.shared.array(WARP, numba.float64)
    bpos = cuda.shared.array(WARP, numba.int64)
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    draws = replace and fanout >= 0
    while row < dst.shape[0]:
        o = out_indptr[row]
        c = out_indptr[row + 1] - o
        s = row_start[row]
        d = row_raw[row]
        e = s + d
        a = row_exlo[row]
        b = row_exhi[row]
        t_row = row_time[row] if has_t else row_time[0]
        if c > 0:
            if not draws and c == row_deg[row]:
                if lane == 0:  # every eligible edge, in order
                    w = o
                    for p in range(s, e):
                        if _eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            pos[w] = p
                            w += 1
            elif not draws:
                # A-ES: the c smallest (key, position) pairs, one warp-wide arg-min per pick
                state0 = _row_state(key, dst[row])
                prev_k = -1.0
                prev_p = np.int64(-1)
                for r in range(c):
                    best_k = math.inf
                    best_p = _NO_INDEX
                    p = s + lane
                    while p < e:
                        if _eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            wp = np.float64(weights[p]) if has_w else 1.0
                            u = (np.float64(_draw(state0, p - s) >> np.uint64(11)) + 1.0) * _TWO_M53
                            k = -math.log(u) / wp
                            if _key_less(prev_k, prev_p, k, p) and _key_less(k, p, best_k, best_p):
                                best_k = k
                                best_p = p
                        p += WARP
                    bkey[lane] = best_k
                    bpos[lane] = best_p
                    cuda.syncthreads()
                    if lane == 0:
                        for q in range(1, WARP):
                            if _key_less(bkey[q], bpos[q], bkey[0], bpos[0]):
                                bkey[0] = bkey[q]
                                bpos[0] = bpos[q]
                        pos[o + r] = bpos[0]
                    cuda.syncthreads()
                    prev_k = bkey[0]
                    prev_p = bpos[0]
                    cuda.syncthreads()
                if lane == 0:
                    _sort_range(pos, o, o + c)
            else:
                # inverse CDF over float64 prefix sums written by lane 0 in position order
                so = scratch_off[row]
                if lane == 0:
                    total = 0.0
                    last = s
                    for p in range(s, e):
                        if _eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            total += np.float64(weights[p]) if has_w else 1.0
                            last = p
                        scratch[so + p - s] = total
                    bpos[0] = last
                cuda.syncthreads()
                total = scratch[so + d - 1]
                last = bpos[0]
                state0 = _row_state(key, dst[row])
                j = lane
                while j < c:
                    x = (np.float64(_draw(state0, j) >> np.uint64(11)) * _TWO_M53) * total
                    lo = np.int64(0)
                    z = d
                    while lo < z:
                        mid = (lo + z) >> 1
                        if scratch[so + mid] > x:
                            z = mid
                        else:
                            lo = mid + 1
                    pos[o + j] = s + lo if lo < d else last
                    j += WARP
                cuda.syncthreads()
        row += cuda.gridDim.x


# ------------------------------------------------------------- uniform rows, one thread per row
@cuda.jit
def _plan_rows(indptr, dst, fanout, replace, excl, counts):  # pragma: no cover - device
    """Output count of each row (uniform rules, excluded positions removed): one thread per row."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        d = e - s
        if n_excl:
            a = _lower_bound(excl, 0, n_excl, s)
            d -= _lower_bound(excl, a, n_excl, e) - a
        counts[i] = _count(d, fanout, replace)
        i += stride


@cuda.jit(device=True)
def _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, j):  # pragma: no cover - device
    """Write output j for virtual position p of a row starting at CSC position s."""
    q = s + p if a == b else _virtual_to_real(excl, a, b, s, p)
    src[j] = indices[q]
    eids[j] = edge_ids[q] if has_eids else q


@cuda.jit
def _sample_rows(indptr, indices, edge_ids, has_eids, dst, out_indptr, fanout, replace, key, excl, src,
                 eids):  # pragma: no cover - device
    """Uniform rows with 0 <= fanout <= THREAD_FANOUT_MAX, one thread per row, positions chosen and
    their sources and edge ids gathered in one pass (no position array). Floyd's subset lives in a
    per-thread array, insertion-sorted; the choices are the reference's, so the blocks equal the CPU's."""
    sub = cuda.local.array(THREAD_FANOUT_MAX, numba.int64)
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c > 0:
            v = dst[i]
            s, e, a, b = _row_span(indptr, excl, n_excl, v)
            deg = e - s - (b - a)
            if replace:
                state0 = _row_state(key, v)
                for j in range(c):
                    p = _bounded(_draw(state0, j), np.uint64(deg))
                    _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, o + j)
            elif c == deg:
                for j in range(c):
                    _emit(indices, edge_ids, has_eids, excl, a, b, s, j, src, eids, o + j)
            else:
                # Floyd's m-subset, sorted; m = c, or the deg - c positions left out
                state = _row_state(key, v)
                m = c if 2 * c <= deg else deg - c
                for n in range(m):
                    j = deg - m + n
                    state += _GOLDEN
                    t = _bounded(_mix(state), np.uint64(j + 1))
                    x = t
                    for q in range(n):
                        if sub[q] == t:
                            x = j
                            break
                    q = n
                    while q > 0 and sub[q - 1] > x:
                        sub[q] = sub[q - 1]
                        q -= 1
                    sub[q] = x
                if m == c:
                    for j in range(c):
                        _emit(indices, edge_ids, has_eids, excl, a, b, s, sub[j], src, eids, o + j)
                else:
                    q = 0
                    w = o
                    for p in range(deg):
                        if q < m and sub[q] == p:
                            q += 1
                        else:
                            _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, w)
                            w += 1
        i += stride


# ------------------------------------------------ weighted rows (no edge times), one thread per row
@cuda.jit
def _plan_rows_weighted(positive, weights, indptr, dst, fanout, replace, excl, counts):  # pragma: no cover
    """Output count of each weighted row: d_e = the row's positive weights (``positive``) minus its
    excluded positions of positive weight; no other weight is read."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        v = dst[i]
        d = positive[v]
        if n_excl:
            s = indptr[v]
            e = indptr[v + 1]
            a = _lower_bound(excl, 0, n_excl, s)
            b = _lower_bound(excl, a, n_excl, e)
            for q in range(a, b):
                if weights[excl[q]] > 0:
                    d -= 1
        counts[i] = _count(d, fanout, replace)
        i += stride


@cuda.jit(device=True)
def _unit_draw(state0, t):  # pragma: no cover - device
    """[0, 1) from draw t of a row's stream: the top 53 bits times 2^-53."""
    return np.float64(_mix(state0 + np.uint64(t) * _GOLDEN) >> np.uint64(11)) * _TWO_M53


@cuda.jit(device=True)
def _taken(chosen, o, j, p):  # pragma: no cover - device
    for q in range(o, o + j):
        if chosen[q] == p:
            return True
    return False


@cuda.jit
def _sample_rows_weighted(indptr, indices, edge_ids, has_eids, weights, prefix, positive, dst, out_indptr,
                          fanout, replace, key, excl, src, eids):  # pragma: no cover - device
    """Weighted rows without edge times, 0 <= fanout, one thread per row (the reference's "weighted
    rows"): successive sampling by rejection over the row's prefix sums ``prefix``, at most REJECT_LIMIT
    rejected attempts per output, then an exact draw from what remains. The chosen CSC positions are
    kept in ``eids[o:o + c]`` until the row is done, then replaced by sources and edge ids."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c > 0:
            v = dst[i]
            s, e, a, b = _row_span(indptr, excl, n_excl, v)
            d_e = positive[v]  # eligible positions, as the plan counted them (no pass over the row)
            for q in range(a, b):
                if weights[excl[q]] > 0:
                    d_e -= 1
            if not replace and d_e == c:  # every eligible position, in order
                j = o
                for p in range(s, e):
                    if weights[p] > 0 and not _excluded(excl, a, b, p):
                        eids[j] = p
                        j += 1
            else:
                state0 = _row_state(key, v)
                total = prefix[e - 1]
                t = np.int64(0)
                for j in range(c):
                    p = np.int64(-1)
                    for _attempt in range(REJECT_LIMIT):
                        t += 1
                        x = _unit_draw(state0, t) * total
                        lo = s
                        hi = e
                        while lo < hi:  # the smallest position with prefix > x
                            mid = (lo + hi) >> 1
                            if prefix[mid] > x:
                                hi = mid
                            else:
                                lo = mid + 1
                        q = lo
                        if q == e:  # rounding left no prefix above x: the row's last positive weight
                            q = e - 1
                            while q > s and not weights[q] > 0:
                                q -= 1
                        if not _excluded(excl, a, b, q) and (replace or not _taken(eids, o, j, q)):
                            p = q
                            break
                    if p < 0:  # exact draw from the eligible positions not chosen yet
                        t += 1
                        rest = 0.0
                        for q in range(s, e):
                            if weights[q] > 0 and not _excluded(excl, a, b, q) \
                                    and (replace or not _taken(eids, o, j, q)):
                                rest += np.float64(weights[q])
                        x = _unit_draw(state0, t) * rest
                        acc = 0.0
                        for q in range(s, e):
                            if weights[q] > 0 and not _excluded(excl, a, b, q) \
                                    and (replace or not _taken(eids, o, j, q)):
                                acc += np.float64(weights[q])
                                p = q
                                if acc > x:
                                    break
                    eids[o + j] = p
                if not replace:
                    _sort_range(eids, o, o + c)
            for j in range(o, o + c):
                p = eids[j]
                src[j] = indices[p]
                eids[j] = edge_ids[p] if has_eids else p
        i += stride


@cuda.jit
def _row_prefix(indptr, weights, prefix, positive):  # pragma: no cover - device
    """Per-row inclusive float64 prefix sums of the weights and positive counts, one thread per row,
    summed in position order (as `samplers.kernels.reference.weight_prefix`: the same numbers)."""
    v = cuda.grid(1)
    stride = cuda.gridsize(1)
    while v < indptr.shape[0] - 1:
        total = 0.0
        count = np.int64(0)
        for p in range(indptr[v], indptr[v + 1]):
            w = weights[p]
            total += np.float64(w)
            prefix[p] = total
            if w > 0:
                count += 1
        positive[v] = count
        v += stride


# ---------------------------------------------------------------------------------------- gather
@cuda.jit
def _gather(indices, edge_ids, has_eids, pos, src, eids):  # pragma: no cover - device
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    while j < pos.shape[0]:
        p = pos[j]
        src[j] = indices[p]
        eids[j] = edge_ids[p] if has_eids else p
        j += stride


# --------------------------------------------------------------------------------------- relabel
@cuda.jit(device=True)
def _slot(v, mask):  # pragma: no cover - device
    return np.int64(_mix(np.uint64(v)) & np.uint64(mask))


@cuda.jit
def _hash_insert(dst, src, keys, vals, mask):  # pragma: no cover - device
    """Claim a slot per distinct node; keep the smallest index of its occurrences."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    total = d_count + src.shape[0]
    while i < total:
        v = np.int64(dst[i]) if i < d_count else np.int64(src[i - d_count])
        h = _slot(v, mask)
        while True:
            prev = cuda.atomic.cas(keys, h, _EMPTY, v)
            if prev == _EMPTY or prev == v:
                cuda.atomic.min(vals, h, np.int64(i))
                break
            h = (h + 1) & mask
        i += stride


@cuda.jit
def _hash_first(src, d_count, keys, vals, mask, first, flags):  # pragma: no cover - device
    """first[j]: smallest index of src[j]'s node; flags[j] = 1 iff edge j is that first occurrence."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    while j < src.shape[0]:
        v = np.int64(src[j])
        h = _slot(v, mask)
        while keys[h] != v:
            h = (h + 1) & mask
        f = vals[h]
        first[j] = f
        flags[j] = 1 if f == d_count + j else 0
        j += stride


@cuda.jit
def _relabel_out(dst, src, first, flags, newid, src_nodes, local):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    total = d_count + src.shape[0]
    while i < total:
        if i < d_count:
            src_nodes[i] = dst[i]
        else:
            j = i - d_count
            f = first[j]
            local[j] = f if f < d_count else d_count + newid[f - d_count]
            if flags[j]:
                src_nodes[d_count + newid[j]] = src[j]
        i += stride


# ------------------------------------------------------------------------- relabel by (node, time)
@cuda.jit
def _edge_tkeys(out_indptr, dst_tkey, edge_tkey):  # pragma: no cover - device
    """Each sampled edge takes the time key of the row that drew it (a warp per row)."""
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < dst_tkey.shape[0]:
        t = dst_tkey[row]
        j = out_indptr[row] + lane
        end = out_indptr[row + 1]
        while j < end:
            edge_tkey[j] = t
            j += WARP
        row += cuda.gridDim.x


@cuda.jit(device=True)
def _pair_slot0(v, t, mask):  # pragma: no cover - device
    """Home slot of (node v, time key t): the hash of the CPU kernels' table."""
    return np.int64(_mix((np.uint64(v) * _GOLDEN) ^ np.uint64(t)) & np.uint64(mask))


@cuda.jit(device=True)
def _pair_at(dst, dst_tkey, src, edge_tkey, i):  # pragma: no cover - device
    """(node, time key) of entry i of (destinations, sampled sources)."""
    d_count = dst.shape[0]
    if i < d_count:
        return np.int64(dst[i]), dst_tkey[i]
    return np.int64(src[i - d_count]), edge_tkey[i - d_count]


@cuda.jit
def _hash_insert_pairs(dst, dst_tkey, src, edge_tkey, keys, vals, mask):  # pragma: no cover - device
    """Claim a slot per distinct (node, time key) pair; keep the smallest index of its occurrences.

    A slot's key is the index of the entry that claimed it (the pair itself is two words, too wide for
    one compare-and-swap); pairs are compared through the (immutable) input arrays."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    total = dst.shape[0] + src.shape[0]
    while i < total:
        v, t = _pair_at(dst, dst_tkey, src, edge_tkey, i)
        h = _pair_slot0(v, t, mask)
        while True:
            prev = cuda.atomic.cas(keys, h, _EMPTY, np.int64(i))
            if prev == _EMPTY:
                cuda.atomic.min(vals, h, np.int64(i))
                break
            pv, pt = _pair_at(dst, dst_tkey, src, edge_tkey, prev)
            if pv == v and pt == t:
                cuda.atomic.min(vals, h, np.int64(i))
                break
            h = (h + 1) & mask
        i += stride


@cuda.jit
def _hash_first_pairs(dst, dst_tkey, src, edge_tkey, keys, vals, mask, first, flags):  # pragma: no cover
    """first[j]: smallest index of edge j's (node, time) pair; flags[j] = 1 iff j is that first one."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    while j < src.shape[0]:
        v = np.int64(src[j])
        t = edge_tkey[j]
        h = _pair_slot0(v, t, mask)
        while True:
            pv, pt = _pair_at(dst, dst_tkey, src, edge_tkey, keys[h])
            if pv == v and pt == t:
                break
            h = (h + 1) & mask
        f = vals[h]
        first[j] = f
        flags[j] = 1 if f == d_count + j else 0
        j += stride


@cuda.jit
def _relabel_out_pairs(dst, dst_tkey, src, edge_tkey, first, flags, newid, src_nodes, src_tkey,
                       local):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    total = d_count + src.shape[0]
    while i < total:
        if i < d_count:
            src_nodes[i] = dst[i]
            src_tkey[i] = dst_tkey[i]
        else:
            j = i - d_count
            f = first[j]
            local[j] = f if f < d_count else d_count + newid[f - d_count]
            if flags[j]:
                src_nodes[d_count + newid[j]] = src[j]
                src_tkey[d_count + newid[j]] = edge_tkey[j]
        i += stride


KERNELS = {
    "scan_blocks": _scan_blocks, "scan_add": _scan_add, "fill": _fill, "plan_rows": _plan_rows,
    "sample_rows": _sample_rows, "row_prefix": _row_prefix, "plan_rows_weighted": _plan_rows_weighted,
    "sample_rows_weighted": _sample_rows_weighted, "plan_uniform": _plan_uniform,
    "plan_masked": _plan_masked, "choose_uniform": _choose_uniform, "choose_masked": _choose_masked,
    "gather": _gather, "hash_insert": _hash_insert, "hash_first": _hash_first, "relabel_out": _relabel_out,
    "edge_tkeys": _edge_tkeys, "hash_insert_pairs": _hash_insert_pairs, "hash_first_pairs": _hash_first_pairs,
    "relabel_out_pairs": _relabel_out_pairs,
}
"""Every kernel of this module by name (the tests compile each to PTX where libNVVM is present)."""


# ------------------------------------------------------------------------------------------ host
def _grid(n: int, threads: int) -> int:
    return max(1, min((n + threads - 1) // threads, _MAX_ROW_BLOCKS))


def _pinned_view(tensor: Any) -> Any:
    """A numba device array over a page-locked host tensor, read by kernels in place through UVA (the
    host pointer of page-locked memory is a valid device pointer under unified addressing)."""

    class _Host:
        def __init__(self) -> None:
            self.__cuda_array_interface__ = {
                "shape": tuple(tensor.shape), "typestr": tensor.numpy().dtype.str,
                "data": (tensor.data_ptr(), True), "version": 3, "strides": None,
            }
            self.owner = tensor

    return cuda.as_cuda_array(_Host())


def _device_view(arr: Any, uva: bool) -> Any:
    """A kernel-readable view of a host array (numpy or torch): a device copy, or a UVA mapping.

    With ``uva``, a page-locked torch tensor is read in place; any other array is copied once into
    mapped (page-locked, device-addressable) host memory."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(arr, torch.Tensor):
        if arr.device.type == "cuda":
            return cuda.as_cuda_array(arr)
        if uva and arr.is_pinned() and arr.is_contiguous():  # in place, no copy
            return _pinned_view(arr)
        arr = arr.numpy()
    arr = np.ascontiguousarray(arr)
    if uva:
        mapped = cuda.mapped_array(arr.shape, dtype=arr.dtype)
        mapped[...] = arr
        return mapped
    return cuda.to_device(arr)


@dataclass
class CudaGraph:
    """A CSC graph readable by the kernels: device memory, or page-locked host memory through UVA.

    Attributes
    ----------
    indptr : device array, int64 [N + 1]; indices : int32/int64 [E]
    edge_ids : int64 [E] or a 1-element dummy (``has_eids`` False: identity)
    weights : float32 [E] or a 1-element dummy (``weighted`` False)
    times : int64/float64 [E] or a 1-element int64 dummy (``timed`` False)
        Edge times in CSC order, for temporal sampling.
    uva : bool
        Whether the arrays live in host memory that the GPU reads in place.
    prefix : float64 [E] or None; positive : int64 [N] or None
        With weights and without times: the reference's per-row prefix sums ``P`` and positive counts
        ``nz`` (`samplers.kernels.reference.weight_prefix`) that weighted rows sample from, computed on
        the device by ``build`` (8 bytes per edge and per node, placed like the other arrays).
    """

    indptr: Any
    indices: Any
    edge_ids: Any
    has_eids: bool
    weights: Any
    weighted: bool
    uva: bool
    times: Any = None
    timed: bool = False
    prefix: Any = None
    positive: Any = None

    @classmethod
    def build(cls, indptr, indices, edge_ids=None, weights=None, uva: bool = False, times=None) -> CudaGraph:
        """Place the arrays (numpy arrays or torch tensors, CSC order) for the kernels.

        Parameters
        ----------
        indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity);
        weights : float32 [E] or None; times : int64 or float64 [E] or None (edge times)
        uva : bool
            Read the arrays from page-locked host memory in place (pinned torch tensors are used as
            they are; others are copied once into mapped host memory) instead of device memory.
        """
        require_cuda()
        dummy_i = cuda.to_device(np.zeros(1, dtype=np.int64))
        dummy_w = cuda.to_device(np.zeros(1, dtype=np.float32))
        graph = cls(indptr=_device_view(indptr, uva), indices=_device_view(indices, uva),
                    edge_ids=dummy_i if edge_ids is None else _device_view(edge_ids, uva),
                    has_eids=edge_ids is not None,
                    weights=dummy_w if weights is None else _device_view(weights, uva),
                    weighted=weights is not None, uva=bool(uva),
                    times=dummy_i if times is None else _device_view(times, uva), timed=times is not None)
        if weights is not None and times is None:
            num, edges = graph.indptr.shape[0] - 1, graph.weights.shape[0]
            if uva:  # page-locked host memory, written by the kernel in place
                graph.prefix = cuda.mapped_array(max(edges, 1), dtype=np.float64)
                graph.positive = cuda.mapped_array(max(num, 1), dtype=np.int64)
            else:
                graph.prefix = cuda.device_array(max(edges, 1), dtype=np.float64)
                graph.positive = cuda.device_array(max(num, 1), dtype=np.int64)
            if num:
                _launch(_row_prefix, (_grid(num, _ROW_THREADS), _ROW_THREADS), graph.indptr, graph.weights,
                        graph.prefix, graph.positive)
                cuda.synchronize()
        return graph


def _as_device_ids(ids: Any) -> Any:
    """Device int64 ids: device arrays pass through, CUDA tensors are viewed, host arrays are copied."""
    if isinstance(ids, (np.ndarray, list, tuple)):
        return cuda.to_device(np.ascontiguousarray(ids, dtype=np.int64))
    if isinstance(ids, torch.Tensor):  # a CUDA tensor (int64, contiguous: the caller's job)
        return ids if _torch_dtypes() else cuda.as_cuda_array(ids)
    return ids


def sample_layer_cuda(graph: CudaGraph, dst: Any, fanout: int, replace: bool, key: int,
                      weighted: bool = False, excluded: Any = None,
                      dst_times: Any = None) -> tuple[Any, Any, Any]:
    """Sample one layer on the GPU (as `samplers.kernels.reference.sample_layer`).

    Parameters
    ----------
    graph : CudaGraph
    dst : device or host int64 array [D]
        Destination nodes, trusted to be in range.
    fanout : int
        k >= 0, or -1 for every in-edge.
    replace : bool
    key : int
        ``layer_key(seed, call, layer)``.
    weighted : bool
        Draw by the graph's weights (the masked rules of the reference).
    excluded : device or host int64 array [X], or None
        Sorted, distinct CSC positions that are never drawn.
    dst_times : device or host array [D] in the dtype of ``graph.times``, or None
        Temporal sampling (needs a graph built with ``times``): the time of each row; a row draws only
        edges of time <= its time (the masked rules of the reference, with or without weights).

    Returns
    -------
    out_indptr : device int64 [D + 1]; src : device array [nnz] (the graph's index dtype);
    eids : device int64 [nnz]
    """
    dst = _as_device_ids(dst)
    d_count = dst.shape[0]
    if weighted and not graph.weighted:
        raise ValueError("weighted=True needs a CudaGraph built with weights")
    timed = dst_times is not None
    if timed:
        if not graph.timed:
            raise ValueError("dst_times needs a CudaGraph built with times")
        if isinstance(dst_times, np.ndarray):
            dst_times = cuda.to_device(np.ascontiguousarray(dst_times, dtype=graph.times.dtype))
        row_time = dst_times if d_count else graph.times[:1]
    else:
        row_time = graph.times[:1]
    masked = weighted or timed
    excl = _NO_EXCLUDED() if excluded is None else _as_device_ids(excluded)
    fanout = np.int64(fanout)
    replace = bool(replace)
    key = np.uint64(key)
    counts = empty(max(d_count, 1), np.int64)
    if weighted and not timed and fanout >= 0:
        # the reference's "weighted rows": plan from the positive counts, then rejection over the prefix
        # sums, a thread per row
        if graph.prefix is None:
            raise ValueError("weighted=True without dst_times needs a CudaGraph built with weights and "
                             "without times (its per-row prefix sums)")
        if d_count:
            _launch(_plan_rows_weighted, (_grid(d_count, _EDGE_THREADS), _EDGE_THREADS), graph.positive,
                    graph.weights, graph.indptr, dst, fanout, replace, excl, counts)
        out_indptr, nnz = exclusive_scan(counts[:d_count])
        src = empty(nnz, graph.indices.dtype)
        eids = empty(nnz, np.int64)
        if nnz:
            _launch(_sample_rows_weighted, (_grid(d_count, _ROW_THREADS), _ROW_THREADS), graph.indptr,
                    graph.indices, graph.edge_ids, graph.has_eids, graph.weights, graph.prefix,
                    graph.positive, dst, out_indptr, fanout, replace, key, excl, src, eids)
        return out_indptr, src, eids
    if not masked and 0 <= fanout <= THREAD_FANOUT_MAX:
        # plan, scan, then choose and gather in one pass: a thread per row
        if d_count:
            _launch(_plan_rows, (_grid(d_count, _EDGE_THREADS), _EDGE_THREADS), graph.indptr, dst, fanout,
                    replace, excl, counts)
        out_indptr, nnz = exclusive_scan(counts[:d_count])
        src = empty(nnz, graph.indices.dtype)
        eids = empty(nnz, np.int64)
        if nnz:
            _launch(_sample_rows, (_grid(d_count, _ROW_THREADS), _ROW_THREADS), graph.indptr, graph.indices,
                    graph.edge_ids, graph.has_eids, dst, out_indptr, fanout, replace, key, excl, src, eids)
        return out_indptr, src, eids
    rows = empty(5 * max(d_count, 1), np.int64)
    m = max(d_count, 1)
    row_start, row_raw, row_deg, row_exlo, row_exhi = (rows[q * m:(q + 1) * m] for q in range(5))
    row_blocks = _grid(d_count, 1)
    if d_count:
        if masked:
            _launch(_plan_masked, (row_blocks, WARP), graph.indptr, dst, fanout, replace, graph.weights,
                    bool(weighted), graph.times, row_time, timed, excl, row_start, row_raw, row_deg, row_exlo,
                    row_exhi, counts)
        else:
            _launch(_plan_uniform, (_grid(d_count, _EDGE_THREADS), _EDGE_THREADS), graph.indptr, dst, fanout,
                    replace, excl, row_start, row_deg, row_exlo, row_exhi, counts)
    out_indptr, nnz = exclusive_scan(counts[:d_count])
    pos = empty(max(nnz, 1), np.int64)
    if nnz:
        if masked:
            scratch_off, scratch_len = exclusive_scan(row_raw[:d_count]) if replace and fanout >= 0 \
                else (counts, 0)
            scratch = empty(max(scratch_len, 1), np.float64)
            _launch(_choose_masked, (row_blocks, WARP), dst, row_start, row_raw, row_deg, row_exlo, row_exhi,
                    out_indptr, fanout, replace, key, graph.weights, bool(weighted), graph.times, row_time,
                    timed, excl, pos, scratch, scratch_off)
        else:
            aux = empty(nnz, np.int64)
            _launch(_choose_uniform, (row_blocks, WARP), dst, row_start, row_deg, row_exlo, row_exhi,
                    out_indptr, fanout, replace, key, excl, pos, aux)
    src = empty(nnz, graph.indices.dtype)
    eids = empty(nnz, np.int64)
    if nnz:
        _launch(_gather, (_grid(nnz, _EDGE_THREADS), _EDGE_THREADS), graph.indices, graph.edge_ids,
                graph.has_eids, pos, src, eids)
    return out_indptr, src, eids


def _NO_EXCLUDED() -> Any:  # noqa: N802 - a constant, made on first use (needs a CUDA context)
    global _NO_EXCLUDED_ARRAY
    if _NO_EXCLUDED_ARRAY is None:
        _NO_EXCLUDED_ARRAY = cuda.to_device(np.zeros(0, dtype=np.int64))
    return _NO_EXCLUDED_ARRAY


_NO_EXCLUDED_ARRAY = None


def _hash_table(cap: int) -> tuple[Any, Any]:
    """Empty open-addressing table of ``cap`` slots (a power of two): keys -1, values int64 max, filled
    on the device."""
    return full(cap, _EMPTY), full(cap, _NO_INDEX)


def relabel_cuda(dst: Any, src: Any) -> tuple[Any, Any]:
    """Local ids through a GPU hash table (as `samplers.kernels.reference.relabel`).

    Parameters
    ----------
    dst : device int64 [D]; src : device int32/int64 [nnz]

    Returns
    -------
    src_nodes : device int64 [S]; local : device int64 [nnz]
    """
    dst = _as_device_ids(dst)
    d_count, nnz = dst.shape[0], src.shape[0]
    total = d_count + nnz
    local = empty(nnz, np.int64)
    if nnz == 0:
        src_nodes = empty(d_count, np.int64)
        if d_count:
            _copy_into(src_nodes, dst)
        return src_nodes, local
    cap = 16
    while cap < 2 * total:
        cap *= 2
    keys, vals = _hash_table(cap)
    mask = np.int64(cap - 1)
    threads = _EDGE_THREADS
    _launch(_hash_insert, (_grid(total, threads), threads), dst, src, keys, vals, mask)
    first = empty(nnz, np.int64)
    flags = empty(nnz, np.int64)
    _launch(_hash_first, (_grid(nnz, threads), threads), src, np.int64(d_count), keys, vals, mask, first,
            flags)
    newid, new_count = exclusive_scan(flags)
    src_nodes = empty(d_count + new_count, np.int64)
    _launch(_relabel_out, (_grid(total, threads), threads), dst, src, first, flags, newid, src_nodes, local)
    return src_nodes, local


def _time_keys(times: Any) -> Any:
    """int64 keys of device times (the CPU kernels' `time_keys`): int64 as it is, float64 by its bits.
    The caller folds -0.0 into 0.0 once, on the seeds' times; inner layers inherit folded times."""
    return _view_as(times, np.int64) if _is_float64(times) else times


def relabel_temporal_cuda(dst: Any, dst_times: Any, out_indptr: Any, src: Any) -> tuple[Any, Any, Any]:
    """Local ids keyed on (node, time) through a GPU hash table (as
    `samplers.kernels.reference.relabel_temporal`): a sampled source takes the time of its row.

    Parameters
    ----------
    dst : device int64 [D]; dst_times : device int64/float64 [D] (no -0.0); out_indptr : device int64
    [D + 1]; src : device int32/int64 [nnz]

    Returns
    -------
    src_nodes : device int64 [S]; src_times : device [S] (dtype of ``dst_times``); local : device int64 [nnz]
    """
    dst = _as_device_ids(dst)
    nnz = src.shape[0]
    edge_tkey = empty(max(nnz, 1), np.int64)
    if nnz:
        edge_time_keys_cuda(out_indptr, dst_times, edge_tkey)
    return relabel_pairs_cuda(dst, dst_times, src, edge_tkey[:nnz] if nnz else edge_tkey)


def sample_block_temporal_cuda(graph: CudaGraph, dst: Any, dst_times: Any, fanout: int, replace: bool,
                               key: int, weighted: bool = False,
                               excluded: Any = None) -> tuple[Any, Any, Any, Any, Any]:
    """Sample one temporal layer and relabel it by (node, time) on the GPU (as the CPU kernels'
    `samplers.kernels.cpu.sample_block` with edge times).

    Parameters
    ----------
    graph : CudaGraph (built with ``times``); dst : device int64 [D]; dst_times : device [D] in the
    edge times' dtype (-0.0 folded into 0.0); the rest as `sample_layer_cuda`.

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz];
    src_times : [S] in the edge times' dtype
        Device arrays (``src_nodes`` starts with ``dst``, ``src_times`` with ``dst_times``).
    """
    dst = _as_device_ids(dst)
    if isinstance(dst_times, np.ndarray):
        dst_times = cuda.to_device(np.ascontiguousarray(dst_times, dtype=graph.times.dtype))
    out_indptr, src, eids = sample_layer_cuda(graph, dst, fanout, replace, key, weighted, excluded, dst_times)
    src_nodes, src_times, local = relabel_temporal_cuda(dst, dst_times, out_indptr, src)
    return out_indptr, src_nodes, local, eids, src_times


def sample_block_cuda(graph: CudaGraph, dst: Any, fanout: int, replace: bool, key: int,
                      weighted: bool = False, excluded: Any = None) -> tuple[Any, Any, Any, Any]:
    """Sample one layer and relabel it on the GPU: the device arrays of one block.

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz]
        Device arrays (``src_nodes`` starts with ``dst``).
    """
    dst = _as_device_ids(dst)
    out_indptr, src, eids = sample_layer_cuda(graph, dst, fanout, replace, key, weighted, excluded)
    src_nodes, local = relabel_cuda(dst, src)
    return out_indptr, src_nodes, local, eids


# ------------------------------------------------------- relabel by (node, time) across several row sets
def edge_time_keys_cuda(out_indptr: Any, dst_times: Any, out: Any) -> Any:
    """Write each sampled edge's time key, the key of the row that drew it, into ``out`` (for
    `relabel_pairs_cuda`, where the sources of one node type come from the rows of several relations).

    Parameters
    ----------
    out_indptr : device int64 [D + 1]; dst_times : device int64/float64 [D] (no -0.0), the rows' times;
    out : device int64 [nnz] (nnz = ``out_indptr[D]``), written in place (a slice of a longer array will do)

    Returns
    -------
    out
    """
    d_count = dst_times.shape[0]
    if d_count and out.shape[0]:
        _launch(_edge_tkeys, (_grid(d_count, 1), WARP), out_indptr, _time_keys(dst_times), out)
    return out


def relabel_pairs_cuda(dst: Any, dst_times: Any, src: Any, edge_tkey: Any) -> tuple[Any, Any, Any]:
    """Local ids keyed on (node, time key) through a GPU hash table, each source's time key given (as
    `samplers.kernels.cpu.relabel_pairs`; `relabel_temporal_cuda` derives the keys from one set of rows).

    Parameters
    ----------
    dst : device int64 [D]; dst_times : device int64/float64 [D] (no -0.0); src : device int32/int64 [nnz];
    edge_tkey : device int64 [nnz], the time key of each source (`edge_time_keys_cuda`)

    Returns
    -------
    src_nodes : device int64 [S]; src_times : device [S] (dtype of ``dst_times``); local : device int64 [nnz]
        First-occurrence order over (destinations, sources), as `relabel_temporal_cuda`.
    """
    dst = _as_device_ids(dst)
    d_count, nnz = dst.shape[0], src.shape[0]
    total = d_count + nnz
    dst_tkey = _time_keys(dst_times)
    if nnz == 0:
        edge_tkey = empty(1, np.int64)
    local = empty(nnz, np.int64)
    cap = 16
    while cap < 2 * total:
        cap *= 2
    keys, vals = _hash_table(cap)
    mask = np.int64(cap - 1)
    threads = _EDGE_THREADS
    if total:
        _launch(_hash_insert_pairs, (_grid(total, threads), threads), dst, dst_tkey, src, edge_tkey, keys,
                vals, mask)
    first = empty(max(nnz, 1), np.int64)
    flags = empty(nnz, np.int64)
    if nnz:
        _launch(_hash_first_pairs, (_grid(nnz, threads), threads), dst, dst_tkey, src, edge_tkey, keys, vals,
                mask, first, flags)
    newid, new_count = exclusive_scan(flags)
    src_nodes = empty(d_count + new_count, np.int64)
    src_tkey = empty(d_count + new_count, np.int64)
    if total:
        _launch(_relabel_out_pairs, (_grid(total, threads), threads), dst, dst_tkey, src, edge_tkey, first,
                flags, newid, src_nodes, src_tkey, local)
    src_times = _view_as(src_tkey, np.float64) if _is_float64(dst_times) else src_tkey
    return src_nodes, src_times, local
