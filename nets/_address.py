"""Calling a compiled function by its address, so that the caller does not link it.

numba links every compiled callee into its caller's module and optimises and
generates code for it there again; a big callee (LeNet5's `train_step`, with
every layer's kernels) is compiled once more by each function that calls it,
and once more by a parallel loop's body. A call through an address skips that:
the callee is compiled once, and the caller holds only the call.

``address_of(fn, args)`` gives, as an int64, the address of ``fn``'s
specialisation for the types of the tuple ``args``; ``call_at(address, fn,
args)`` calls it with numba's own calling convention (exceptions propagate as
from any call). An address is valid in the process that took it only: take it
in a function compiled without the disk cache (`jit(cache=False)`) and hand it
to the cached callers as an argument. Both ends must see the same argument
types; derive the arguments of both from one inlined function. From Python,
`address(fn, args)` takes the address for arguments Python holds.
"""

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, imputils
from numba.extending import intrinsic


def _resolve(typingctx, fn, args):
    if not isinstance(fn, types.Dispatcher) or not isinstance(args, types.BaseTuple):
        return None
    return fn.get_call_type(typingctx, tuple(args), {})


@intrinsic
def address_of(typingctx, fn, args):
    """The address (int64) of ``fn`` compiled for the types of ``args`` (a tuple)."""
    sig = _resolve(typingctx, fn, args)
    if sig is None:
        return None

    def codegen(context, builder, signature, llargs):
        cres = fn.dispatcher.overloads[tuple(sig.args)]
        address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        return context.get_constant(types.int64, address)

    return types.int64(fn, args), codegen


@intrinsic
def call_at(typingctx, address, fn, args):
    """``fn(*args)`` through ``address`` (from `address_of`, same argument types)."""
    sig = _resolve(typingctx, fn, args)
    if sig is None or not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, llargs):
        at, _, packed = llargs
        values = [context.cast(builder, builder.extract_value(packed, i), ty, want)
                  for i, (ty, want) in enumerate(zip(args, sig.args))]
        fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
        callee = builder.inttoptr(at, ir.PointerType(fnty))
        status, res = context.call_conv.call_function(builder, callee, sig.return_type,
                                                      sig.args, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return imputils.fix_returning_optional(context, builder, sig, status, res)

    return sig.return_type(address, fn, args), codegen


@njit(cache=False)  # an address holds in this process only
def address(fn, args):
    """`address_of` from Python: ``fn``'s address for the types of the tuple ``args``."""
    return address_of(fn, args)
