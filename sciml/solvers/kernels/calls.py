"""How the engine calls a model: kernel addresses in a table, typed calls through them.

A model is, to the compiled loops, data: an int64 *kernel table* (`K_*` slots)
holding the address of each compiled kernel (`sciml.model.llvm`) and a few
sizes. The loops call a kernel through its address with a fixed C signature,
so one compiled loop (cached on disk once) serves every model. The three
signatures (``double*`` for a C-contiguous float64 array, the time by value):

- ``out(y, u, p, t, ws)``: right-hand side, Jacobian (dense, or the values on
  its sparsity pattern), parameter Jacobian, observables, initial values;
- ``vjp(ubar, pbar, v, u, p, t, ws)``: the reverse passes (ubar written, pbar
  added to);
- ``hvp(ubar, pbar, lam, v, u, p, t, ws)``: the gradient of lam^T (df/du) v.

Kernels assume their array arguments do not overlap (they are compiled with
``noalias``): callers pass distinct buffers. A slot holding 0 means the
kernel was not compiled; the Python side fills the slots a call needs
(`sciml.model.Model.table`) before calling a loop.
"""

import ctypes

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from sciml._interpret import by_identity, interrupt, stand_in
from sciml._jit import OPTIONS, jit

from .linked import Linked, call_linked

# Kernel table slots.
(K_WS, K_RHS, K_JAC, K_PJAC, K_VJP, K_HVP, K_OBS, K_OBS_VJP, K_INIT, K_INIT_VJP, K_AUTONOMOUS,
 K_SPJAC, K_SIZE) = range(13)
KERNEL_SLOTS = {"rhs": K_RHS, "jac": K_JAC, "paramjac": K_PJAC, "vjp": K_VJP, "hvp": K_HVP,
                "obs": K_OBS, "obs_vjp": K_OBS_VJP, "init": K_INIT, "init_vjp": K_INIT_VJP,
                "spjac": K_SPJAC}

_F64 = ir.DoubleType()
_PTR = _F64.as_pointer()


def _c_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float64 and a.layout == "C"


