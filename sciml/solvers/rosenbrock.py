"""Rosenbrock methods for stiff problems: `Rodas5`.

The method is data (class attributes), checked once per class on
construction; the step math is the compiled loop `ros_solve` of
`sciml.solvers._ros_template`, pasted into every model module.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from sciml._jit import jit

from . import _ros_template as _rt
from . import common
from .base import NEED_STORAGE, RawSolution, Solver

_A6 = (-14.09640773051259, 6.925207756232704, -41.47510893210728, 2.343771018586405,
       24.13215229196062)


class Rodas5(Solver):
    """Rosenbrock method of order 5 with an embedded order-4 error estimate (stiff problems).

    Eight stages, one Jacobian (the model's `jac_into`) and one LU of
    ``W = I/(h*gamma) - J`` per step; L-stable and stiffly accurate, so it
    suits stiff kinetics (Robertson), relaxation oscillators (Van der Pol
    with large mu) and PK/PD systems with fast and slow compartments. The
    dense output is the method's own interpolant of order 4. For a
    non-autonomous model the df/dt terms use a forward difference of
    `rhs_into` in t (one extra call per step); see `_ros_template`.

    The coefficients are given in the transformed form of Hairer & Wanner
    (stage increments ``k_i``; ``u_new = u + sum_i b_i k_i``; error
    ``sum_i (b_i - b_embedded_i) k_i``; dense output
    ``u(θ) = (1-θ) u0 + θ (u1 + (1-θ) (K1 + θ (K2 + θ K3)))``,
    ``K_j = sum_i H[j][i] k_i``). On construction the class checks its data:
    the stage times and time-derivative weights match the original
    (alpha, gamma) form, the solution satisfies every order condition up to
    order 5, the embedded one up to 4, and the interpolant up to 4.

    Parameters
    ----------
    adaptive : bool
        Error-controlled steps (default); False takes fixed steps of ``dt``
        (``sciml.solve(..., dt=...)``), e.g. for convergence studies.
    safety, qmin, qmax : float
        Step-size controller: safety factor on the predicted step, and the
        bounds of the factor by which one step may shrink or grow.
    beta2 : float
        Weight of the previous error in the PI controller (0: plain
        controller); the current error's exponent is
        ``beta1 = 1/5 - 0.75 * beta2``, as for the explicit solvers.

    References
    ----------
    G. Di Marzo, "RODAS5(4) -- Méthodes de Rosenbrock d'ordre 5(4) adaptées aux
    problèmes différentiels-algébriques", Master's thesis, Université de Genève, 1993.
    E. Hairer, G. Wanner, "Solving Ordinary Differential Equations II", 2nd ed.,
    Springer 1996, Section IV.7 (Rosenbrock methods, transformed form) and IV.8.
    Coefficients (including the interpolation coefficients H) as tabulated in
    OrdinaryDiffEq.jl, ``rosenbrock_tableaus.jl`` (``Rodas5Tableau``; MIT licence).
    """

    name = "Rodas5"
    order = 5
    embedded_order = 4
    dense_order = 4
    adaptive = True

    gamma = 0.19
    c = (0.0, 0.38, 0.3878509998321533, 0.4839718937873840, 0.4570477008819580, 1.0, 1.0, 1.0)
    d = (0.19, -0.1823079225333714636, -0.319231832186874912, 0.3449828624725343,
         -0.377417564392089818, 0.0, 0.0, 0.0)
    a = (
        (),
        (2.0,),
        (3.040894194418781, 1.041747909077569),
        (2.576417536461461, 1.622083060776640, -0.9089668560264532),
        (2.760842080225597, 1.446624659844071, -0.3036980084553738, 0.2877498600325443),
        _A6,
        (*_A6, 1.0),  # stages 7 and 8 continue from the stage-6 input: stiffly accurate
        (*_A6, 1.0, 1.0),
    )
    C = (
        (),
        (-10.31323885133993,),
        (-21.04823117650003, -7.234992135176716),
        (32.22751541853323, -4.943732386540191, 19.44922031041879),
        (-20.69865579590063, -8.816374604402768, 1.260436877740897, -0.7495647613787146),
        (-46.22004352711257, -17.49534862857472, -289.6389582892057, 93.60855400400906,
         318.3822534212147),
        (34.20013733472935, -14.15535402717690, 57.82335640988400, 25.83362985412365,
         1.408950972071624, -6.551835421242162),
        (42.57076742291101, -13.80770672017997, 93.98938432427124, 18.77919633714503,
         -31.58359187223370, -6.685968952921985, -5.810979938412932),
    )
    b = (*_A6, 1.0, 1.0, 1.0)             # u_new = (input of stage 8) + k_8
    b_embedded = (*_A6, 1.0, 1.0, 0.0)    # the input of stage 8: error = k_8
    H = (
        (27.354592673333357, -6.925207756232857, 26.40037733258859, 0.5635230501052979,
         -4.699151156849391, -1.6008677469422725, -1.5306074446748028, -1.3929872940716344),
        (44.19024239501722, 1.3677947663381929e-13, 202.93261852171622, -35.5669339789154,
         -181.91095152160645, 3.4116351403665033, 2.5793540257308067, 2.2435122582734066),
        (-44.0988150021747, -5.755396159656812e-13, -181.26175034586677, 56.99302194811676,
         183.21182741427398, -7.480257918273637, -5.792426076169686, -5.32503859794143),
    )

    _checked = {}

    def __init__(self, adaptive=True, safety=0.9, qmin=0.2, qmax=6.0, beta2=0.04):
        cls = type(self)
        if cls not in Rodas5._checked:
            Rodas5._checked[cls] = _tableau_arrays(cls)
        self._tab = Rodas5._checked[cls]
        name = cls.__name__
        if not isinstance(adaptive, (bool, np.bool_)):
            raise TypeError(f"{name}: `adaptive` must be True or False, got {adaptive!r}")
        self.adaptive = bool(adaptive)
        self.safety = _number(name, "safety", safety, 0.0, 1.0)
        self.qmin = _number(name, "qmin", qmin, 0.0, 1.0)
        self.qmax = _number(name, "qmax", qmax, 1.0, math.inf)
        if isinstance(beta2, bool) or not isinstance(beta2, (int, float)) \
                or not 0 <= beta2 < 0.2:
            raise ValueError(f"{name}: `beta2` must be a number in [0, 0.2), got {beta2!r}")
        self.beta2 = float(beta2)
        self.beta1 = 1.0 / (self.embedded_order + 1) - 0.75 * self.beta2

    def __repr__(self):
        return f"{type(self).__name__}()" if self.adaptive else \
            f"{type(self).__name__}(adaptive=False)"

    def _run(self, prob, saveat, rtol, atol, dt, max_steps, dense):
        """Integrate one problem; see `sciml.solve` (arguments already validated there).

        saveat : None (every accepted step) or sorted float64 times in tspan.
        rtol : float; atol : (n_states,) float64; dt : None or the first step.
        """
        model = prob.model
        mod = model.module
        if not hasattr(mod, "ros_solve"):
            raise RuntimeError("the model's generated module has no Rosenbrock loop; it was "
                               "built without `sciml.solvers.TEMPLATES` (rebuild the model)")
        if not hasattr(mod, "jac_into"):
            raise ValueError(f"{type(self).__name__} needs the model's Jacobian kernel "
                             "`jac_into(J, u, p, t, ws)`, which this model lacks")
        n = model.n_states
        sched = common.schedule(prob)
        every_step = saveat is None
        save_t = np.zeros(0) if every_step else saveat
        store = bool(dense) or every_step
        tab = self._tab
        s, nh = tab["a"].shape[0], tab["H"].shape[0]
        u = prob.u0.copy()
        ws = model.workspace()
        save_u = np.zeros((save_t.shape[0], n))
        fixed_dt = None if self.adaptive else dt
        cap = common.initial_capacity(sched, max_steps, fixed_dt) if store else 0
        ts, us, kd = np.zeros(cap + 1), np.zeros((cap + 1, n)), np.zeros((cap, 1 + nh, n))
        scratch = (np.zeros((s, n)), np.zeros((_rt.ROS_NV, n)), np.zeros((1 + nh, n)),
                   np.zeros((n, n)), np.zeros((n, n)), np.zeros(n, dtype=np.int64))
        cf = np.zeros(_rt.ROS_CF_SIZE)
        ci = np.zeros(_rt.ROS_CI_SIZE, dtype=np.int64)
        while True:
            status = mod.ros_solve(
                tab["a"], tab["C"], tab["c"], tab["d"], tab["b"], tab["e"], tab["H"],
                tab["gamma"], self.embedded_order, self.adaptive,
                u, prob.params, ws, not getattr(mod, "AUTONOMOUS", False),
                sched.stops, sched.seg_rate, sched.bolus_k, sched.bolus_i, sched.bolus_a,
                save_t, save_u,
                rtol, atol, float(dt or 0.0), max_steps,
                self.safety, self.qmin, self.qmax, self.beta1, self.beta2,
                store, ts, us, kd, *scratch, cf, ci)
            if status != NEED_STORAGE:
                break
            # Grow the step storage; the loop resumes from its carry (cf, ci, u).
            cap = common.grown_capacity(cap, cf[_rt.ROS_CF_T], sched, max_steps)
            ts, us, kd = _grow(ts, cap + 1), _grow(us, cap + 1), _grow(kd, cap)

        nst = int(ci[_rt.ROS_CI_NSTEP])
        stats = {"nfev": int(ci[_rt.ROS_CI_NFEV]), "njac": int(ci[_rt.ROS_CI_NJAC]),
                 "nlu": int(ci[_rt.ROS_CI_NLU]), "n_accepted": int(ci[_rt.ROS_CI_NACC]),
                 "n_rejected": int(ci[_rt.ROS_CI_NREJ])}
        if every_step:
            t_out, u_out = ts[:nst + 1].copy(), us[:nst + 1].copy()
        else:
            k = int(ci[_rt.ROS_CI_SAVED])
            t_out, u_out = save_t[:k].copy(), save_u[:k]
        dense_data = RosDense(ts[:nst + 1], us[:nst + 1], kd[:nst]) if dense else None
        return RawSolution(t_out, u_out, int(status), float(cf[_rt.ROS_CF_T]), stats, dense_data)

    def interpolate(self, dense, t, out):
        """Write the dense-output state at times `t` into `out`.

        Parameters
        ----------
        dense : RosDense
            ``RawSolution.dense`` of a run of this solver.
        t : float64 (m,)
            Times within ``[dense.ts[0], dense.ts[-1]]``, any order. A time on
            a step boundary gives the state after any dose there
            (right-continuous).
        out : float64 (m, n)
            Written.
        """
        ts, us, kd = dense
        t = np.ascontiguousarray(t, dtype=np.float64)
        if t.ndim != 1 or out.shape != (t.shape[0], us.shape[1]):
            raise ValueError(f"interpolate: `t` must be 1-D and `out` of shape (len(t), "
                             f"{us.shape[1]}); got {t.shape} and {out.shape}")
        if t.size and not (t.min() >= ts[0] and t.max() <= ts[-1]):
            raise ValueError(f"interpolate: `t` must lie in the solved interval "
                             f"[{ts[0]}, {ts[-1]}]; got [{t.min()}, {t.max()}]")
        _interpolate_into(out, t, ts, us, kd)
        return out


class RosDense(NamedTuple):
    """Per-step storage of a Rosenbrock solve, for `Rodas5.interpolate`.

    ts (N + 1,), us (N + 1, n): step start times and post-dose start states
    (last row: the end); kd (N, 4, n): each step's pre-dose end state, then
    its interpolation vectors ``K_1, K_2, K_3``.
    """

    ts: np.ndarray
    us: np.ndarray
    kd: np.ndarray


@jit
def _interpolate_into(out, tq, ts, us, kd):
    nst = kd.shape[0]
    for q in range(tq.shape[0]):
        tt = tq[q]
        if nst == 0 or tt >= ts[nst]:
            out[q, :] = us[nst]
            continue
        i = np.searchsorted(ts, tt, side="right") - 1
        i = min(max(i, 0), nst - 1)
        _rt.ros_dense_eval(out[q], (tt - ts[i]) / (ts[i + 1] - ts[i]), us[i], kd[i, 0], kd[i])


def _grow(a, rows):
    b = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    b[:a.shape[0]] = a
    return b


def _number(cls, name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not (lo < v <= hi):
        raise ValueError(f"{cls}: `{name}` must be a number in ({lo:g}, {hi:g}], got {v!r}")
    return float(v)


# ---- checking the method's data ------------------------------------------------------------


def _lower(rows, s, name, cls):
    if len(rows) != s or any(len(r) != i for i, r in enumerate(rows)):
        raise ValueError(f"{cls.__name__}.{name} must have rows of length 0, 1, ..., {s - 1}")
    M = np.zeros((s, s))
    for i, r in enumerate(rows):
        M[i, :i] = r
    return M


def _tableau_arrays(cls):
    """Check the class's coefficients; return them as arrays for the compiled loop."""
    s = len(cls.c)
    a, C = _lower(cls.a, s, "a", cls), _lower(cls.C, s, "C", cls)
    c, d, b, bh = (np.asarray(v, dtype=np.float64) for v in (cls.c, cls.d, cls.b, cls.b_embedded))
    H = np.asarray(cls.H, dtype=np.float64)
    g = float(cls.gamma)
    if not (d.shape == b.shape == bh.shape == (s,) and H.ndim == 2 and H.shape[1] == s):
        raise ValueError(f"{cls.__name__}: `d`, `b`, `b_embedded` need {s} entries and `H` "
                         f"{s} columns")
    # Back to the original form: Gamma (with gamma on its diagonal) and alpha.
    Gam = np.linalg.inv(np.eye(s) / g - C)
    alpha = a @ Gam
    beta = alpha + Gam
    _require(np.abs(alpha.sum(1) - c).max() < 1e-10, cls, "c != row sums of alpha")
    _require(np.abs(Gam.sum(1) - d).max() < 1e-10, cls, "d != row sums of Gamma")
    _check_order(cls, "solution", b @ Gam, alpha, beta, cls.order)
    _check_order(cls, "embedded", bh @ Gam, alpha, beta, cls.embedded_order)
    for th in (0.2, 0.5, 0.9):
        # The interpolant's weights at theta, as in `ros_dense_eval`.
        w = th * b + th * (1 - th) * sum(th ** j * H[j] for j in range(H.shape[0]))
        _check_order(cls, "dense output", w @ Gam, alpha, beta, cls.dense_order, th)
    return {"a": a, "C": C, "c": c, "d": d, "b": b, "e": b - bh, "H": H, "gamma": g,
            "q": cls.embedded_order + 1}


def _check_order(cls, what, weights, alpha, beta, order, theta=1.0):
    """``sum_i weights_i Phi_i(t) = theta^|t| / density(t)`` for every tree up to `order`."""
    for q in range(1, order + 1):
        for t in _trees(q):
            res = weights @ _phi(t, alpha, beta) - theta ** q / _density(t)
            _require(abs(res) < 1e-10, cls, f"{what} fails an order-{q} condition "
                                            f"(residual {res:.2e})")


def _require(ok, cls, msg):
    if not ok:
        raise ValueError(f"{cls.__name__}: inconsistent method coefficients: {msg}")


@functools.cache
def _trees(order):
    """Rooted trees with `order` vertices, each a sorted tuple of its subtrees."""
    if order == 1:
        return [()]
    found = set()
    for first in range(1, order):
        for sub in _trees(first):
            for rest in _forests(order - 1 - first):
                found.add(tuple(sorted((sub, *rest))))
    return sorted(found)


def _forests(order):
    if order == 0:
        return [()]
    out = []
    for first in range(1, order + 1):
        for sub in _trees(first):
            out += [(sub, *rest) for rest in _forests(order - first)]
    return out


def _density(t):
    return (1 + sum(_size(u) for u in t)) * math.prod(_density(u) for u in t)


def _size(t):
    return 1 + sum(_size(u) for u in t)


def _phi(t, alpha, beta):
    """Elementary weights of a Rosenbrock method (Hairer & Wanner II, IV.7).

    A vertex with one child contributes ``beta`` (the J terms join in), a
    vertex with several children the product of ``alpha`` terms.
    """
    if not t:
        return np.ones(alpha.shape[0])
    if len(t) == 1:
        return beta @ _phi(t[0], alpha, beta)
    return math.prod(alpha @ _phi(u, alpha, beta) for u in t)
