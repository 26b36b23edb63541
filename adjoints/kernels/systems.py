"""The systems the continuous sensitivity methods integrate, for either method family.

Each method is an ODE the ordinary loops integrate (`sciml.solvers.kernels.erk`
or `ros`), defined by the hooks of `sciml.solvers.kernels.system`, as
SciMLSensitivity builds each adjoint as an ODE problem. Backward systems run
in reversed time ``tau = -t``, so that every loop steps forward:
``d lambda/d tau = J^T lambda``, ``d mu/d tau = (df/dp)^T lambda``,
``du/d tau = -f``. On arrival at a stop the adjoint jumps by ``G[q] = dL/du(t_q)``
at an observation; doses leave it continuous (a bolus adds a constant, an
infusion a parameter-free rate), and backsolve's own u has each bolus taken
back out.

================  ==================  ==============================================
system            state z             u(t) from
================  ==================  ==============================================
`Interp`          [lambda, mu]        the forward solve's stored steps
`Backsolve`       [u, lambda, mu]     z itself (re-anchored at observations)
`Gauss`, `Quad`   lambda              stored steps; mu by quadrature on each step
`Sens`            [u, S], forward     z itself: dS/dt = J S + df/dp (chosen columns)
================  ==================  ==============================================

With a Rosenbrock method each system supplies its exact Jacobian through the
factor/solve hooks, exploiting its block-triangular form: one or two
factorisations of ``n x n`` matrices (``ihg I - J^T``, and ``ihg I + J`` for
backsolve's u), and for the blocks that couple to u the second-order kernel
``hvp`` (the gradient of ``lam^T J v``).
"""

from typing import NamedTuple

import numpy as np

from sciml._interpret import python, stand_in
from sciml._jit import jit
from sciml.solvers.kernels import calls
from sciml.solvers.kernels.family import step_interp, stored_state
from sciml.solvers.kernels.linsolve import (
    lin_factor,
    lin_factor2,
    lin_jac,
    lin_solve,
    lin_solve2,
    lin_solve_t,
)
from sciml.solvers.kernels.lu import lu_solve_into
from sciml.solvers.kernels.structs import BoundModel, Lin, Record
from sciml.solvers.kernels.system import never, no_accept, register, sys_event, sys_f

# QUADPACK's 15-point Kronrod rule and its embedded 7-point Gauss rule on [-1, 1]
# (Piessens et al., QUADPACK, Springer 1983, routine qk15): nodes +-XK[i], XK[7] = 0.
XK = (0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
      0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
      0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
      0.207784955007898467600689403773245, 0.0)
WK = (0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
      0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
      0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
      0.204432940075298892414161999234649, 0.209482141084727828012999174891714)
WG = (0.0, 0.129484966168869693270611432679082, 0.0, 0.279705391489276667901467771423780,
      0.0, 0.381830050505118944950369775488975, 0.0, 0.417959183673469387755102040816327)


class Adjoint(NamedTuple):
    """What every backward system shares.

    m : the model; fsys, ftab, frec, n_steps : the forward system, its tableau,
    its stored steps and their number (u(t) for `Interp`, `Gauss`, `Quad`);
    fseg : (nb,) the forward segment of each backward segment; jump : (nb + 1,) the
    observation row at each backward stop (-1: none); G : (T, n) the jumps;
    rows : (6, w) scratch, w >= max(n, stages) (`ROWS`); pscr : (n_params,) scratch;
    hint : (1,) int64 where to start the next stored-step search;
    lin : the implicit steps' linear algebra (`sciml.solvers.kernels.linsolve`); at : (3,)
    the Rosenbrock step's time, ihg, unused.
    """

    m: BoundModel
    fsys: object
    ftab: object
    frec: Record
    n_steps: int
    fseg: np.ndarray
    jump: np.ndarray
    G: np.ndarray
    rows: np.ndarray
    pscr: np.ndarray
    hint: np.ndarray
    lin: object
    at: np.ndarray


class Interp(NamedTuple):
    """z = [lambda, mu] backward, u(t) from the forward solve's stored steps."""

    a: Adjoint


