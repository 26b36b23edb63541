"""The linear solves of implicit steps, behind one interface.

Every implicit step (Rosenbrock stages, BDF Newton iterations, their adjoints)
solves with ``W = ihg M + sign J``, M the model's (diagonal) mass matrix, the
identity for an ODE (``lin.mass`` empty). The loops and systems call four functions;
the type of the buffers they pass (``lin``) picks the implementation:

- ``lin_jac(m, lin, z, t)``: J at ``(z, t)`` from the model's kernel (dense, or
  its values on the sparsity pattern);
- ``lin_mass(lin)``: the diagonal of M (empty: the identity);
- ``lin_factor(lin, ihg, sign)``: factor ``W``; False if singular;
- ``lin_solve(lin, r)`` and ``lin_solve_t(lin, r)``: ``r <- W^-1 r`` and
  ``r <- W^-T r``;
- ``lin_factor2``, ``lin_solve2``: the same with a second factorisation (a
  system that needs two matrices: backsolve's u block).

`structs.Lin` is the dense LU of `lu` (n x n buffers); `sparse.SparseLU` the
fixed-pattern sparse LU (any ordering: fill-reducing, or banded);
`krylov.KrylovLin` GMRES with an ILU(0) preconditioner. Another solver is one
more type and its overloads here.
"""

from numba.extending import overload

from sciml._jit import OPTIONS, jit

from . import calls, krylov, sparse
from .lu import factor_shifted_into, lu_solve_into, lu_solve_transposed_into
from .structs import Lin


def lin_jac(m, lin, z, t):
    raise NotImplementedError("runs only inside compiled loops")


def lin_mass(lin):
    raise NotImplementedError("runs only inside compiled loops")


def lin_factor(lin, ihg, sign):
    raise NotImplementedError("runs only inside compiled loops")


def lin_solve(lin, r):
    raise NotImplementedError("runs only inside compiled loops")


def lin_solve_t(lin, r):
    raise NotImplementedError("runs only inside compiled loops")


def lin_factor2(lin, ihg, sign):
    raise NotImplementedError("runs only inside compiled loops")


def lin_solve2(lin, r):
    raise NotImplementedError("runs only inside compiled loops")


def _kind(lin):
    return getattr(lin, "instance_class", None)


@jit
def _krylov_factor(lin, LU, slot, ihg, sign):
    """The preconditioner of ``ihg M + sign J``, and (ihg, sign) kept for the solves."""
    lin.at[slot] = ihg
    lin.at[slot + 1] = sign
    return sparse.factor(lin.pre, LU, ihg, sign)


@jit
def _krylov_solve(lin, LU, slot, r, transposed):
    krylov.gmres(lin, LU, lin.at[slot], lin.at[slot + 1], r, transposed)


# One straight-line implementation per (function, type), inlined into the loops: a branch
# on the slot inside an inlined overload trips numba's inliner, so each slot has its own.

@overload(lin_jac, jit_options=OPTIONS, inline="always")
def _ov_jac(m, lin, z, t):
    if _kind(lin) is Lin:
        return lambda m, lin, z, t: calls.jac(m, lin.J, z, t)
    if _kind(lin) is sparse.SparseLU:
        return lambda m, lin, z, t: calls.spjac(m, lin.Jx, z, t)
    if _kind(lin) is krylov.KrylovLin:
        return lambda m, lin, z, t: calls.spjac(m, lin.pre.Jx, z, t)


@overload(lin_mass, jit_options=OPTIONS, inline="always")
def _ov_mass(lin):
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin: lin.pre.mass
    if _kind(lin) in (Lin, sparse.SparseLU):
        return lambda lin: lin.mass


@overload(lin_factor, jit_options=OPTIONS, inline="always")
def _ov_factor(lin, ihg, sign):
    if _kind(lin) is Lin:
        return lambda lin, ihg, sign: factor_shifted_into(lin.W1, lin.J, ihg, lin.mass, sign,
                                                          lin.piv1)
    if _kind(lin) is sparse.SparseLU:
        return lambda lin, ihg, sign: sparse.factor(lin, lin.LU1, ihg, sign)
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin, ihg, sign: _krylov_factor(lin, lin.pre.LU1, 0, ihg, sign)


@overload(lin_factor2, jit_options=OPTIONS, inline="always")
def _ov_factor2(lin, ihg, sign):
    if _kind(lin) is Lin:
        return lambda lin, ihg, sign: factor_shifted_into(lin.W2, lin.J, ihg, lin.mass, sign,
                                                          lin.piv2)
    if _kind(lin) is sparse.SparseLU:
        return lambda lin, ihg, sign: sparse.factor(lin, lin.LU2, ihg, sign)
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin, ihg, sign: _krylov_factor(lin, lin.pre.LU2, 2, ihg, sign)


@overload(lin_solve, jit_options=OPTIONS, inline="always")
def _ov_solve(lin, r):
    if _kind(lin) is Lin:
        return lambda lin, r: lu_solve_into(r, lin.W1, lin.piv1)
    if _kind(lin) is sparse.SparseLU:
        return lambda lin, r: sparse.solve(lin, lin.LU1, r)
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin, r: _krylov_solve(lin, lin.pre.LU1, 0, r, False)


@overload(lin_solve2, jit_options=OPTIONS, inline="always")
def _ov_solve2(lin, r):
    if _kind(lin) is Lin:
        return lambda lin, r: lu_solve_into(r, lin.W2, lin.piv2)
    if _kind(lin) is sparse.SparseLU:
        return lambda lin, r: sparse.solve(lin, lin.LU2, r)
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin, r: _krylov_solve(lin, lin.pre.LU2, 2, r, False)


@overload(lin_solve_t, jit_options=OPTIONS, inline="always")
def _ov_solve_t(lin, r):
    if _kind(lin) is Lin:
        return lambda lin, r: lu_solve_transposed_into(r, lin.W1, lin.piv1)
    if _kind(lin) is sparse.SparseLU:
        return lambda lin, r: sparse.solve_transposed(lin, lin.LU1, r)
    if _kind(lin) is krylov.KrylovLin:
        return lambda lin, r: _krylov_solve(lin, lin.pre.LU1, 0, r, True)
