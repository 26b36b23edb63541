"""`Model.from_kernels`: a user's numba kernels wrapped into the engine's C signatures.

Each user kernel takes numba arrays; the engine calls C functions of
pointers (`sciml.solvers.kernels.calls`). A wrapper per kernel (a numba
``cfunc``) rebuilds the arrays with ``carray`` at the model's sizes and calls
the user's function; missing Jacobians are built from the vjp, one reverse
pass per state, in scratch past the user's own (``ws[ws_size:]``).
"""

import importlib

import numba
from numba import carray, cfunc, types

__all__ = ["wrap_kernels"]

_P = types.CPointer(types.float64)
_OUT = types.void(_P, _P, _P, types.float64, _P)
_VJP = types.void(_P, _P, _P, _P, _P, types.float64, _P)


def _checked(kname, fn):
    if not isinstance(fn, numba.core.registry.CPUDispatcher):
        raise TypeError(f"from_kernels: `{kname}` must be a numba.njit function, got {fn!r}")
    modname = fn.__module__
    if modname != "__main__" and modname is not None:
        try:
            importlib.import_module(modname)
        except ImportError as e:
            raise ValueError(f"from_kernels: `{kname}`: cannot import its module {modname!r} "
                             f"({e})") from None
    return fn


def wrap_kernels(kernels, n, n_params, ws_size):
    """``(addresses, wrappers, total scratch)`` for kernels ``{"rhs", "vjp", "jac",
    "paramjac"}`` (the last two may be None)."""
    rhs = _checked("rhs_into", kernels["rhs"])
    vjp = _checked("vjp_into", kernels["vjp"])
    wsz = ws_size
    total = ws_size + 2 * n + n_params  # lam, ubar, pbar rows for the built Jacobians

    @cfunc(_OUT)
    def c_rhs(du, u, p, t, ws):
        rhs(carray(du, n), carray(u, n), carray(p, n_params), t, carray(ws, total)[:wsz])

    @cfunc(_VJP)
    def c_vjp(ub, pb, lam, u, p, t, ws):
        vjp(carray(ub, n), carray(pb, n_params), carray(lam, n), carray(u, n),
            carray(p, n_params), t, carray(ws, total)[:wsz])

    wrappers = {"rhs": c_rhs, "vjp": c_vjp}
    if kernels["jac"] is not None:
        jac = _checked("jac_into", kernels["jac"])

        @cfunc(_OUT)
        def c_jac(J, u, p, t, ws):
            jac(carray(J, (n, n)), carray(u, n), carray(p, n_params), t,
                carray(ws, total)[:wsz])
    else:
        @cfunc(_OUT)
        def c_jac(J, u, p, t, ws):
            w = carray(ws, total)
            lam, ub, pb = w[wsz:wsz + n], w[wsz + n:wsz + 2 * n], w[wsz + 2 * n:]
            Jm = carray(J, (n, n))
            uu, pp = carray(u, n), carray(p, n_params)
            for i in range(n):
                lam[:] = 0.0
                lam[i] = 1.0
                pb[:] = 0.0
                vjp(ub, pb, lam, uu, pp, t, w[:wsz])
                Jm[i, :] = ub
    wrappers["jac"] = c_jac
    if kernels["paramjac"] is not None:
        pjac = _checked("paramjac_into", kernels["paramjac"])

        @cfunc(_OUT)
        def c_pjac(Jp, u, p, t, ws):
            pjac(carray(Jp, (n, n_params)), carray(u, n), carray(p, n_params), t,
                 carray(ws, total)[:wsz])
    else:
        @cfunc(_OUT)
        def c_pjac(Jp, u, p, t, ws):
            w = carray(ws, total)
            lam, ub = w[wsz:wsz + n], w[wsz + n:wsz + 2 * n]
            Jm = carray(Jp, (n, n_params))
            uu, pp = carray(u, n), carray(p, n_params)
            for i in range(n):
                lam[:] = 0.0
                lam[i] = 1.0
                Jm[i, :] = 0.0
                vjp(ub, Jm[i], lam, uu, pp, t, w[:wsz])
    wrappers["paramjac"] = c_pjac
    return {k: w.address for k, w in wrappers.items()}, wrappers, total