class Gauss(NamedTuple):
    """z = lambda backward; mu += sum_k w_k h lambda(t_k)^T df/dp(u(t_k)) at the
    Gauss-Legendre nodes ``qx`` (weights ``qw``, on [0, 1]) of each step, into ``pbar``."""

    a: Adjoint
    pbar: np.ndarray
    qx: np.ndarray
    qw: np.ndarray


class Quad(NamedTuple):
    """z = lambda backward; mu by adaptive Gauss-Kronrod (7-15) on each step, to relative
    ``tol`` (``qatol`` absolute), into ``pbar``; Q (3, n_params), Sk (16, 3) scratch."""

    a: Adjoint
    pbar: np.ndarray
    tol: float
    qatol: float
    Q: np.ndarray
    Sk: np.ndarray


class Backsolve(NamedTuple):
    """z = [u, lambda, mu] backward, u solved backward too; reset to ``U[q]`` at each
    observation if ``anchor``; the boluses of backward stop k
    (``bol_off[k]:bol_off[k + 1]`` of ``bol_i``, ``bol_a``) taken back out of u."""

    a: Adjoint
    U: np.ndarray
    anchor: bool
    bol_off: np.ndarray
    bol_i: np.ndarray
    bol_a: np.ndarray


class Sens(NamedTuple):
    """z = [u, S] forward, S (n, k) row-major: the sensitivities to the k parameters
    ``cols``, dS/dt = J S + (df/dp)[:, cols].

    fsys : the forward system (its rate and boluses act on u); J, Jp : (n, n),
    (n, n_params) scratch; S0 : (n, k) S at a Rosenbrock step's start;
    rows : (4, max(n, n_params)) scratch; pscr : (n_params,) scratch; lin :
    Rosenbrock buffers; at : (3,); cols : (k,) int64, the parameters followed;
    coupled : the linear solves include S's coupling to u, d(J S + df/dp)/du (the exact
    Jacobian a Rosenbrock step needs; False: block diagonal, enough for a Newton matrix).
    """

    m: BoundModel
    fsys: object
    J: np.ndarray
    Jp: np.ndarray
    S0: np.ndarray
    rows: np.ndarray
    pscr: np.ndarray
    lin: object
    at: np.ndarray
    cols: np.ndarray
    coupled: bool


# ---------------------------------------------------------------- shared pieces

# Rows of Adjoint.rows: u(t); scratch of the stored-step search and interpolants (and f);
# a kernel's ubar; lambda (a whole vector for the kernels); u and lambda at a Rosenbrock
# step's start (kept from the Jacobian to the solves).
U, TMP, UBAR, LAM, U0, LAM0 = range(6)
ROWS = 6


@jit(inline="always")
def _u_at(a, out, t, k):
    """The forward state at time t in backward segment k (stored steps)."""
    j = stored_state(a.ftab, a.fsys, a.frec, a.n_steps, out, t, a.fseg[k], a.hint[0],
                     a.rows[TMP])
    a.hint[0] = j


_STORED = {}  # id(adjoint struct) -> (it, the interpreted stored_state for its types)


@stand_in(_u_at)
def _u_at_chosen(a, out, t, k):
    # the interpreter's (`sciml._interpret`): the forward store's implementation chosen once
    # per adjoint struct (its store's types are fixed), not at each of ~10 calls a step
    args = (a.ftab, a.fsys, a.frec, a.n_steps, out, t, a.fseg[k], a.hint[0], a.rows[TMP])
    hit = _STORED.get(id(a))
    if hit is None or hit[0] is not a:
        if len(_STORED) > 32:  # (it holds the structs)
            _STORED.clear()
        hit = _STORED[id(a)] = a, python(stored_state).impl(*args)
    a.hint[0] = hit[1](*args)


@jit(inline="always")
def _adjoint_rhs(a, out, lam, u, t, with_mu):
    """out[:n] = J(u)^T lam; out[n:] = (df/dp)^T lam when ``with_mu``."""
    n = lam.shape[0]
    p = a.pscr
    for i in range(p.shape[0]):
        p[i] = 0.0
    ub = a.rows[UBAR]
    calls.vjp(a.m, ub[:n], p, lam, u, t)
    for i in range(n):
        out[i] = ub[i]
    if with_mu:
        for i in range(p.shape[0]):
            out[n + i] = p[i]


