"""Kernel launches: grid sizes, the stream every kernel launches on, and the fast launcher.

`launch` runs a compiled kernel on `kernel_stream()`, `graphrl.cuda.launch_stream()`: torch's current
stream (docs/architecture.md#the-stream-rule), the stream torch's allocations and scans of this package
are ordered on too. Where torch has CUDA, `FastLauncher` builds a kernel's argument words straight from
torch tensors and numba arrays (1-D, contiguous) and calls ``cuda.core.launch``, skipping numba's
per-launch typing and argument wrapping; the first launch of each (kernel, argument kinds) goes through
numba's dispatcher, which compiles it. ``GRAPHRL_CUDA_LAUNCH=dispatcher`` forces numba's dispatcher.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from graphrl import cuda as gcuda
from samplers.kernels.cuda.device import SIM, torch_dtypes

__all__ = ["EDGE_THREADS", "MAX_ROW_BLOCKS", "ROW_THREADS", "WARP", "FastLauncher", "arg_kind",
           "fast_launcher", "grid", "kernel_stream", "launch", "pack_array", "packer", "stream_handle",
           "wrap"]

WARP = 32
EDGE_THREADS = 32 if SIM else 256
ROW_THREADS = 32 if SIM else 128  # thread-per-row kernels: long loops per thread, smaller blocks
# the simulator starts a Python thread per GPU thread: few blocks (the kernels stride over rows and edges)
MAX_ROW_BLOCKS = 2 if SIM else 65_535 * 4


def grid(n: int, threads: int) -> int:
    """Blocks of ``threads`` for ``n`` items, capped (the kernels stride over what is left)."""
    return max(1, min((n + threads - 1) // threads, MAX_ROW_BLOCKS))


def kernel_stream() -> Any:
    """The stream the kernels launch on: `graphrl.cuda.launch_stream()`, torch's current stream on the
    current device (``0`` under the simulator); numba's default stream ``0`` where torch has no CUDA
    (device arrays are then numba's, ordered on that stream)."""
    if SIM or torch_dtypes():
        return gcuda.launch_stream()
    return 0


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` address of a numba stream (``0`` for the default stream)."""
    if isinstance(stream, int):
        return stream
    handle = stream.handle
    try:
        return int(handle)  # numba-cuda: a cuda.bindings CUstream
    except TypeError:  # numba's ctypes driver: a c_void_p, whose value is None for the default stream
        return int(handle.value or 0)


def wrap(arr: Any) -> Any:
    """A numba view of a torch tensor (for numba's own launches); anything else as it is."""
    return gcuda.as_device_array(arr) if isinstance(arr, torch.Tensor) else arr


def launch(kernel: Any, config: tuple[int, int], *args: Any, stream: Any = None) -> None:
    """Launch ``kernel`` with (grid, block) ``config`` on ``stream`` (default `kernel_stream()`): through
    `FastLauncher` where torch has CUDA and numba-cuda's launch internals are the ones it knows, else
    through numba's dispatcher."""
    if stream is None:
        stream = kernel_stream()
    launcher = fast_launcher()
    if launcher is not None:
        launcher(kernel, config, stream, args)
    else:
        kernel[config[0], config[1], stream](*[wrap(a) for a in args])


def _core_api() -> tuple[Callable, type, Callable]:
    """cuda.core's ``launch`` and ``LaunchConfig``, and numba-cuda's conversion of its streams to
    cuda.core streams."""
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch
    from numba.cuda.cudadrv import driver

    # numba-cuda internal (no public equivalent): the conversion its own dispatcher applies to the stream
    # of ``kernel[grid, block, stream]``, so both launch paths hand cuda.core the same stream
    return core_launch, LaunchConfig, driver._to_core_stream


class FastLauncher:
    """Launches compiled kernels with their argument words built straight from torch tensors and numba
    arrays (1-D, contiguous), skipping numba's per-launch typing and argument wrapping. The first launch
    of each (kernel, argument kinds) goes through numba's dispatcher (which compiles it); later ones call
    ``cuda.core.launch`` on the compiled kernel with the words numba's own ``_Kernel._prepare_args``
    would build (meminfo 0, parent 0, size, itemsize, data, shape, strides per array; ctypes scalars),
    on the cuda.core stream of the launch's numba stream (converted once per stream handle). Needs
    numba-cuda with the cuda.core launch path.

    Parameters
    ----------
    core_launch, launch_config, to_core_stream : callable, optional
        cuda.core's ``launch`` and ``LaunchConfig`` and the numba -> cuda.core stream conversion
        (default: the installed ones; tests pass stand-ins).
    """

    def __init__(self, core_launch: Callable | None = None, launch_config: Callable | None = None,
                 to_core_stream: Callable | None = None) -> None:
        if core_launch is None or launch_config is None or to_core_stream is None:
            core_launch, launch_config, to_core_stream = _core_api()
        self._launch = core_launch
        self._config = launch_config
        self._to_core_stream = to_core_stream
        self._streams: dict = {}
        self._compiled: dict = {}
        self._configs: dict = {}

    def core_stream(self, stream: Any) -> Any:
        """The cuda.core stream of a numba stream (or ``0``), cached by its handle."""
        handle = stream_handle(stream)
        core = self._streams.get(handle)
        if core is None:
            if len(self._streams) > 64:
                self._streams.clear()
            core = self._streams[handle] = self._to_core_stream(stream)
        return core

    def __call__(self, kernel: Any, config: tuple[int, int], stream: Any, args: tuple) -> None:
        key = (kernel, tuple(arg_kind(a) for a in args))
        entry = self._compiled.get(key)
        if entry is None:
            wrapped = [wrap(a) for a in args]
            kernel[config[0], config[1], stream](*wrapped)  # compiles this signature if needed
            try:
                argtypes = tuple(kernel.typeof_pyval(a) for a in wrapped)
                compiled = kernel.overloads[argtypes]
                # numba-cuda internals (no public accessor): the compiled kernel's cuda.core function
                entry = (compiled._codelibrary.get_cufunc().kernel, [packer(t) for t in argtypes])
            except (KeyError, AttributeError, TypeError) as err:  # numba-cuda internals not as expected
                name = getattr(getattr(kernel, "py_func", None), "__name__", "a kernel")
                warnings.warn(f"samplers.kernels.cuda: the fast launcher cannot read {name}'s compiled code "
                              f"({type(err).__name__}: {err}); it launches through numba's dispatcher",
                              RuntimeWarning, stacklevel=3)
                entry = False
            self._compiled[key] = entry
            return
        if entry is False:
            kernel[config[0], config[1], stream](*[wrap(a) for a in args])
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
        self._launch(self.core_stream(stream), cfg, function, *words)


def arg_kind(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.dtype
    dtype = getattr(arg, "dtype", None)
    return (type(arg), None if dtype is None else dtype.str)


def pack_array(arr: Any, words: list) -> None:
    if isinstance(arr, torch.Tensor):
        if arr.dim() != 1 or not arr.is_contiguous():
            raise ValueError(f"kernel arrays must be 1-D and contiguous, got shape {tuple(arr.shape)}")
        n, size = arr.shape[0], arr.element_size()
        words.extend((0, 0, n, size, arr.data_ptr(), n, size))
    else:
        n, size = arr.shape[0], arr.dtype.itemsize
        words.extend((0, 0, n, size, arr.__cuda_array_interface__["data"][0] or 0, n, arr.strides[0]))


def packer(ty: Any) -> Any:
    """The word builder of one argument type (numba-cuda's ``_prepare_args`` rules)."""
    if hasattr(ty, "layout"):
        if ty.ndim != 1:
            raise TypeError(f"the fast launcher takes 1-D arrays, got {ty}")
        return pack_array
    name = str(ty)
    if name == "bool":
        return lambda arg, words: words.append(bool(arg))
    if name == "float64":
        return lambda arg, words: words.append(ctypes.c_double(arg))
    ctype = getattr(ctypes, f"c_{name}")
    return lambda arg, words: words.append(ctype(int(arg)))


def fast_launcher() -> FastLauncher | None:
    """The fast launcher where torch has CUDA and numba-cuda's internals match (decided once; without
    them, one warning and numba's dispatcher; ``GRAPHRL_CUDA_LAUNCH=dispatcher`` forces the latter)."""
    if "launcher" not in _LAUNCHER:
        launcher = None
        if torch_dtypes() and os.environ.get("GRAPHRL_CUDA_LAUNCH", "fast") != "dispatcher":
            try:
                launcher = FastLauncher()
            except (ImportError, AttributeError) as err:
                warnings.warn(f"samplers.kernels.cuda: numba-cuda's cuda.core launch path is missing "
                              f"({err}); kernels launch through numba's dispatcher (slower per launch)",
                              RuntimeWarning, stacklevel=2)
        _LAUNCHER["launcher"] = launcher
    return _LAUNCHER["launcher"]


_LAUNCHER: dict = {}
