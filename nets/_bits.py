"""Reinterpreting float64 bits as int64 and back, inside numba kernels.

A plain bit cast (no memory, no branch), so loops using it still vectorise:
`2**k` is ``bits_to_float((k + 1023) << 52)`` and the exponent of ``x`` is
``(float_to_bits(x) >> 52) - 1023`` (both for normal numbers).
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def float_to_bits(typingctx, x):
    """The IEEE-754 bits of a float64, as an int64."""
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def bits_to_float(typingctx, i):
    """The float64 whose IEEE-754 bits are the int64 ``i``."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.bitcast(v, ir.DoubleType())

    return types.float64(i), codegen