@stand_in(_adjoint_rhs)
def _adjoint_rhs_numpy(a, out, lam, u, t, with_mu):
    # the interpreter's (`sciml._interpret`): the copies as slices
    n = lam.shape[0]
    p = a.pscr
    p[:] = 0.0
    ub = a.rows[UBAR]
    python(calls.vjp)(a.m, ub[:n], p, lam, u, t)
    out[:n] = ub[:n]
    if with_mu:
        out[n:n + p.shape[0]] = p


@jit(inline="always")
def _jump(a, z, k, lo):
    """The observation's jump dL/du(t_q), if stop k has one (no step-size restart: see
    `sys_event`)."""
    q = a.jump[k]
    if q >= 0:
        G = a.G
        for i in range(G.shape[1]):
            z[lo + i] += G[q, i]
    return False


@jit(inline="always")
def _factor_adjoint(a, ihg):
    """W = ihg I - J^T: ihg I - J factored in a.lin, solved transposed (J at
    the step's start)."""
    a.at[1] = ihg
    return lin_factor(a.lin, ihg, -1.0)


@jit(inline="always")
def _copy_into(dst, src, n):
    for i in range(n):
        dst[i] = src[i]


# ---------------------------------------------------------------- Interp


def _interp_f(sys, out, z, t, k):
    tau = t  # the loop's time: tau = -t_model
    a = sys.a
    n = a.G.shape[1]
    u = a.rows[U][:n]
    _u_at(a, u, -tau, k)
    lam = a.rows[LAM][:n]
    _copy_into(lam, z, n)  # a whole vector to the kernel (not a slice of z)
    _adjoint_rhs(a, out, lam, u, -tau, True)


def _interp_event(sys, z, k):
    return _jump(sys.a, z, k, 0)


def _adj_jac(sys, z, t, k):
    tau = t  # the loop's time: tau = -t_model
    a = sys.a
    n = a.G.shape[1]
    u = a.rows[U][:n]
    _u_at(a, u, -tau, k)
    lin_jac(a.m, a.lin, u, -tau)
    a.at[0] = -tau
    for i in range(n):
        a.rows[U0, i] = u[i]  # kept for the solves


def _adj_factor(sys, ihg):
    return _factor_adjoint(sys.a, ihg)


def _interp_solve(sys, r):
    # [[ihg I - J^T, 0], [-(df/dp)^T, ihg I]] x = r
    a = sys.a
    n = a.G.shape[1]
    lam = r[:n]
    lin_solve_t(a.lin, lam)
    x = a.rows[LAM][:n]
    _copy_into(x, lam, n)
    p = a.pscr
    for i in range(p.shape[0]):
        p[i] = 0.0
    calls.vjp(a.m, a.rows[UBAR][:n], p, x, a.rows[U0][:n], a.at[0])
    ihg = a.at[1]
    for i in range(p.shape[0]):
        r[n + i] = (r[n + i] + p[i]) / ihg


def _false(sys):
    return False


def _true(sys):
    return True


register(Interp, f=_interp_f, event=_interp_event, accept=no_accept, interpolates=never,
         jac=_adj_jac, factor=_adj_factor, solve=_interp_solve, autonomous=_false)


# ---------------------------------------------------------------- Gauss and Quad


def _lam_f(sys, out, z, t, k):
    tau = t  # the loop's time: tau = -t_model
    a = sys.a
    n = a.G.shape[1]
    u = a.rows[U][:n]
    _u_at(a, u, -tau, k)
    _adjoint_rhs(a, out, z, u, -tau, False)


def _lam_event(sys, z, k):
    return _jump(sys.a, z, k, 0)


def _lam_solve(sys, r):
    lin_solve_t(sys.a.lin, r)


@jit(inline="always")
def _quad_point(a, pbar, wt, theta, tab, tau, h, z, znew, K, k):
    """pbar += wt * lambda(theta)^T df/dp(u(t)) at t = -(tau + theta h)."""
    n = a.G.shape[1]
    lam = a.rows[LAM]
    step_interp(tab, lam[:n], theta, h, z, znew, K, a.rows[TMP])
    for i in range(n):
        lam[i] *= wt
    t = -(tau + theta * h)
    u = a.rows[U][:n]
    _u_at(a, u, t, k)
    calls.vjp(a.m, a.rows[UBAR][:n], pbar, lam[:n], u, t)


