"""Numba building blocks over raw addresses: the process-shared mutex and condition calls, int64 views,
byte copies and a compiler fence, for kernels that run a whole commit protocol in one call.

`replay._sync` places robust, process-shared ``pthread_mutex_t`` objects and futex condition words in
shared regions and calls them through ctypes; a numba kernel that takes those locks itself (the shard
commit of `replay.commit_kernel.commit_chunk`) calls the same libc functions through these intrinsics, on the
same objects, so Python callers and compiled callers exclude each other as before:

- `mutex_lock`, `mutex_unlock`, `mutex_consistent`: ``int32 f(void *)`` libc calls on the object at an
  address (an ``int64``); they return the pthread error code (`EOWNERDEAD` from a lock: the previous
  holder died, the caller holds the mutex and must make it consistent).
- `cond_broadcast`: `replay._sync.SharedCondition.notify_all` (mutex held): the condition's sequence
  word counted up, then, if any waiter is counted, a ``FUTEX_WAKE`` of all through libc's ``syscall``.
- `mutex_lock_robust`: `mutex_lock`, and on `EOWNERDEAD` `mutex_consistent`: 0, 1 when the holder
  had died (the caller holds the mutex and repairs what it guards), or -errno.
- `int64_at(address, n)`, `float64_at(address, n)`: an int64 / float64 array view of ``n`` items at an
  address (no ownership, no checks).
- `copy_at(dst, src, nbytes)`: one ``llvm.memcpy`` between addresses.
- `compiler_fence()`: no load or store moves across it at compile time (a commit publishes its reserve
  position before its copy, as the Python path does between its numpy stores and its kernel call).
- `compare_exchange(arr, i, expected, new)`: an int64 compare-and-swap; `futex_wait(addr, expected)` and
  `futex_wake(addr, n)`: a thread's sleep on a 32-bit word of this process and its wake-up (the
  copy helper of `replay.copy_helpers` waits for a batch in compiled code with them).

The libc symbols are registered with LLVM by address at import, so functions using them stay cacheable
(``cache=True``: the object code names the symbols, resolved when it is loaded). Addresses come from the
objects that own the memory (`replay.control.Control.addresses`, `replay.shard.ShardStorage.addresses`);
they are valid while those regions are mapped. For numba code only; nothing is checked.

References
----------
POSIX ``pthread_mutex_lock`` / ``pthread_mutex_consistent`` (robust mutexes); LLVM ``fence
syncscope("singlethread")``.
"""

from __future__ import annotations

import ctypes
import errno
import platform

import numba as nb
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from replay._sync import FUTEX_WAIT, FUTEX_WAKE, SYS_FUTEX

_SYS_FUTEX = -1 if SYS_FUTEX is None else SYS_FUTEX  # -1: syscall fails with ENOSYS (never called then)

__all__ = [
    "EOWNERDEAD",
    "compare_exchange",
    "compiler_fence",
    "cond_broadcast",
    "copy_at",
    "fetch_add",
    "float64_at",
    "futex_wait",
    "futex_wake",
    "int64_at",
    "mutex_consistent",
    "mutex_lock",
    "mutex_lock_robust",
    "mutex_unlock",
    "sched_yield",
    "spin_pause",
    "uint8_at",
]

EOWNERDEAD = errno.EOWNERDEAD

_libc = ctypes.CDLL(None, use_errno=True)
_NAMES = ("pthread_mutex_lock", "pthread_mutex_unlock", "pthread_mutex_consistent", "syscall", "sched_yield")
for _name in _NAMES:  # the same functions (default symbol versions) ctypes calls in replay._sync
    llvm.add_symbol(_name, ctypes.cast(getattr(_libc, _name), ctypes.c_void_p).value)

_I8P = ir.IntType(8).as_pointer()
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")  # `spin_pause` emits x86 pause


