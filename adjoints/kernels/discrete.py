"""Reverse mode through a forward solve's stored steps: the discrete adjoint, both families.

The exact gradient of the computed solution, step sizes held fixed. Each
reverse step rebuilds what the forward step computed from the stored data
with the same step code (`erk_stage_input`, `ros_stage_input`: each family's
stored steps hold its stages; a Rosenbrock step's Jacobian and factorisation
are computed again, not stored) and runs its adjoint:

- explicit RK: the stage cotangents ``Kbar_i = h b_i lambda`` (plus the
  interpolant's weights for observations inside the step), then, last stage
  first, one vjp per stage at its input;
- Rosenbrock (transformed form, ``W = I/(h gamma) - J(u)``): ``rbar_i = W^-T Kbar_i``
  per stage (last first), a vjp at the stage input, the C and a couplings back
  into earlier stages, the Jacobian's own dependence on (u, p) through one
  second-order ``hvp(rbar_i, K_i)`` per stage, and df/dt's forward difference
  differentiated as it was computed.

Observations ``G[q] = dL/du(t_q)`` enter where the forward saved them (inside
a step by the interpolant, at a step's start as the state). Boluses and
infusion rates do not depend on u or p: they leave the reverse pass unchanged.
"""

import math

import numpy as np

from sciml._interpret import python, stand_in
from sciml._jit import borrow, jit, keep_alive
from sciml.solvers.kernels import calls
from sciml.solvers.kernels.erk import erk_stage_input, erk_weight
from sciml.solvers.kernels.linsolve import lin_solve_t
from sciml.solvers.kernels.ros import ros_stage_input
from sciml.solvers.kernels.system import sys_autonomous, sys_factor, sys_jac

_EPS = 2.220446049250313e-16


@jit(inline="always")
def _obs_at_end(obs_t, G, lam, q, t_end):
    while q >= 0 and obs_t[q] >= t_end:
        for i in range(lam.shape[0]):
            lam[i] += G[q, i]
        q -= 1
    return q


@jit
def erk_reverse(m, tab, rec, n_steps, obs_t, G, lam, pbar):
    """The discrete adjoint of an ERK solve.

    m : the model (`structs.BoundModel`); tab, rec, n_steps : the forward tableau and its
    stored steps (with the extra interpolant stages of the steps that saved an
    observation); obs_t (T,), G (T, n) : observation times and dL/du there.
    lam (n,) out: dL/du0 (after the boluses at t0); pbar (n_params,) added to.
    """
    m, tab, rec, obs_t, G, lam, pbar = borrow((m, tab, rec, obs_t, G, lam, pbar))
    n = lam.shape[0]
    s, s_all = len(tab.b), len(tab.c)
    own = np.zeros((s_all + 3) * n + s_all)
    buf = borrow(own)
    Kbar = buf[:s_all * n].reshape((s_all, n))
    o = s_all * n
    X, xbar = buf[o:o + n], buf[o + n:o + 2 * n]
    w = buf[o + 3 * n:]
    d_t, d_z, d_k, d_have = rec.d_t, rec.d_z, rec.d_k, rec.d_have
    for i in range(n):
        lam[i] = 0.0
    q = _obs_at_end(obs_t, G, lam, obs_t.shape[0] - 1, d_t[n_steps])
    sa = len(tab.c)
    for j in range(n_steps - 1, -1, -1):
        t0 = d_t[j]
        h = d_t[j + 1] - t0
        rows = s_all if d_have[j] != 0 else s
        K = d_k[j]
        u = d_z[j]
        for i in range(rows):
            wi = h * tab.b[i] if i < s else 0.0
            for k in range(n):
                Kbar[i, k] = wi * lam[k]
        while q >= 0 and obs_t[q] > t0:  # interpolated inside the step
            theta = (obs_t[q] - t0) / h
            for i in range(rows):
                w[i] = erk_weight(tab, i, theta) * h
            for i in range(rows):
                if w[i] != 0.0:
                    for k in range(n):
                        Kbar[i, k] += w[i] * G[q, k]
            for k in range(n):
                lam[k] += G[q, k]
            q -= 1
        for i in range(rows - 1, -1, -1):
            nz = False
            for k in range(n):
                if Kbar[i, k] != 0.0:
                    nz = True
                    break
            if not nz:
                continue
            erk_stage_input(tab, X, u, h, K, i)
            calls.vjp(m, xbar, pbar, Kbar[i], X, t0 + tab.c[i] * h)
            for k in range(n):
                lam[k] += xbar[k]
            for l in range(i):
                a = h * tab.A[i * sa + l]
                if a != 0.0:
                    for k in range(n):
                        Kbar[l, k] += a * xbar[k]
        q = _obs_at_end(obs_t, G, lam, q, t0)  # saved as the state at the step's start
    keep_alive(own)


