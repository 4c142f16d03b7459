"""Software prefetch hints for numba code: `prefetch` (into L1) and `prefetch_l2` (into L2 only), and
`prefetch_l2_at` (`prefetch_l2` of a raw address).

Both lower to ``llvm.prefetch`` on an array element and never change results. Use them in loops of
random reads whose stores keep the core from running far enough ahead by itself; `prefetch_l2` is
for hints issued far ahead (see its docstring).

References
----------
Intel 64 and IA-32 Architectures Optimization Reference Manual, "software prefetch".
"""

from __future__ import annotations

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["prefetch", "prefetch_l2", "prefetch_l2_at"]

# llvm.prefetch is overloaded on the pointer type: "p0" with opaque pointers (LLVM >= 15), "p0i8" before.
_PREFETCH_NAME = "llvm.prefetch.p0" if llvm_binding.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


def _prefetch_codegen(locality: int):
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH_NAME)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, arr, idx):  # pragma: no cover - compiled
    """Hint the CPU to fetch ``arr[idx]`` into cache (read, high locality); no bounds check, no effect
    on results (numba code only). Used where a loop's stores keep the core from running far enough
    ahead by itself."""
    return types.void(arr, idx), _prefetch_codegen(3)


@intrinsic
def prefetch_l2(typingctx, arr, idx):  # pragma: no cover - compiled
    """Hint the CPU to fetch ``arr[idx]`` into L2, not L1 (``prefetcht1`` on x86; LLVM locality 2).

    Numba code only; no bounds check, no effect on results. For hints issued far ahead of the reads:
    a line on its way to L1 holds one of the core's few L1 miss buffers (16 on recent Intel cores)
    until it arrives, so `prefetch` far ahead stalls the loop once they are all taken; the L2 keeps
    many more misses in flight (48 on the same cores), and the later read then costs an L2 hit
    (figures in docs/performance.md).
    """
    return types.void(arr, idx), _prefetch_codegen(2)


@intrinsic
def prefetch_l2_at(typingctx, addr):  # pragma: no cover - compiled
    """`prefetch_l2` of the byte at an address (int64) rather than an array element: numba code only;
    no check, no effect on results."""

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH_NAME)
        builder.call(fn, [builder.inttoptr(args[0], i8p), ir.Constant(i32, 0), ir.Constant(i32, 2),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen
