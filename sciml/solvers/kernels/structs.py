"""The few named structures every compiled loop takes.

A loop's arguments, in one screen: ``(sys, tab, ctl, stops, z, rec)``

- ``sys``: the system integrated, whose type says how (`BoundModel` inside a
  `sciml.solvers.kernels.system.Forward`, or an adjoint system of
  `adjoints.kernels`);
- ``tab``: the method's coefficients, `ERKTableau` or `RosTableau` (arrays; the
  lean entry points pass the same structure with tuples of constants);
- ``ctl``: step-size control, `Control`;
- ``stops``: the times the loop lands on exactly (doses, observations...);
- ``z``: the state, in at the first stop, out at the last;
- ``rec``: what is recorded on the way, `Record` (saved states, stored steps,
  counters).

These are plain named tuples: numba compiles a loop once per combination of
their types, and the Python side builds them from the settings objects.
"""

from typing import NamedTuple

import numpy as np


class BoundModel(NamedTuple):
    """A model bound to its parameters.

    kern : int64 (K_SIZE,), the kernel table (`calls`); p : (n_params,); ws : the
    kernels' scratch (the table's K_WS entries at least).
    """

    kern: np.ndarray
    p: np.ndarray
    ws: np.ndarray


class ERKTableau(NamedTuple):
    """An explicit Runge-Kutta method: ``A (s, s), b, e, c (s,), P (s, d)`` (interpolant
    weights ``b_i(theta) = sum_j P[i, j] theta**(j+1)``), the stages per step
    ``n_step`` (the rest serve the interpolant), ``end_stage`` (a stage equal to
    f(t + h, u_new), reused as the next step's first; -1 if none) and the ``order``."""

    A: np.ndarray
    b: np.ndarray
    e: np.ndarray
    c: np.ndarray
    P: np.ndarray
    n_step: int
    end_stage: int
    order: int


class RosTableau(NamedTuple):
    """A Rosenbrock method in the transformed form of Hairer & Wanner (IV.7):
    ``a, C (s, s)`` strictly lower, ``c, d, b, e (s,)``, interpolant rows ``H (nh, s)``,
    ``gamma`` and the ``order`` of the embedded solution."""

    a: np.ndarray
    C: np.ndarray
    c: np.ndarray
    d: np.ndarray
    b: np.ndarray
    e: np.ndarray
    H: np.ndarray
    gamma: float
    order: int


class BDFTableau(NamedTuple):
    """The BDF family (`bdf`): ``kappa`` (max_order + 1,) the NDF coefficients (zeros: the
    classical BDFs) and the highest order used."""

    kappa: np.ndarray
    max_order: int


class Control(NamedTuple):
    """Step-size control: the error of ``z[:n_err]`` (``n_err = atol.shape[0]``) in the
    weighted RMS norm with ``rtol`` and ``atol``; Hairer's PI controller (``safety``,
    step factor bounds ``qmin, qmax``, exponents ``beta1, beta2``); a step budget
    ``max_steps`` (accepted + rejected); the first step ``h0`` (<= 0: estimated); and
    ``adaptive`` (False: fixed steps of ``h0``)."""

    rtol: float
    atol: np.ndarray
    safety: float
    qmin: float
    qmax: float
    beta1: float
    beta2: float
    max_steps: int
    h0: float
    adaptive: bool


class Record(NamedTuple):
    """What a loop records.

    save_t (ns,), save_z (ns, nz): states at sorted times, filled by the method's
    interpolant inside the step that contains them (a time on a stop: after its
    events). With ``every``, every accepted step is saved instead (``all_t``,
    ``save_z`` of the same capacity, grown when full). With ``dense``, every step
    is stored for interpolation later: ``d_t`` (cap + 1,) start times and the end,
    ``d_z`` (cap + 1, nz) start states (after events) and the end, ``d_k``
    (cap, rows, nz) the method's per-step data (ERK: stages; Rosenbrock: end
    state and interpolant rows), ``d_have`` (cap,) int8 (extra interpolant stages
    present), ``d_seg`` (cap,) int64 the segment of each step. ``stats`` (6,)
    int64, written: rhs evaluations, accepted steps, rejected steps, saved rows,
    Jacobians, LU factorisations.
    """

    save_t: np.ndarray
    save_z: np.ndarray
    every: bool
    all_t: np.ndarray
    dense: bool
    d_t: np.ndarray
    d_z: np.ndarray
    d_k: np.ndarray
    d_have: np.ndarray
    d_seg: np.ndarray
    stats: np.ndarray


S_NFEV, S_NACC, S_NREJ, S_NSAVE, S_NJAC, S_NLU = range(6)


class Lin(NamedTuple):
    """Buffers of the dense implicit linear algebra: the Jacobian ``J`` (n, n), two
    factored matrices with their pivots (a system uses one or both), and the diagonal
    mass matrix ``mass`` (empty: the identity)."""

    J: np.ndarray
    W1: np.ndarray
    piv1: np.ndarray
    W2: np.ndarray
    piv2: np.ndarray
    mass: np.ndarray


_EMPTY = np.zeros(0)


def lin(n, mass=_EMPTY):
    return Lin(np.zeros((n, n)), np.zeros((n, n)), np.zeros(n, dtype=np.int64), np.zeros((n, n)),
               np.zeros(n, dtype=np.int64), mass)


def record(nz, save_t=_EMPTY, every=False, dense=False, rows=1, cap=0):
    """A `Record` for states of size ``nz`` (capacity ``cap`` for every-step saving or
    storage; grown by the loops)."""
    ns = cap if every else save_t.shape[0]
    dcap = cap if dense else 0
    return Record(save_t, np.zeros((ns, nz)), every, np.zeros(cap if every else 0), dense,
                  np.zeros(dcap + 1), np.zeros((dcap + 1, nz)), np.zeros((dcap, rows, nz)),
                  np.zeros(dcap, dtype=np.int8), np.zeros(dcap, dtype=np.int64),
                  np.zeros(6, dtype=np.int64))