def _pointer_to(item):
    """An intrinsic turning an address (int64) into a pointer to ``item`` (a numba type)."""
    ptrty = types.CPointer(item)

    @intrinsic
    def pointer(typingctx, addr):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(ptrty))

        return ptrty(types.int64), codegen

    return pointer


def _pthread_call(fname: str):
    """An intrinsic ``int32 fname(void *)`` taking the object's address as an integer."""

    @intrinsic
    def call(typingctx, addr):  # pragma: no cover - compiled
        sig = types.int32(types.int64)

        def codegen(context, builder, signature, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), [_I8P]), fname
            )
            return builder.call(fn, [builder.inttoptr(args[0], _I8P)])

        return sig, codegen

    return call


mutex_lock = _pthread_call("pthread_mutex_lock")
mutex_unlock = _pthread_call("pthread_mutex_unlock")
mutex_consistent = _pthread_call("pthread_mutex_consistent")


_FUTEX_PRIVATE = 128  # futex(2)'s FUTEX_PRIVATE_FLAG: the word is this process's only


def _futex_call(op: int):
    """An intrinsic ``syscall(SYS_futex, addr, op, value, NULL, NULL, 0)`` (``op`` with its flags)."""

    @intrinsic
    def call(typingctx, addr, value):  # pragma: no cover - compiled
        sig = types.int64(types.int64, types.int64)

        def codegen(context, builder, signature, args):
            i64, i32 = ir.IntType(64), ir.IntType(32)
            fnty = ir.FunctionType(i64, [i64], var_arg=True)
            fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
            null = ir.Constant(_I8P, None)
            return builder.call(fn, [ir.Constant(i64, _SYS_FUTEX), builder.inttoptr(args[0], _I8P),
                                     ir.Constant(i32, op), builder.trunc(args[1], i32),
                                     null, null, ir.Constant(i32, 0)])

        return sig, codegen

    return call


_futex_wake_shared = _futex_call(FUTEX_WAKE)  # a word other processes may wait on too


_int32_ptr = _pointer_to(types.int32)


@nb.njit(cache=True, nogil=True, inline="always")
def cond_broadcast(addr):  # pragma: no cover - compiled
    """`replay._sync.SharedCondition.notify_all` of the condition at ``addr`` (its mutex held): 0."""
    words = nb.carray(_int32_ptr(addr), 2)  # the sequence word, the waiters
    words[0] = words[0] + np.int32(1)  # wraps; waiters only compare it with what they read
    compiler_fence()
    if words[1] > 0:
        _futex_wake_shared(addr, 2**31 - 1)  # every waiter
    return np.int32(0)


@nb.njit(cache=True, nogil=True, inline="always")
def mutex_lock_robust(addr):  # pragma: no cover - compiled
    """Lock the robust mutex at ``addr``: 0, 1 when its holder had died (now consistent), or -errno."""
    rc = mutex_lock(addr)
    if rc == 0:
        return 0
    if rc == EOWNERDEAD:
        rc = mutex_consistent(addr)
        return 1 if rc == 0 else -rc
    return -rc


_int64_ptr = _pointer_to(types.int64)


@nb.njit(cache=True, inline="always")
def int64_at(addr, n):  # pragma: no cover - compiled
    """An int64 array of ``n`` items at ``addr`` (a view: no copy, no ownership)."""
    return nb.carray(_int64_ptr(addr), n)


_float64_ptr = _pointer_to(types.float64)
_uint8_ptr = _pointer_to(types.uint8)


@nb.njit(cache=True, inline="always")
def uint8_at(addr, n):  # pragma: no cover - compiled
    """A uint8 array of ``n`` bytes at ``addr`` (a view: no copy, no ownership)."""
    return nb.carray(_uint8_ptr(addr), n)


@nb.njit(cache=True, inline="always")
def float64_at(addr, n):  # pragma: no cover - compiled
    """A float64 array of ``n`` items at ``addr`` (a view: no copy, no ownership)."""
    return nb.carray(_float64_ptr(addr), n)