def _gauss_accept(sys, tab, t, h, z, znew, K, k):
    tau = t  # the loop's time: tau = -t_model
    for g in range(sys.qx.shape[0]):
        _quad_point(sys.a, sys.pbar, sys.qw[g] * h, sys.qx[g], tab, tau, h, z, znew, K, k)
    return sys.qx.shape[0]


def _quad_accept(sys, tab, t, h, z, znew, K, k):
    """Adaptive Gauss-Kronrod (7-15) over the step, bisected (at most 6 levels deep) until
    the Kronrod and Gauss sums agree."""
    tau = t  # the loop's time: tau = -t_model
    Q, Sk, pbar = sys.Q, sys.Sk, sys.pbar
    npar = pbar.shape[0]
    nev = 0
    top = 1  # Sk: a stack of intervals (a, b, depth) of theta still to integrate
    Sk[0, 0] = 0.0
    Sk[0, 1] = 1.0
    Sk[0, 2] = 0.0
    while top > 0:
        top -= 1
        a0, b0, dep = Sk[top, 0], Sk[top, 1], int(Sk[top, 2])
        half = 0.5 * (b0 - a0)
        mid = 0.5 * (a0 + b0)
        for m in range(npar):
            Q[0, m] = 0.0
            Q[1, m] = 0.0
        for i in range(15):
            if i < 7:
                x, wk, wg = mid - half * XK[i], WK[i], WG[i]
            elif i == 7:
                x, wk, wg = mid, WK[7], WG[7]
            else:
                x, wk, wg = mid + half * XK[14 - i], WK[14 - i], WG[14 - i]
            q2 = Q[2]
            for m in range(npar):
                q2[m] = 0.0
            _quad_point(sys.a, q2, half * h, x, tab, tau, h, z, znew, K, k)
            nev += 1
            for m in range(npar):
                Q[0, m] += wk * q2[m]
                Q[1, m] += wg * q2[m]
        worst = 0.0
        for m in range(npar):
            d = abs(Q[0, m] - Q[1, m]) / (sys.qatol + sys.tol * abs(Q[0, m]))
            worst = max(worst, d)
        if worst <= 1.0 or dep >= 6 or top + 2 > Sk.shape[0]:
            for m in range(npar):
                pbar[m] += Q[0, m]
        else:
            Sk[top, 0], Sk[top, 1], Sk[top, 2] = a0, mid, dep + 1
            Sk[top + 1, 0], Sk[top + 1, 1], Sk[top + 1, 2] = mid, b0, dep + 1
            top += 2
    return nev


for _cls, _accept in ((Gauss, _gauss_accept), (Quad, _quad_accept)):
    register(_cls, f=_lam_f, event=_lam_event, accept=_accept, interpolates=_true,
             jac=_adj_jac, factor=_adj_factor, solve=_lam_solve, autonomous=_false)


# ---------------------------------------------------------------- Backsolve


def _back_f(sys, out, z, t, k):
    tau = t  # the loop's time: tau = -t_model
    a = sys.a
    n = a.G.shape[1]
    u = a.rows[U][:n]
    lam = a.rows[LAM][:n]
    _copy_into(u, z, n)
    for i in range(n):
        lam[i] = z[n + i]
    fu = a.rows[TMP][:n]
    sys_f(a.fsys, fu, u, -tau, a.fseg[k])
    _adjoint_rhs(a, out[n:], lam, u, -tau, True)
    for i in range(n):
        out[i] = -fu[i]


def _back_event(sys, z, k):
    a = sys.a
    n = a.G.shape[1]
    q = a.jump[k]
    if q >= 0:
        if sys.anchor:
            for i in range(n):
                z[i] = sys.U[q, i]
        for i in range(n):
            z[n + i] += a.G[q, i]
    off = sys.bol_off
    last = off.shape[0] - 1  # past the last event: an empty range
    lo, hi = off[min(k, last)], off[min(k + 1, last)]
    for b in range(lo, hi):
        z[sys.bol_i[b]] -= sys.bol_a[b]
    return hi > lo  # a dose taken back out of u restarts the step size; a jump does not