def _caller(n_before, n_after):
    """An intrinsic ``call(addr, *arrays_before, t, *arrays_after)`` of a void kernel."""
    fnty = ir.FunctionType(ir.VoidType(), [_PTR] * n_before + [_F64] + [_PTR] * n_after)

    def typer(typingctx, addr, *args):
        if len(args) != n_before + 1 + n_after or not isinstance(addr, types.Integer):
            return None
        arrays = args[:n_before] + args[n_before + 1:]
        if not all(_c_array(a) for a in arrays) or not isinstance(args[n_before],
                                                                   (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, llargs):
            fp = builder.inttoptr(llargs[0], fnty.as_pointer())
            vals = []
            for ty, v in zip(sig.args[1:], llargs[1:]):
                if isinstance(ty, types.Array):
                    vals.append(context.make_array(ty)(context, builder, v).data)
                else:
                    vals.append(context.cast(builder, v, ty, types.float64))
            builder.call(fp, vals)
            return context.get_dummy_value()

        return types.void(addr, *args), codegen

    return typer


def _buffer_address(a, _view=ctypes.c_char.from_buffer, _at=ctypes.addressof):
    """The address of array ``a``'s data: through the buffer protocol, 2.5x quicker than
    ``a.ctypes.data`` (which the read-only, empty and strided arrays that protocol refuses
    still take)."""
    try:
        return _at(_view(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


# remembered for the arrays seen last: a loop's buffers come call after call
_address = by_identity(_buffer_address, 256)


def _stand_in(n_before, n_after):
    """The interpreter's call of a kernel: through ctypes, from the arrays' addresses."""
    fnty = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_before, ctypes.c_double,
                            *[ctypes.c_void_p] * n_after)
    kernels = {}

    def call(addr, *args):
        interrupt()
        fn = kernels.get(addr)
        if fn is None:
            fn = kernels[addr] = fnty(int(addr))
        return fn(*map(_address, args[:n_before]), args[n_before],
                  *map(_address, args[n_before + 1:]))

    return call


@intrinsic
def call_out(typingctx, addr, y, u, p, t, ws):
    """``kernel(y, u, p, t, ws)`` at address ``addr`` (see the module text)."""
    return _caller(3, 1)(typingctx, addr, y, u, p, t, ws)


@intrinsic
def call_vjp(typingctx, addr, ubar, pbar, v, u, p, t, ws):
    """``kernel(ubar, pbar, v, u, p, t, ws)`` at address ``addr``."""
    return _caller(5, 1)(typingctx, addr, ubar, pbar, v, u, p, t, ws)


@intrinsic
def call_hvp(typingctx, addr, ubar, pbar, lam, v, u, p, t, ws):
    """``kernel(ubar, pbar, lam, v, u, p, t, ws)`` at address ``addr``."""
    return _caller(6, 1)(typingctx, addr, ubar, pbar, lam, v, u, p, t, ws)


for _call, (_before, _after) in ((call_out, (3, 1)), (call_vjp, (5, 1)), (call_hvp, (6, 1))):
    stand_in(_call)(_stand_in(_before, _after))


# ------------------------------------------------------------- named calls


def rhs(m, du, u, t):
    """du = f(u, p, t) of model ``m`` (a `structs.BoundModel`, or a `linked.Linked`)."""
    raise NotImplementedError("kernel calls run only inside compiled loops")


@overload(rhs, jit_options=OPTIONS, inline="always")
def _ov_rhs(m, du, u, t):
    if getattr(m, "instance_class", None) is Linked:
        return lambda m, du, u, t: call_linked(m.code, du, u, m.p, t, m.ws)
    return lambda m, du, u, t: call_out(m.kern[K_RHS], du, u, m.p, t, m.ws)


@jit(inline="always")
def jac(m, J, u, t):
    """J = df/du, (n, n)."""
    call_out(m.kern[K_JAC], J, u, m.p, t, m.ws)


@jit(inline="always")
def spjac(m, Jx, u, t):
    """Jx = the values of df/du on the model's sparsity pattern (CSR order)."""
    call_out(m.kern[K_SPJAC], Jx, u, m.p, t, m.ws)


@jit(inline="always")
def paramjac(m, Jp, u, t):
    """Jp = df/dp, (n, n_params)."""
    call_out(m.kern[K_PJAC], Jp, u, m.p, t, m.ws)


@jit(inline="always")
def vjp(m, ubar, pbar, lam, u, t):
    """ubar = lam^T df/du, pbar += lam^T df/dp."""
    call_vjp(m.kern[K_VJP], ubar, pbar, lam, u, m.p, t, m.ws)


@jit(inline="always")
def hvp(m, ubar, pbar, lam, v, u, t):
    """ubar = d/du (lam^T J v), pbar += d/dp (lam^T J v), J = df/du."""
    call_hvp(m.kern[K_HVP], ubar, pbar, lam, v, u, m.p, t, m.ws)


@jit(inline="always")
def observe(m, y, u, t):
    """y = g(u, p, t), the observables."""
    call_out(m.kern[K_OBS], y, u, m.p, t, m.ws)


@jit(inline="always")
def observe_vjp(m, ubar, pbar, ybar, u, t):
    """ubar = ybar^T dg/du, pbar += ybar^T dg/dp."""
    call_vjp(m.kern[K_OBS_VJP], ubar, pbar, ybar, u, m.p, t, m.ws)


@jit(inline="always")
def initial(m, u0, scratch):
    """u0 = the initial-value function of p (when the table has one); ``scratch`` (n,)
    stands in for the state argument, which initial values do not read."""
    call_out(m.kern[K_INIT], u0, scratch, m.p, 0.0, m.ws)


@jit(inline="always")
def initial_vjp(m, pbar, u0bar, scratch, scratch2):
    """pbar += u0bar^T du0/dp; ``scratch, scratch2`` (n,) stand in for ubar and u."""
    call_vjp(m.kern[K_INIT_VJP], scratch, pbar, u0bar, scratch2, m.p, 0.0, m.ws)