@jit(inline="always")
def _ros_step_again(fsys, tab, rec, j, K, u, t, h, k):
    """What the reverse of forward step ``j`` (from ``u`` at ``t``) reads of it: its stages,
    as stored (`ros_dense_rows`), into ``K``, and its factorisation, computed again as the
    loop computed it, in ``fsys``; returns the time of df/dt's forward difference."""
    sys_jac(fsys, u, t, k)
    sys_factor(fsys, 1.0 / (h * tab.gamma))
    o = 1 + len(tab.H) // len(tab.c)
    for i in range(K.shape[0]):
        for c in range(K.shape[1]):
            K[i, c] = rec.d_k[j, o + i, c]
    return t + math.sqrt(_EPS) * max(1.0, abs(t))


@stand_in(_ros_step_again)
def _ros_step_again_numpy(fsys, tab, rec, j, K, u, t, h, k):
    # the interpreter's: the stages' copy as one
    python(sys_jac)(fsys, u, t, k)
    python(sys_factor)(fsys, 1.0 / (h * tab.gamma))
    o = 1 + len(tab.H) // len(tab.c)
    K[:] = rec.d_k[j, o:o + K.shape[0], :K.shape[1]]
    return t + math.sqrt(_EPS) * max(1.0, abs(t))


@jit
def ros_reverse(fsys, tab, rec, n_steps, obs_t, G, lam, pbar):
    """The discrete adjoint of a Rosenbrock solve (see the module text).

    fsys : the forward system that was integrated (its Rosenbrock buffers are reused);
    the rest as `erk_reverse`.
    """
    fsys, tab, rec, obs_t, G, lam, pbar = borrow((fsys, tab, rec, obs_t, G, lam, pbar))
    m = fsys.m
    n = lam.shape[0]
    s = len(tab.c)
    nh = len(tab.H) // s
    own = np.zeros((2 * s + 4) * n)
    buf = borrow(own)
    K = buf[:s * n].reshape((s, n))
    Kbar = buf[s * n:2 * s * n].reshape((s, n))
    o = 2 * s * n
    U, ubar, xbar, dTb = (buf[o:o + n], buf[o + n:o + 2 * n], buf[o + 2 * n:o + 3 * n],
                          buf[o + 3 * n:])
    d_t, d_z, d_seg = rec.d_t, rec.d_z, rec.d_seg
    nonauto = not sys_autonomous(fsys)
    lin = fsys.lin
    for i in range(n):
        lam[i] = 0.0
    q = _obs_at_end(obs_t, G, lam, obs_t.shape[0] - 1, d_t[n_steps])
    for j in range(n_steps - 1, -1, -1):
        t = d_t[j]
        h = d_t[j + 1] - t
        u = d_z[j]
        k = d_seg[j]
        t_fd = _ros_step_again(fsys, tab, rec, j, K, u, t, h, k)
        # cotangents of the stages from u_new and from observations inside the step
        for i in range(s):
            for c in range(n):
                Kbar[i, c] = tab.b[i] * lam[c]
        for c in range(n):
            ubar[c] = lam[c]
            dTb[c] = 0.0
        while q >= 0 and obs_t[q] > t:
            th = (obs_t[q] - t) / h
            for i in range(s):
                acc = 0.0
                for jh in range(nh - 1, -1, -1):
                    acc = tab.H[jh * s + i] + th * acc
                wi = th * tab.b[i] + th * (1.0 - th) * acc
                for c in range(n):
                    Kbar[i, c] += wi * G[q, c]
            for c in range(n):
                ubar[c] += G[q, c]
            q -= 1
        for i in range(s - 1, -1, -1):
            rb = Kbar[i]
            lin_solve_t(lin, rb)  # Kbar_i becomes rbar_i
            # through the Jacobian in W: d/d(u, p) of rbar_i^T J K_i
            calls.hvp(m, xbar, pbar, rb, K[i], u, t)
            for c in range(n):
                ubar[c] += xbar[c]
            # through f at the stage's input
            ros_stage_input(tab, U, u, K, i)
            calls.vjp(m, xbar, pbar, rb, U, t + tab.c[i] * h)
            for c in range(n):
                ubar[c] += xbar[c]
            for l in range(i):
                cl = tab.C[i * s + l] / h
                al = tab.a[i * s + l]
                for c in range(n):
                    Kbar[l, c] += cl * rb[c] + al * xbar[c]
            hd = h * tab.d[i]
            for c in range(n):
                dTb[c] += hd * rb[c]
        if nonauto:  # dT = (f(t_fd, u) - f(t, u)) / (t_fd - t), as computed
            inv = 1.0 / (t_fd - t)
            for c in range(n):
                dTb[c] *= inv
            calls.vjp(m, xbar, pbar, dTb, u, t_fd)
            for c in range(n):
                ubar[c] += xbar[c]
                dTb[c] = -dTb[c]
            calls.vjp(m, xbar, pbar, dTb, u, t)
            for c in range(n):
                ubar[c] += xbar[c]
        for c in range(n):
            lam[c] = ubar[c]
        q = _obs_at_end(obs_t, G, lam, q, t)
    keep_alive(own)