def _back_jac(sys, z, t, k):
    tau = t  # the loop's time: tau = -t_model
    a = sys.a
    n = a.G.shape[1]
    u = a.rows[U0][:n]
    _copy_into(u, z, n)
    lin_jac(a.m, a.lin, u, -tau)
    a.at[0] = -tau
    for i in range(n):
        a.rows[LAM0, i] = z[n + i]  # kept for the solves


def _back_factor(sys, ihg):
    a = sys.a
    # du/dtau = -f: its Jacobian is -J, so W = ihg I + J
    return lin_factor2(a.lin, ihg, 1.0) and _factor_adjoint(a, ihg)


def _back_solve(sys, r):
    # [[ihg I + J, 0, 0], [-H_uu, ihg I - J^T, 0], [-H_pu, -(df/dp)^T, ihg I]] x = r,
    # H = the Hessian of lambda^T f: H_uu x_u and H_pu x_u by one hvp.
    a = sys.a
    n = a.G.shape[1]
    xu = r[:n]
    lin_solve2(a.lin, xu)
    v = a.rows[U][:n]
    _copy_into(v, xu, n)
    p = a.pscr
    for i in range(p.shape[0]):
        p[i] = 0.0
    hu = a.rows[UBAR][:n]
    u0 = a.rows[U0][:n]
    calls.hvp(a.m, hu, p, a.rows[LAM0][:n], v, u0, a.at[0])
    lam = r[n:2 * n]
    for i in range(n):
        lam[i] += hu[i]
    lin_solve_t(a.lin, lam)
    _copy_into(v, lam, n)
    calls.vjp(a.m, hu, p, v, u0, a.at[0])  # p += (df/dp)^T x_lambda
    ihg = a.at[1]
    for i in range(p.shape[0]):
        r[2 * n + i] = (r[2 * n + i] + p[i]) / ihg


def _back_autonomous(sys):
    return sys.a.m.kern[calls.K_AUTONOMOUS] != 0


register(Backsolve, f=_back_f, event=_back_event, accept=no_accept, interpolates=never,
         jac=_back_jac, factor=_back_factor, solve=_back_solve, autonomous=_back_autonomous)


# ---------------------------------------------------------------- forward sensitivities


def _sens_f(sys, out, z, t, k):
    n = sys.J.shape[0]
    cols = sys.cols
    npar = cols.shape[0]
    u = sys.rows[0][:n]
    _copy_into(u, z, n)
    du = sys.rows[1][:n]
    sys_f(sys.fsys, du, u, t, k)
    calls.jac(sys.m, sys.J, u, t)
    calls.paramjac(sys.m, sys.Jp, u, t)
    J, Jp = sys.J, sys.Jp
    for i in range(n):
        out[i] = du[i]
        o = n + i * npar
        for j in range(npar):
            out[o + j] = Jp[i, cols[j]]
        for l in range(n):
            a = J[i, l]
            if a != 0.0:
                ol = n + l * npar
                for j in range(npar):
                    out[o + j] += a * z[ol + j]


def _sens_event(sys, z, k):
    n = sys.J.shape[0]
    return sys_event(sys.fsys, z[:n], k)


def _sens_jac(sys, z, t, k):
    n = sys.J.shape[0]
    u = sys.rows[2][:n]
    _copy_into(u, z, n)  # u at the step's start
    lin_jac(sys.m, sys.lin, u, t)
    sys.at[0] = t
    S0 = sys.S0
    npar = S0.shape[1]
    for i in range(n):
        for j in range(npar):
            S0[i, j] = z[n + i * npar + j]


def _sens_factor(sys, ihg):
    sys.at[1] = ihg
    return lin_factor(sys.lin, ihg, -1.0)


