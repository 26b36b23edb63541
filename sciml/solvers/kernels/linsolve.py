"""The linear solves of implicit steps, behind one interface.

Every implicit step (Rosenbrock stages, BDF Newton iterations, their adjoints)
solves with ``W = ihg M + sign J``, M the model's (diagonal) mass matrix, the
identity for an ODE (``lin.mass`` empty). The loops and systems call four functions;
the type of the buffers they pass (``lin``) picks the implementation:

- ``lin_jac(m, lin, z, t)``: J at ``(z, t)`` from the model's kernel (dense, or
  its values on the sparsity pattern);
- ``lin_factor(lin, which, ihg, sign)``: factor ``W`` into slot ``which`` (1 or
  2: a system may hold two factorisations); False if singular;
- ``lin_solve(lin, which, r)`` and ``lin_solve_t(lin, which, r)``:
  ``r <- W^-1 r`` and ``r <- W^-T r``.

`structs.Lin` is the dense LU of `lu` (n x n buffers); `sparse.SparseLU` the
fixed-pattern sparse LU. Adding a solver (banded, Krylov) means one more type
and four overloads here.
"""

from numba.extending import overload

from sciml._jit import OPTIONS

from . import calls, sparse
from .lu import factor_shifted_into, lu_solve_into, lu_solve_transposed_into
from .structs import Lin


def lin_jac(m, lin, z, t):
    raise NotImplementedError("runs only inside compiled loops")


def lin_factor(lin, which, ihg, sign):
    raise NotImplementedError("runs only inside compiled loops")


def lin_solve(lin, which, r):
    raise NotImplementedError("runs only inside compiled loops")


def lin_solve_t(lin, which, r):
    raise NotImplementedError("runs only inside compiled loops")


def _kind(lin):
    return getattr(lin, "instance_class", None)


@overload(lin_jac, jit_options=OPTIONS, inline="always")
def _ov_jac(m, lin, z, t):
    if _kind(lin) is Lin:
        return lambda m, lin, z, t: calls.jac(m, lin.J, z, t)
    if _kind(lin) is sparse.SparseLU:
        return lambda m, lin, z, t: calls.spjac(m, lin.Jx, z, t)


@overload(lin_factor, jit_options=OPTIONS)
def _ov_factor(lin, which, ihg, sign):
    # not inlined by numba (its inliner mishandles the branch on `which`); LLVM inlines them
    if _kind(lin) is Lin:
        def impl(lin, which, ihg, sign):
            W, piv = (lin.W1, lin.piv1) if which == 1 else (lin.W2, lin.piv2)
            return factor_shifted_into(W, lin.J, ihg, lin.mass, sign, piv)
        return impl
    if _kind(lin) is sparse.SparseLU:
        def impl(lin, which, ihg, sign):
            return sparse.factor(lin, lin.LU1 if which == 1 else lin.LU2, ihg, sign)
        return impl


@overload(lin_solve, jit_options=OPTIONS)
def _ov_solve(lin, which, r):
    if _kind(lin) is Lin:
        def impl(lin, which, r):
            W, piv = (lin.W1, lin.piv1) if which == 1 else (lin.W2, lin.piv2)
            lu_solve_into(r, W, piv)
        return impl
    if _kind(lin) is sparse.SparseLU:
        def impl(lin, which, r):
            sparse.solve(lin, lin.LU1 if which == 1 else lin.LU2, r)
        return impl


@overload(lin_solve_t, jit_options=OPTIONS)
def _ov_solve_t(lin, which, r):
    if _kind(lin) is Lin:
        def impl(lin, which, r):
            W, piv = (lin.W1, lin.piv1) if which == 1 else (lin.W2, lin.piv2)
            lu_solve_transposed_into(r, W, piv)
        return impl
    if _kind(lin) is sparse.SparseLU:
        def impl(lin, which, r):
            sparse.solve_transposed(lin, lin.LU1 if which == 1 else lin.LU2, r)
        return impl