def _later_couplings(tab):
    """(s, 2s): row i holds ``C_li`` at column 2l and ``a_li`` at 2l + 1, the weights by
    which the later stages' (rbar_l, xbar_l) reach stage i's cotangent."""
    s = len(tab.c)
    out = np.zeros((s, 2 * s))
    out[:, 0::2] = tab.C.reshape(s, s).T
    out[:, 1::2] = tab.a.reshape(s, s).T
    return out


@stand_in(ros_reverse)
def _ros_reverse_numpy(fsys, tab, rec, n_steps, obs_t, G, lam, pbar):
    # the interpreter's (`sciml._interpret`): the same reverse pass with each stage's sums
    # over the n states as numpy operations (the loops interpreted take n steps each; 34
    # states and 8 stages made the loops 5x the rest of a step). A stage's cotangent is
    # gathered when it is reached, as one product with the rows (rbar_l, xbar_l) the later
    # stages left in Z, rather than scattered into every earlier stage as each is done:
    # four numpy calls a stage instead of thirteen.
    m = fsys.m
    n = lam.shape[0]
    s = len(tab.c)
    nh = len(tab.H) // s
    a, H = tab.a.reshape(s, s), tab.H.reshape(nh, s)
    later = _later_couplings(tab)
    per_h = np.ones(2 * s)  # per step: 1/h on the C columns
    back = np.empty((s, 2 * s))
    K, Kbar, Z, HX = np.zeros((s, n)), np.zeros((s, n)), np.zeros((2 * s, n)), np.zeros((s, n))
    # their rows as the same objects at every step: the kernel calls' stand-ins remember
    # the addresses of the arrays they were given (`calls._address`)
    K_rows, Kbar_rows, Z_rows, HX_rows = list(K), list(Kbar), list(Z), list(HX)
    U, ubar, dTb = np.zeros(n), np.zeros(n), np.zeros(n)
    d_t, d_z, d_seg = rec.d_t, rec.d_z, rec.d_seg
    again, hvp, vjp = python(_ros_step_again), python(calls.hvp), python(calls.vjp)
    solve_t = python(lin_solve_t).impl(fsys.lin, ubar)
    nonauto = not python(sys_autonomous)(fsys)
    lin = fsys.lin
    lam[:] = 0.0
    q = python(_obs_at_end)(obs_t, G, lam, obs_t.shape[0] - 1, d_t[n_steps])
    for j in range(n_steps - 1, -1, -1):
        t = d_t[j]
        h = d_t[j + 1] - t
        u = d_z[j]
        k = d_seg[j]
        t_fd = again(fsys, tab, rec, j, K, u, t, h, k)
        np.multiply.outer(tab.b, lam, out=Kbar)
        ubar[:] = lam
        while q >= 0 and obs_t[q] > t:
            th = (obs_t[q] - t) / h
            acc = np.zeros(s)
            for jh in range(nh - 1, -1, -1):
                acc = H[jh] + th * acc
            Kbar += np.multiply.outer(th * tab.b + th * (1.0 - th) * acc, G[q])
            ubar += G[q]
            q -= 1
        per_h[0::2] = 1.0 / h
        np.multiply(later, per_h, out=back)
        for i in range(s - 1, -1, -1):
            rb = Z_rows[2 * i]
            np.dot(back[i, 2 * i + 2:], Z[2 * i + 2:], out=rb)
            rb += Kbar_rows[i]
            solve_t(lin, rb)
            # through the Jacobian in W: d/d(u, p) of rbar_i^T J K_i
            hvp(m, HX_rows[i], pbar, rb, K_rows[i], u, t)
            # through f at the stage's input
            np.dot(a[i, :i], K[:i], out=U)
            U += u
            vjp(m, Z_rows[2 * i + 1], pbar, rb, U, t + tab.c[i] * h)
        ubar += HX.sum(axis=0)
        ubar += Z[1::2].sum(axis=0)
        if nonauto:  # dT = (f(t_fd, u) - f(t, u)) / (t_fd - t), as computed
            np.dot(tab.d * (h / (t_fd - t)), Z[0::2], out=dTb)
            vjp(m, HX_rows[0], pbar, dTb, u, t_fd)
            ubar += HX_rows[0]
            np.negative(dTb, out=dTb)
            vjp(m, HX_rows[0], pbar, dTb, u, t)
            ubar += HX_rows[0]
        lam[:] = ubar
        q = python(_obs_at_end)(obs_t, G, lam, q, t)