@intrinsic
def copy_at(typingctx, dst, src, nbytes):  # pragma: no cover - compiled
    """``memcpy(dst, src, nbytes)`` between addresses (int64); the ranges must not overlap."""
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        d, s, n = args
        cgutils.raw_memcpy(builder, builder.inttoptr(d, _I8P), builder.inttoptr(s, _I8P), n, 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def compiler_fence(typingctx):  # pragma: no cover - compiled
    """No load or store is moved across this point by the compiler (no instruction is emitted)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst", "singlethread")
        return context.get_dummy_value()

    return sig, codegen


def _int64_array(arr) -> bool:
    """Whether numba type ``arr`` is an array of int64 items (the atomics' one type)."""
    return isinstance(arr, types.Array) and arr.dtype == types.int64


@intrinsic
def fetch_add(typingctx, arr, i, v):  # pragma: no cover - compiled
    """``arr[i] += v`` as one sequentially consistent atomic read-modify-write; returns the old value.
    For int64 arrays (``v`` 0: an atomic load); another array type is a typing error."""
    if not _int64_array(arr):
        return None  # (a wider or narrower item would be read and written as 8 bytes at the wrong place)
    sig = types.int64(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", builder.gep(ary.data, [args[1]]), args[2], "seq_cst")

    return sig, codegen


@intrinsic
def spin_pause(typingctx):  # pragma: no cover - compiled
    """The x86 ``pause`` of a spin-wait loop (elsewhere nothing)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def sched_yield(typingctx):  # pragma: no cover - compiled
    """libc's ``sched_yield()``: give the core to another runnable thread."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        builder.call(cgutils.get_or_insert_function(builder.module, fnty, "sched_yield"), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def compare_exchange(typingctx, arr, i, expected, new):  # pragma: no cover - compiled
    """``arr[i] = new`` if ``arr[i] == expected``, as one sequentially consistent atomic compare-and-swap;
    returns the old value (the swap happened when it equals ``expected``). For int64 arrays; another
    array type is a typing error."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        pair = builder.cmpxchg(builder.gep(ary.data, [args[1]]), args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return sig, codegen


futex_wait = _futex_call(FUTEX_WAIT | _FUTEX_PRIVATE)
futex_wait.__doc__ = """``futex_wait(addr, expected) -> int64`` (numba code only): sleep while the 32-bit word
at ``addr`` holds ``expected`` (``FUTEX_WAIT | FUTEX_PRIVATE_FLAG``, no timeout).

Parameters
----------
addr : int64
    The address of a 4-byte aligned int32 word of this process (an int64 word's low half on the
    little-endian machines `replay._sync.futex_syscall` knows; elsewhere the call is never made).
expected : int64
    Truncated to int32: the word's value to sleep on.

Returns
-------
int64: 0 when woken (`futex_wake`, or spuriously: callers re-check their condition), -1 with errno
``EAGAIN`` when the word did not hold ``expected`` (it changed before the sleep), ``EINTR`` when a
signal interrupted it; -1 with ``ENOSYS`` on a machine without a known futex. Nothing is raised.
"""
futex_wake = _futex_call(FUTEX_WAKE | _FUTEX_PRIVATE)
futex_wake.__doc__ = """``futex_wake(addr, n) -> int64`` (numba code only): wake up to ``n`` threads sleeping
in `futex_wait` on the word at ``addr`` (``FUTEX_WAKE | FUTEX_PRIVATE_FLAG``).

Parameters
----------
addr : int64
    The address of the int32 word the sleepers wait on.
n : int64
    How many to wake at most (truncated to int32; ``1 << 30``: all).

Returns
-------
int64: the number of threads woken (>= 0), or -1 with errno ``EINVAL`` (a misaligned address) or
``ENOSYS`` (a machine without a known futex). Nothing is raised.
"""
