"""Explicit Runge-Kutta solvers: a tableau as data, one shared compiled loop.

Every solver here is settings plus a `ButcherTableau` (see `tableaus`); the
integration itself is `erk_solve` of the model's generated module (pasted
from `_erk_template`), which takes the tableau's arrays as arguments.
"""

import re
from typing import NamedTuple

import numpy as np

from . import common, tableaus
from .base import NEED_STORAGE, RawSolution, Solver


class ERKDense(NamedTuple):
    """Per-step storage of an ERK solve, for `ExplicitRK.interpolate`.

    ts (n_steps + 1,), us (n_steps + 1, n): step start times / post-dose states
    (last row: the end); ks (n_steps, s_all, n): stages; have (n_steps,) int8:
    extra interpolant stages present; seg (n_steps,): dose segment of each
    step; plus what computing missing extra stages needs.
    """

    ts: np.ndarray
    us: np.ndarray
    ks: np.ndarray
    have: np.ndarray
    seg: np.ndarray
    n_steps: int
    module: object
    params: np.ndarray
    seg_rate: np.ndarray


def _positive(cls, name, v, upper=None):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not np.isfinite(v) or v <= 0 or (upper is not None and v > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise ValueError(f"{cls}: `{name}` must be a finite number > 0{bound}, got {v!r}")
    return float(v)


class ExplicitRK(Solver):
    """Base of the explicit Runge-Kutta solvers (a subclass sets `tableau`).

    Any checked `ButcherTableau` runs in the same compiled loop, so a new
    method is a subclass with a ``tableau`` class attribute and a docstring
    with its reference.

    Parameters
    ----------
    adaptive : bool, optional
        Error-controlled steps (default, for tableaus with an embedded pair);
        False takes fixed steps of ``dt`` (``sciml.solve(..., dt=...)``).
    safety, qmin, qmax : float
        Step-size controller: safety factor on the predicted step, and the
        bounds of the factor by which one step may shrink or grow.
    beta2 : float
        Weight of the previous error in the PI controller (0: plain
        controller). The current error's exponent is
        ``beta1 = 1 / (embedded_order + 1) - 0.75 * beta2`` (Hairer & Wanner's
        DOPRI5 choice, 0.04 there).
    """

    tableau: tableaus.ButcherTableau = None

    def __init__(self, adaptive=None, safety=0.9, qmin=0.2, qmax=10.0, beta2=0.04):
        cls = type(self).__name__
        tab = self.tableau
        if not isinstance(tab, tableaus.ButcherTableau):
            raise TypeError(f"{cls}: an explicit RK solver needs a `tableau` (a ButcherTableau "
                            "class attribute); use Tsit5(), DP5(), ... or subclass with one")
        if adaptive is None:
            adaptive = tab.b_error is not None
        if not isinstance(adaptive, (bool, np.bool_)):
            raise TypeError(f"{cls}: `adaptive` must be True or False, got {adaptive!r}")
        if adaptive and tab.b_error is None:
            raise ValueError(f"{cls}: has no error estimate, so it cannot be adaptive; "
                             "use a fixed step (`dt=`) or an adaptive solver such as Tsit5()")
        self.adaptive = bool(adaptive)
        self.safety = _positive(cls, "safety", safety, upper=1.0)
        self.qmin = _positive(cls, "qmin", qmin, upper=1.0)
        self.qmax = _positive(cls, "qmax", qmax)
        if self.qmax <= 1.0:
            raise ValueError(f"{cls}: `qmax` must be > 1, got {qmax!r}")
        if isinstance(beta2, bool) or not isinstance(beta2, (int, float)) \
                or not 0 <= beta2 < 0.2:
            raise ValueError(f"{cls}: `beta2` must be a number in [0, 0.2), got {beta2!r}")
        self.beta2 = float(beta2)
        q = tab.embedded_order if tab.embedded_order is not None else tab.order
        self.beta1 = 1.0 / (q + 1) - 0.75 * self.beta2

    @property
    def name(self):
        return type(self).__name__

    @property
    def order(self):
        return self.tableau.order

    def __repr__(self):
        default = self.tableau.b_error is not None
        return f"{self.name}()" if self.adaptive == default else \
            f"{self.name}(adaptive={self.adaptive})"

    # ------------------------------------------------------------ compiled args

    def _tableau_args(self):
        tab = self.tableau
        e = tab.b_error if tab.b_error is not None else np.zeros_like(tab.b)
        return (tab.A, tab.b, e, tab.c, tab.b_dense, tab.n_step_stages, _end_stage(tab),
                self.adaptive, tab.order)

    def __setattr__(self, name, value):
        # A changed setting invalidates the packed vector of `_packed`.
        self.__dict__.pop("_packed_cache", None)
        self.__dict__.pop("_lean_cache", None)
        object.__setattr__(self, name, value)

    def _packed(self):
        """Tableau and controller in one float64 vector, for `erk_solve_saveat` (cached).

        Layout: ``ERK_TAB_HEAD`` numbers (s_all, d, n_step, end_stage, adaptive, order,
        safety, qmin, qmax, beta1, beta2), then A, b, e, c, b_dense row-major.
        """
        packed = self.__dict__.get("_packed_cache")
        if packed is not None:
            return packed
        A, b, e, c, P, n_step, end_stage, adaptive, order = self._tableau_args()
        head = [A.shape[0], P.shape[1], n_step, end_stage, float(adaptive), order, self.safety,
                self.qmin, self.qmax, self.beta1, self.beta2]
        packed = np.concatenate([np.asarray(head, dtype=np.float64), A.ravel(), b, e, c,
                                 P.ravel()])
        self.__dict__["_packed_cache"] = packed
        return packed

    def _lean(self, model):
        """``(model, loop, tab, n_states, extra, entries)`` for `sciml.solve`'s lean path
        (cached for the last model).

        ``loop`` is the model module's `erk_solve_saveat`, tableau-specialised for a
        built-in tableau (``erk_<key>_solve_saveat``); ``tab`` is `_packed`.
        """
        lean = self.__dict__.get("_lean_cache")
        if lean is not None and lean[0] is model:
            return lean
        key = next((k for k, t in BUILTIN.items() if t is self.tableau), None)
        mod = self._kernels(model)
        loop = getattr(mod, f"erk_{key}_solve_saveat", None) if key else None
        extra = model.n_states + model.n_params + mod.ERK_KEEP_TAIL  # `keep` beyond saveat
        lean = (model, loop or mod.erk_solve_saveat, self._packed(), model.n_states, extra,
                {})  # entry points by the type of atol (see `sciml.solve`)
        self.__dict__["_lean_cache"] = lean
        return lean

    def _ctrl_args(self, rtol, atol):
        return rtol, atol, self.safety, self.qmin, self.qmax, self.beta1, self.beta2

    @staticmethod
    def _kernels(model):
        mod = model.module
        if not hasattr(mod, "erk_solve"):
            raise RuntimeError("the model's generated module has no ERK loop; it was built "
                               "without `sciml.solvers.TEMPLATES` (rebuild the model)")
        return mod

    # ------------------------------------------------------------ one problem

    def _run(self, prob, saveat, rtol, atol, dt, max_steps, dense):
        """Integrate one problem; see `sciml.solve` (arguments already validated).

        saveat : None (every accepted step) or sorted float64 times in tspan.
        atol : (n_states,) float64. dt : None, or the fixed / initial step.
        """
        model = prob.model
        mod = self._kernels(model)
        sched = common.schedule(prob)
        n, s_all = model.n_states, self.tableau.n_stages
        fixed_dt = None if self.adaptive else dt
        cap = common.initial_capacity(sched, max_steps, fixed_dt)
        save_all = saveat is None
        save_t = np.zeros(0) if save_all else saveat
        ws = model.workspace()
        K = np.zeros((s_all, n))
        W = np.zeros((4, n))
        stats = np.zeros(4, dtype=np.int64)
        rtol_, atol_, *ctrl = self._ctrl_args(rtol, atol)
        while True:
            out_t = np.zeros(cap if save_all else 0)
            out_u = np.zeros((cap if save_all else save_t.shape[0], n))
            dcap = cap if dense else 0
            d = (np.zeros(dcap + 1), np.zeros((dcap + 1, n)), np.zeros((dcap, s_all, n)),
                 np.zeros(dcap, dtype=np.int8), np.zeros(dcap, dtype=np.int64))
            status, t_end = mod.erk_solve(
                *self._tableau_args(), prob.u0, prob.params, ws,
                sched.stops, sched.seg_rate, sched.bolus_k, sched.bolus_i, sched.bolus_a,
                save_all, save_t, out_t, out_u,
                rtol_, atol_, float(dt or 0.0), max_steps, *ctrl,
                dense, *d, K, W, stats)
            if status != NEED_STORAGE:
                break
            cap = common.grown_capacity(cap, t_end, sched, max_steps)
        return self._raw(status, t_end, stats, save_all, save_t, out_t, out_u, dense, d,
                         mod, prob, sched)

    def _raw(self, status, t_end, stats, save_all, save_t, out_t, out_u, dense, d, mod, prob,
             sched):
        n_out = int(stats[3])
        t = out_t[:n_out].copy() if save_all else save_t[:n_out].copy()
        u = out_u[:n_out].copy()
        dense_data = None
        if dense:
            n_steps = int(stats[1])
            ts, us, ks, have, seg = d
            dense_data = ERKDense(ts[:n_steps + 1], us[:n_steps + 1], ks[:n_steps],
                                  have[:n_steps], seg[:n_steps], n_steps, mod,
                                  prob.params.copy(), sched.seg_rate)
        st = {"nfev": int(stats[0]), "n_accepted": int(stats[1]), "n_rejected": int(stats[2])}
        return RawSolution(t, u, int(status), float(t_end), st, dense_data)

    # ------------------------------------------------------------ many problems

    def _run_many(self, probs, saveats, rtol, atol, dt, max_steps, dense):
        """Integrate problems of ONE model in parallel (`erk_solve_many`); a list of RawSolution.

        saveats : one entry per problem, as `_run`'s ``saveat``. Problems that
        run out of per-step storage are rerun with more.
        """
        results = [None] * len(probs)
        todo = list(range(len(probs)))
        scheds = [common.schedule(p) for p in probs]
        fixed_dt = None if self.adaptive else dt
        caps = [common.initial_capacity(s, max_steps, fixed_dt) for s in scheds]
        while todo:
            raws, t_ends = self._many_once([probs[i] for i in todo], [saveats[i] for i in todo],
                                           [scheds[i] for i in todo], [caps[i] for i in todo],
                                           rtol, atol, dt, max_steps, dense)
            again = []
            for i, raw, te in zip(todo, raws, t_ends):
                if raw is None:
                    caps[i] = common.grown_capacity(caps[i], te, scheds[i], max_steps)
                    again.append(i)
                else:
                    results[i] = raw
            todo = again
        return results

    def _many_once(self, probs, saveats, scheds, caps, rtol, atol, dt, max_steps, dense):
        model = probs[0].model
        mod = self._kernels(model)
        m, n, s_all = len(probs), model.n_states, self.tableau.n_stages

        def offsets(sizes):
            return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

        def cat(arrays, shape_tail=(), dtype=np.float64):
            arrays = [np.asarray(a, dtype=dtype) for a in arrays]
            return np.concatenate(arrays) if arrays else np.zeros((0,) + shape_tail, dtype)

        save_all = saveats[0] is None
        save_ts = [np.zeros(0) if save_all else s for s in saveats]
        out_rows = caps if save_all else [len(s) for s in save_ts]
        st_off = offsets([len(s.stops) for s in scheds])
        b_off = offsets([len(s.bolus_k) for s in scheds])
        sv_off = offsets([len(s) for s in save_ts])
        o_off = offsets(out_rows)
        d_off = offsets(caps if dense else [0] * m)
        nd = int(d_off[-1])
        out_t = np.zeros(int(o_off[-1]) if save_all else 0)
        out_u = np.zeros((int(o_off[-1]), n))
        d = (np.zeros(nd + m), np.zeros((nd + m, n)), np.zeros((nd, s_all, n)),
             np.zeros(nd, dtype=np.int8), np.zeros(nd, dtype=np.int64))
        stats = np.zeros((m, 4), dtype=np.int64)
        status = np.zeros(m, dtype=np.int64)
        t_end = np.zeros(m)
        U0 = np.stack([p.u0 for p in probs])
        Pm = np.stack([p.params for p in probs])
        WS = np.zeros((m, model.ws_size))
        rtol_, atol_, *ctrl = self._ctrl_args(rtol, atol)
        mod.erk_solve_many(
            *self._tableau_args(), U0, Pm, WS,
            cat([s.stops for s in scheds]), st_off, cat([s.seg_rate for s in scheds], (n,)),
            cat([s.bolus_k for s in scheds], dtype=np.int64),
            cat([s.bolus_i for s in scheds], dtype=np.int64),
            cat([s.bolus_a for s in scheds]), b_off,
            save_all, cat(save_ts), sv_off, out_t, out_u, o_off,
            rtol_, atol_, np.full(m, float(dt or 0.0)), max_steps, *ctrl,
            dense, *d, d_off, np.zeros((m, s_all, n)), np.zeros((m, 4, n)), stats, status,
            t_end)
        raws = []
        for i, prob in enumerate(probs):
            if status[i] == NEED_STORAGE:
                raws.append(None)
                continue
            o = slice(o_off[i], o_off[i + 1])
            di = slice(d_off[i], d_off[i + 1])
            dt_ = slice(d_off[i] + i, d_off[i + 1] + i + 1)
            di_d = (d[0][dt_], d[1][dt_], d[2][di], d[3][di], d[4][di])
            raws.append(self._raw(status[i], t_end[i], stats[i], save_all, save_ts[i],
                                  out_t[o] if save_all else out_t, out_u[o], dense, di_d, mod,
                                  prob, scheds[i]))
        return raws, t_end

    # ------------------------------------------------------------ dense output

    def interpolate(self, dense, t, out):
        """Dense output at sorted times `t` (inside the solved interval) into `out` (len(t), n)."""
        tab = self.tableau
        ws = np.zeros(max(int(dense.module.WS_SIZE), 1))
        tmp = np.zeros(out.shape[1])
        dense.module.erk_dense_eval(out, t, dense.ts, dense.us, dense.ks, dense.have, dense.seg,
                                    dense.n_steps, tab.A, tab.c, tab.b_dense,
                                    tab.n_step_stages, dense.params, ws, dense.seg_rate, tmp)


def _end_stage(tab):
    """A stage equal to f(t + h, u_new): the FSAL stage, else an extra stage with row b."""
    s = tab.n_step_stages
    if tab.fsal:
        return s - 1
    for i in range(s, tab.n_stages):
        if tab.c[i] == 1.0 and np.array_equal(tab.A[i], tab.b):
            return i
    return -1


class Tsit5(ExplicitRK):
    """Tsitouras' 5(4) pair with its own 4th-order interpolant: the default solver.

    7 stages (FSAL: 6 evaluations per step). Reference: Ch. Tsitouras,
    "Runge-Kutta pairs of order 5(4) satisfying only the first column
    simplifying assumption", Comput. Math. Appl. 62 (2011) 770-775.
    """

    tableau = tableaus.TSIT5


class DP5(ExplicitRK):
    """Dormand-Prince 5(4) pair with Shampine's 4th-order interpolant (as in scipy's RK45).

    References: J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta
    formulae", J. Comput. Appl. Math. 6 (1980) 19-26; L. F. Shampine, "Some
    practical Runge-Kutta formulas", Math. Comp. 46 (1986) 135-150.
    """

    tableau = tableaus.DP5


class BS3(ExplicitRK):
    """Bogacki-Shampine 3(2) pair with a cubic Hermite interpolant; good at loose tolerances.

    4 stages (FSAL: 3 evaluations per step). Reference: P. Bogacki,
    L. F. Shampine, "A 3(2) pair of Runge-Kutta formulas", Appl. Math. Lett.
    2 (1989) 321-325.
    """

    tableau = tableaus.BS3


class Vern7(ExplicitRK):
    """Verner's "most efficient" 7(6) pair with a 7th-order interpolant; for tight tolerances.

    10 stages per step; the interpolant needs 6 more, computed only for steps
    that contain output times (or when `Solution` is evaluated there).
    Reference: J. H. Verner, "Numerically optimal Runge-Kutta pairs with
    interpolants", Numer. Algorithms 53 (2010) 383-396.
    """

    tableau = tableaus.VERN7


class RK4(ExplicitRK):
    """The classical 4th-order Runge-Kutta method with fixed steps (``dt=``), Hermite output.

    Reference: W. Kutta, "Beitrag zur naeherungsweisen Integration totaler
    Differentialgleichungen", Z. Math. Phys. 46 (1901) 435-453.
    """

    tableau = tableaus.RK4


class Euler(ExplicitRK):
    """The explicit Euler method with fixed steps (``dt=``), Hermite output.

    Reference: E. Hairer, S. P. Norsett, G. Wanner, Solving Ordinary
    Differential Equations I, 2nd ed., Springer 1993, Sec. I.7.
    """

    tableau = tableaus.EULER


# ---------------------------------------------------------------- specialised loops
#
# The generic loop reads the tableau from arrays: for small systems (a few
# states) the loops over the coefficients, not the right-hand side, were most
# of a step (Lotka-Volterra, Tsit5: 4.7 us per solve against 2.6 us with the
# coefficients as literals). So for every built-in tableau the generated
# module also holds a copy of `erk_solve` (and of `erk_solve_saveat`, which
# calls it) whose stage, update and interpolation arithmetic is unrolled
# from the tableau's data. `sciml.solve`'s lean path uses it; the other paths
# keep the generic loop. Extra interpolant stages (Vern7) stay generic.

BUILTIN = {"tsit5": tableaus.TSIT5, "dp5": tableaus.DP5, "bs3": tableaus.BS3,
           "vern7": tableaus.VERN7, "rk4": tableaus.RK4, "euler": tableaus.EULER}


def _lit(x):
    return repr(float(x))


def _lincomb(coefs):
    terms = [f"{_lit(a)} * K[{j}, m]" for j, a in enumerate(coefs) if a != 0.0]
    return " + ".join(terms) if terms else "0.0"


def _tableau_kernels(key, tab):
    s, sa = tab.n_step_stages, tab.n_stages
    A, b, c, P, e = tab.A, tab.b, tab.c, tab.b_dense, tab.b_error
    pre = f"erk_{key}"
    # The lean loop has no doses (no infusion rate to add: `rhs_into`, not `com_rhs`),
    # and its K is borrowed (`sciml._jit.borrow`), so a row view costs nothing.
    L = ['@jit(inline="always")', f"def {pre}_stages(K, u, h, t, p, ws, tmp):",
         f'    """Stages 1..{s - 1} of {key}, coefficients unrolled (see `erk_stages`)."""',
         "    n = N_STATES"]
    for i in range(1, s):
        L += ["    for m in range(n):",
              f"        tmp[m] = u[m] + h * ({_lincomb(A[i, :i])})",
              f"    rhs_into(K[{i}], tmp, p, t + {_lit(c[i])} * h, ws)"]
    if s == 1:
        L.append("    return")
    L += ["", "", '@jit(inline="always")', f"def {pre}_combine(unew, err, u, h, K):",
          '    """``unew`` and the error estimate ``err`` of a step (see `erk_combine`)."""',
          "    n = N_STATES", "    for m in range(n):",
          f"        unew[m] = u[m] + h * ({_lincomb(b[:s])})"]
    if e is not None:
        L.append(f"        err[m] = h * ({_lincomb(e[:s])})")
    L += ["", "", '@jit(inline="always")', f"def {pre}_interp(out, row, theta, h, u, K):",
          '    """``out[row]`` = the interpolant at ``theta`` (see `erk_interp`)."""',
          "    n = N_STATES"]
    d = P.shape[1]
    used = [i for i in range(sa) if np.any(P[i] != 0)]
    for i in used:
        poly = _lit(P[i, d - 1])
        for j in range(d - 2, -1, -1):
            poly = f"({_lit(P[i, j])} + theta * {poly})"
        L.append(f"    w{i} = theta * h * {poly}")
    terms = " + ".join(f"w{i} * K[{i}, m]" for i in used) or "0.0"
    L += ["    for m in range(n):", f"        out[row, m] = u[m] + {terms}", "", ""]
    return "\n".join(L)


def _function_text(source, name):
    start = source.index(f"@jit\ndef {name}(")
    end = source.index("\n\n\n@", start)
    return source[start:end] + "\n\n\n"


def specialized_source():
    """Text pasted into every generated module after the ERK template: one loop per tableau.

    For each built-in tableau, ``erk_<key>_solve_saveat`` is `erk_solve_saveat` with the
    body of `erk_solve` pasted in (not called: a call passes ~25 arrays, and numba's
    reference counting of them, atomic increments and decrements, was ~1.4 us of a
    3.6 us solve), ``save_all`` and ``dense`` constant False (those branches compile
    away), the model's `rhs_into` called directly (the lean path has no doses, so no
    infusion rate to add), the state count and the tableau's sizes as constants, and
    the stage, update and interpolation arithmetic unrolled (`_tableau_kernels`).
    """
    from .._codegen import template_source
    from . import _erk_template

    src = template_source(_erk_template)
    loop = _function_text(src, "erk_solve")
    lean = _function_text(src, "erk_solve_saveat")
    body = loop[loop.index("    n = u0.shape[0]\n    s = n_step\n"):]
    head = lean[:lean.index("    status, t_end = erk_solve(")]
    bind = ("    n_step = int(tab[2])\n    end_stage = int(tab[3])\n    adaptive = tab[4] != 0.0\n"
            "    order = int(tab[5])\n    safety = tab[6]\n    qmin = tab[7]\n    qmax = tab[8]\n"
            "    beta1 = tab[9]\n    beta2 = tab[10]\n    save_all = False\n    dense = False\n"
            "    bolus_k = none_i\n    bolus_i = none_i\n    bolus_a = none_f\n"
            "    out_t = none_f\n    d_seg = none_i\n")
    swaps = [("erk_stages(K, u, h_try, t, p, ws, rate, A, c, 1, s, tmp)",
              "erk_{k}_stages(K, u, h_try, t, p, ws, tmp)"),
             ("    com_rhs(K[0], u, p, t, ws, rate)\n", "    rhs_into(K[0], u, p, t, ws)\n"),
             ("erk_combine(unew, u, h_try, b, K, s)", "erk_{k}_combine(unew, err, u, h_try, K)"),
             ("erk_error(err, h_try, e, K, s)", "pass  # err: in erk_{k}_combine"),
             ("erk_interp(out_u[sp], (save_t[sp] - t) / h_try, h_try, u, K, P)",
              "erk_{k}_interp(out_u, sp, (save_t[sp] - t) / h_try, h_try, u, K)"),
             ("def erk_solve_saveat(", "def erk_{k}_solve_saveat("),
             ("    return status, t\n",
              "    return erk_keep(keep, status, t, stats, save_t, u0, p, own_f, own_i)\n"),
             # the state count as a constant: numba unrolls the small per-state loops
             ("    n = u0.shape[0]\n    s = n_step\n", "    n = N_STATES\n    s = n_step\n"),
             # the tableau's sizes as constants too (the scratch views then have constant
             # shapes), and no int8 buffer for the dense flags that are never stored
             ("    s_all = int(tab[0])\n    d = int(tab[1])\n",
              "    s_all = {s_all}\n    d = {d}\n"),
             ("    d_have = np.zeros(0, dtype=np.int8)  # empty: no step is stored\n",
              "    d_have = none_i\n")]
    out = ["# --- tableau-specialised ERK loops (generated by sciml.solvers.erk)\n\n"]
    for key, tab in BUILTIN.items():
        text = head + bind + re.sub(r"\batol\b", "atol_v", body)
        for a, b in swaps:
            assert a in text, a
            text = text.replace(a, b.format(k=key, s_all=tab.n_stages, d=tab.b_dense.shape[1]))
        out.append(_tableau_kernels(key, tab) + "\n" + text)
    return "".join(out)