def _sens_solve(sys, r):
    # [[ihg I - J, 0], [-M, I (x) (ihg I - J)]] x = r with M x_u = d(J S + df/dp)/du x_u:
    # row i of M x_u is hvp(e_i, x_u): its u part dotted with S's columns plus its p part.
    # Without `coupled`, M = 0 (CVODES' simultaneous corrector): a Newton iteration whose
    # u part has converged has the exact S block, and S's equations are linear, so the
    # iteration converges as fast, without the n products per solve.
    n = sys.J.shape[0]
    S0 = sys.S0
    npar = S0.shape[1]
    xu = r[:n]
    lin_solve(sys.lin, xu)
    if sys.coupled:
        _sens_coupling(sys, r, xu)
    col = sys.rows[3][:n]
    for j in range(npar):
        for i in range(n):
            col[i] = r[n + i * npar + j]
        lin_solve(sys.lin, col)
        for i in range(n):
            r[n + i * npar + j] = col[i]


@jit(inline="always")
def _sens_coupling(sys, r, xu):
    """``r[n:] += M xu`` (`_sens_solve`), S at the Jacobian's time."""
    n = sys.J.shape[0]
    S0 = sys.S0
    npar = S0.shape[1]
    v = sys.rows[0][:n]
    _copy_into(v, xu, n)
    e = sys.rows[3][:n]
    hu = sys.rows[1][:n]
    u = sys.rows[2][:n]
    p = sys.pscr
    for i in range(n):
        for l in range(n):
            e[l] = 0.0
        e[i] = 1.0
        for j in range(p.shape[0]):
            p[j] = 0.0
        calls.hvp(sys.m, hu, p, e, v, u, sys.at[0])
        o = n + i * npar
        for j in range(npar):
            acc = p[sys.cols[j]]
            for l in range(n):
                acc += hu[l] * S0[l, j]
            r[o + j] += acc


# The interpreter's versions (`sciml._interpret`): S as an (n, k) matrix, its products
# and (dense LU) its k solves each one numpy or LAPACK call; the loops above, interpreted,
# take n n k steps a stage.


@stand_in(_sens_f)
def _sens_f_numpy(sys, out, z, t, k):
    n, npar = sys.S0.shape
    u = sys.rows[0][:n]
    u[:] = z[:n]
    du = sys.rows[1][:n]
    python(sys_f)(sys.fsys, du, u, t, k)
    python(calls.jac)(sys.m, sys.J, u, t)
    python(calls.paramjac)(sys.m, sys.Jp, u, t)
    out[:n] = du
    S = z[n:n + n * npar].reshape(n, npar)
    out[n:n + n * npar] = (sys.Jp[:, sys.cols] + sys.J @ S).ravel()


@stand_in(_sens_solve)
def _sens_solve_numpy(sys, r):
    n, npar = sys.S0.shape
    xu = r[:n]
    python(lin_solve)(sys.lin, xu)
    if sys.coupled:
        python(_sens_coupling)(sys, r, xu)
    S = r[n:n + n * npar].reshape(n, npar)
    if type(sys.lin) is Lin:  # the k columns in one LAPACK call
        python(lu_solve_into)(S, sys.lin.W1, sys.lin.piv1)
        return
    col = sys.rows[3][:n]
    for j in range(npar):
        col[:] = S[:, j]
        python(lin_solve)(sys.lin, col)
        S[:, j] = col


@stand_in(_sens_coupling)
def _sens_coupling_numpy(sys, r, xu):
    n, npar = sys.S0.shape
    v = sys.rows[0][:n]
    v[:] = xu
    e, hu, u = sys.rows[3][:n], sys.rows[1][:n], sys.rows[2][:n]
    p = sys.pscr
    hvp = python(calls.hvp)
    rows_u, rows_p = np.empty((n, n)), np.empty((n, npar))
    e[:] = 0.0
    for i in range(n):
        e[i] = 1.0
        p[:] = 0.0
        hvp(sys.m, hu, p, e, v, u, sys.at[0])
        e[i] = 0.0
        rows_u[i] = hu
        rows_p[i] = p[sys.cols]
    r[n:n + n * npar] += (rows_p + rows_u @ sys.S0).ravel()


def _sens_autonomous(sys):
    return sys.m.kern[calls.K_AUTONOMOUS] != 0


register(Sens, f=_sens_f, event=_sens_event, accept=no_accept, interpolates=never,
         jac=_sens_jac, factor=_sens_factor, solve=_sens_solve, autonomous=_sens_autonomous)
