"""A model's right-hand side linked into a loop: the fused fast path of the lean solve.

The engine calls a model's kernels through their addresses (`calls`), which
costs, on the tiniest models, a visible share of a solve: on Lotka-Volterra
(two states, ~120 evaluations a solve) the indirect calls and the loops over
a state count known only at run time are ~25% of it. `Linked` is a model whose
right-hand side is, instead, the kernel's own LLVM IR (`sciml.model.llvm`)
linked into the loop that calls it, with the state count a constant: LLVM then
inlines it into the same step code (`erk`), as if the loop had been written for
that model.

It is only ever an optimisation: `sciml.solve` switches a (solver, model) pair
to it after many lean solves (`ExplicitRK._lean`), never for a first result,
and only for models whose IR is the same in every process (no custom
activation, whose machine code lives at a per-process address). The entry
point compiled for it is numba's, cached on disk like every other, keyed by the
IR: a model seen before loads it.
"""

import hashlib
from typing import NamedTuple

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.imputils import lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl

__all__ = ["LinkedCode", "Linked", "call_linked"]


class LinkedCode:
    """A right-hand side's LLVM IR (``void symbol(double* du, double* u, double* p,
    double t, double* ws)``) and the model's state count."""

    def __init__(self, ir_text, symbol, n_states):
        self.ir_text, self.symbol, self.n_states = ir_text, symbol, int(n_states)

    @classmethod
    def of(cls, make_ir, n_states):
        """From ``make_ir(symbol)`` (the IR with the kernel named ``symbol``), the symbol
        a digest of the IR: the same model gets the same name in every process."""
        digest = hashlib.sha256(make_ir("sciml.linked").encode()).hexdigest()[:24]
        symbol = f"sciml.linked.{digest}"
        return cls(make_ir(symbol), symbol, n_states)

    def __eq__(self, other):
        return isinstance(other, LinkedCode) and other.symbol == self.symbol

    def __hash__(self):
        return hash(self.symbol)

    def __repr__(self):
        return f"LinkedCode({self.symbol}, n_states={self.n_states})"


class LinkedCodeType(types.Type):
    def __init__(self, code):
        self.code = code
        super().__init__(name=f"LinkedCode({code.symbol})")


@typeof_impl.register(LinkedCode)
def _typeof(val, c):
    return LinkedCodeType(val)


register_model(LinkedCodeType)(models.OpaqueModel)


@lower_constant(LinkedCodeType)
def _constant(context, builder, ty, pyval):
    return context.get_dummy_value()  # all it carries is its type


class Linked(NamedTuple):
    """A `structs.BoundModel` whose right-hand side is ``code``, linked in (see the module)."""

    kern: np.ndarray
    p: np.ndarray
    ws: np.ndarray
    code: object


_LIBRARIES = {}  # symbol -> numba code library holding the kernel
_PTR = ir.DoubleType().as_pointer()
_FNTY = ir.FunctionType(ir.VoidType(), [_PTR, _PTR, _PTR, ir.DoubleType(), _PTR])


def _library(context, code):
    lib = _LIBRARIES.get(code.symbol)
    if lib is None:
        lib = context.codegen().create_library(code.symbol)
        mod = llvm.parse_assembly(code.ir_text)
        mod.triple = context.codegen()._llvm_module.triple
        mod.data_layout = str(context.codegen().target_data)
        lib.add_llvm_module(mod)
        lib.finalize()
        _LIBRARIES[code.symbol] = lib
    return lib


@intrinsic
def call_linked(typingctx, code, du, u, p, t, ws):
    """``code``'s right-hand side, called directly (and so inlined by LLVM)."""
    if not isinstance(code, LinkedCodeType):
        return None

    def codegen(context, builder, sig, args):
        context.add_linking_libs([_library(context, code.code)])
        fn = cgutils.get_or_insert_function(builder.module, _FNTY, code.code.symbol)
        vals = [context.make_array(ty)(context, builder, v).data
                for ty, v in zip(sig.args[1:4], args[1:4])]
        vals.append(context.cast(builder, args[4], sig.args[4], types.float64))
        vals.append(context.make_array(sig.args[5])(context, builder, args[5]).data)
        builder.call(fn, vals)
        return context.get_dummy_value()

    return types.void(code, du, u, p, t, ws), codegen


def n_states(code):
    """The state count a loop for ``code`` may take as a constant (0: none)."""
    return 0 if code is None else code.n_states
