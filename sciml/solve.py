"""`sciml.solve`: one entry point for every solver, one problem or many.

Checks the arguments (short messages naming the argument), turns ``saveat``
into times, calls the solver's `_run` (or `_run_many` for a list of
problems of one model, in parallel threads), and wraps the result in
`Solution`; a solve that stops early warns (`SolveWarning`) and returns the
partial solution.
"""

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ._jit import Threads, compiled, entry_point
from ._validate import (
    check_atol,
    check_dt,
    check_max_steps,
    check_rtol,
    lean_atol,
    saveat_times,
)
from .events import run_events
from .problem import ODEProblem, problem_list
from .segments import in_span, piece_problem, segments
from .solution import Solution, SolveWarning, _Redo, lean_solution
from .solvers.base import STATUS_TEXT, SUCCESS, RawSolution, Solver
from .solvers.erk import ExplicitRK, Tsit5


def solve(prob, solver=None, *, rtol=1e-6, atol=1e-6, saveat=None, dt=None,
          max_steps=100_000, dense=None, threads=None):
    """Integrate an `ODEProblem` (or a list of them).

    Parameters
    ----------
    prob : ODEProblem or list of ODEProblem
        A list is solved in parallel threads and gives a list of solutions.
    solver : Solver, optional
        A solver instance, e.g. ``sciml.Tsit5()`` (the default), ``sciml.Vern7()``,
        ``sciml.RK4()`` (fixed step: needs ``dt``), ``sciml.Rodas5()`` (stiff).
    rtol : float
        Relative tolerance of adaptive solvers (ignored with fixed steps).
    atol : float or array_like, (n_states,)
        Absolute tolerance, one for all states or one per state.
    saveat : None, float or array_like, optional
        None: save every accepted step. A number: save every ``saveat`` time
        units from ``tspan[0]`` (and at ``tspan[1]``). An array: save at these
        times (sorted, inside tspan); they are filled by interpolation, not by
        shortening steps. A time equal to a dose time gives the post-dose state.
    dt : float, optional
        The step of a fixed-step solver (required there); for an adaptive
        solver, the first step (default: estimated).
    max_steps : int
        Steps (accepted and rejected) allowed before giving up.
    dense : None or bool
        Per-step data for ``sol(t)`` anywhere (as in DifferentialEquations.jl,
        dense output follows ``saveat``). None (default): stored during the
        solve when ``saveat`` is None; with ``saveat`` given, the solve stores
        nothing per step and the first ``sol(t)`` re-runs it once, with the
        same steps, to get them. True: always stored during the solve.
        False: never (``sol(t)`` is then an error).
    threads : int, optional
        Threads for a list of problems (default: all of numba's).

    Returns
    -------
    Solution, or a list of Solution
        A solve that stops early (max steps, step size underflow, non-finite
        state) warns with a `SolveWarning` and returns what it reached.
    """
    if solver is None:
        solver = _default_solver()
    # The common case (one problem without doses, output times as a float64 array, no
    # dense storage, an explicit Runge-Kutta solver) takes a lean path: types checked
    # here, values in the compiled loop (an unexpected one comes back as status -1,
    # nothing solved, for the full path's checks to name). Written out inline: at a few
    # microseconds a solve, every Python step here shows (so ``prob._u0``, not the
    # property: a plain problem's u0 is an array).
    if (type(saveat) is np.ndarray and type(prob) is ODEProblem and prob._plain
            and threads is None and dense is not True and type(rtol) is float
            and type(max_steps) is int
            and saveat.dtype is _F64 and saveat.ndim == 1 and saveat.flags.c_contiguous
            and ((type(dt) is float and dt > 0.0) if dt is not None else solver.adaptive)
            and (type(atol) is float or lean_atol(atol, prob._u0.shape[0]))):
        lean = solver.__dict__.get("_lean_cache")  # set by ExplicitRK._lean only
        if lean is None or lean[0] is not prob.model:
            lean = solver._lean(prob.model) if isinstance(solver, ExplicitRK) else None
        if lean is not None:
            model, loop, n, extra, entries, left, (tab, settings) = lean
            ns = saveat.shape[0]
            out_u, keep = np.empty((ns, n)), np.empty(ns + extra)
            t0, tf = prob.tspan
            kern = model._asm.table  # the right-hand side is compiled by `_lean`
            # After the first call, the compiled entry point itself: every argument's type
            # is fixed by now (checked above, by ODEProblem, or made here), so numba's
            # dispatch on the types is skipped.
            call = entries.get(type(atol))
            if call is None:
                call = entry_point(loop, (kern, tab, settings, prob._u0, prob.params, saveat,
                                          out_u, keep, atol, t0, tf, rtol, 0.0, 1))
                if compiled(call):  # (not while interpreted: see entry_point)
                    entries[type(atol)] = call
            status = call(kern, tab, settings, prob._u0, prob.params, saveat, out_u, keep, atol,
                          t0, tf, rtol, 0.0 if dt is None else dt, max_steps)
            if left[0]:  # counting down to the fused entry point (`ExplicitRK._fuse`)
                left[0] -= 1
                if not left[0]:
                    solver._fuse(lean)
            if status >= 0:
                sol = lean_solution(prob, solver, out_u, keep, status,
                                    None if dense is False else (rtol, atol, dt, max_steps))
                if status != SUCCESS:
                    _warn_if_failed(sol, None)
                return sol
    return _solve(prob, solver, rtol, atol, saveat, dt, max_steps, dense, threads)


def _solve(prob, solver, rtol, atol, saveat, dt, max_steps, dense, threads):
    """`solve` for everything but its lean path: full checks, doses, lists of problems.

    (A separate function: its comprehensions would make `solve`'s locals closure
    cells, which cost the lean path ~0.2 us a call.)
    """
    solver = _check_solver(solver)
    probs, many = problem_list(prob, "", empty=": nothing to solve")
    rtol = check_rtol(rtol)
    atols = [check_atol(atol, p.model.n_states) for p in probs]
    dt = check_dt(solver, dt)
    max_steps = check_max_steps(max_steps)
    if dense is not None and not isinstance(dense, (bool, np.bool_)):
        raise TypeError(f"`dense` must be None, True or False, got {dense!r}")
    saveats = [saveat_times(saveat, p.tspan) for p in probs]
    store = bool(dense) if dense is not None else saveat is None
    lazy = dense is None and not store
    threads = Threads(threads)  # checked for one problem too
    if not many and probs[0].events:
        if probs[0].changes:
            raise ValueError("solve: a problem with both events and parameter changes is not "
                             "supported yet")
        if dense:
            raise ValueError("solve: dense output (`dense=True`) is not available for a "
                             "problem with events yet; pass the times as `saveat`")
        sol = _solve_events(solver, probs[0], saveats[0], rtol, atols[0], dt, max_steps)
        _warn_if_failed(sol, None, 4)
        return sol
    if not many and probs[0].changes:
        if dense:
            raise ValueError("solve: dense output (`dense=True`) is not available for a "
                             "problem with parameter changes yet; pass the times as `saveat`")
        sol = Solution(probs[0], solver, _run_segments(solver, probs[0], saveats[0], rtol,
                                                       atols[0], dt, max_steps))
        _warn_if_failed(sol, None, 4)
        return sol
    if many and any(p.changes or p.events for p in probs):
        return [_solve(p, solver, rtol, atol, saveat, dt, max_steps, dense, 1) for p in probs]
    if not many:
        raw = solver._run(probs[0], saveats[0], rtol, atols[0], dt, max_steps, store)
        redo = _Redo((solver, probs[0], probs[0].u0.copy(), saveats[0], rtol, atols[0], dt,
                      max_steps)) if lazy else None
        sol = Solution(probs[0], solver, raw, redo)
        _warn_if_failed(sol, None, 4)
        return sol
    raws = _run_many(solver, probs, saveats, rtol, atols, dt, max_steps, store, threads)
    sols = [Solution(p, solver, r, _Redo((solver, p, p.u0.copy(), sv, rtol, a, dt, max_steps))
                     if lazy else None)
            for p, r, sv, a in zip(probs, raws, saveats, atols)]
    for i, sol in enumerate(sols):
        _warn_if_failed(sol, i, 4)
    return sols


_F64 = np.dtype(np.float64)
_DEFAULT = []


def _default_solver():
    if not _DEFAULT:
        _DEFAULT.append(Tsit5())
    return _DEFAULT[0]


def _warn_if_failed(sol, index, stacklevel=3):
    if sol.status_code == SUCCESS:
        return
    which = "" if index is None else f" (problem {index})"
    warnings.warn(f"sciml.solve{which} stopped at t = {sol.t_end:.6g} before the end of tspan "
                  f"{sol.prob.tspan}: {STATUS_TEXT[sol.status_code]}; returning the partial "
                  "solution", SolveWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------- many problems


def _run_many(solver, probs, saveats, rtol, atols, dt, max_steps, dense, threads):
    """Problems grouped by (model, atol, kind of saveat); each group in one parallel call."""
    groups = {}
    for i, (p, s, a) in enumerate(zip(probs, saveats, atols)):
        groups.setdefault((id(p.model), a.tobytes(), s is None), []).append(i)
    raws = [None] * len(probs)
    with threads as nt:
        for idx in groups.values():
            sub = [probs[i] for i in idx]
            if hasattr(solver, "_run_many"):
                out = solver._run_many(sub, [saveats[i] for i in idx], rtol, atols[idx[0]], dt,
                                       max_steps, dense)
            else:  # the compiled loops release the GIL: plain threads run in parallel
                with ThreadPoolExecutor(max_workers=nt) as pool:
                    out = list(pool.map(
                        lambda i: solver._run(probs[i], saveats[i], rtol, atols[i], dt,
                                              max_steps, dense), idx))
            for i, r in zip(idx, out):
                raws[i] = r
    return raws


def _run_segments(solver, prob, saveat, rtol, atol, dt, max_steps):
    """One problem with parameter changes: its segments (`sciml.segments`) in turn, each
    from the state the one before reached; the saved rows and counts put together."""
    segs = segments(prob, prob.params)
    ts, us, stats = [], [], {}
    u, status, t_end = None, SUCCESS, prob.tspan[0]
    for k, seg in enumerate(segs):
        q = piece_problem(prob, seg.tspan, seg.p, seg.doses, u)
        lo, hi = seg.tspan
        last = k == len(segs) - 1
        sv = None
        if saveat is not None:
            mine = saveat[in_span(saveat, lo, hi, last)]
            sv = mine if last else np.append(mine, hi)  # the end state carries on
        raw = solver._run(q, sv, rtol, atol, dt, max_steps, False)
        for key, v in raw.stats.items():
            stats[key] = stats.get(key, 0) + v
        status, t_end = raw.status, raw.t_end
        keep = raw.t.shape[0] - (0 if last or status != SUCCESS else 1)
        ts.append(raw.t[:keep]), us.append(raw.u[:keep])
        if status != SUCCESS:
            break
        u = np.array(raw.u[-1])
    return RawSolution(np.concatenate(ts), np.concatenate(us), status, t_end, stats, None)


def _solve_events(solver, prob, saveat, rtol, atol, dt, max_steps):
    """One problem with events (`sciml.events`): its pieces between events put together.
    Saving every step, an event time appears twice, with the states before and after it
    (as DifferentialEquations.jl saves them); a requested time on an event gets the state
    after it."""
    pieces, msg = run_events(prob, solver, prob.params, rtol, atol, dt, max_steps)
    ts, us, stats = [], [], {}
    for pc in pieces:
        raw = pc.raw
        for key, v in raw.stats.items():
            stats[key] = stats.get(key, 0) + v
        end = pc.final and not pc.fired  # the span's end, saved itself
        if saveat is None:
            keep = raw.t <= pc.t1 if end else raw.t < pc.t1
            ts.append(raw.t[keep]), us.append(raw.u[keep])
            if pc.fired:
                ts.append(np.array([pc.t1])), us.append(pc.u_minus[None, :])
        else:
            mine = saveat[in_span(saveat, pc.t0, pc.t1, end)]
            out = np.empty((mine.shape[0], raw.u.shape[1]))
            if mine.size:
                solver.interpolate(raw.dense, mine, out)
            ts.append(mine), us.append(out)
    last = pieces[-1]  # (a failed solve's piece ends where it stopped)
    status = int(last.raw.status) if msg else SUCCESS
    raw = RawSolution(np.concatenate(ts), np.concatenate(us), status, float(last.t1), stats,
                      None)
    sol = Solution(prob, solver, raw)
    fired = [(pc.t1, k) for pc in pieces for k in pc.fired]
    sol.t_events = np.array([t for t, _ in fired], dtype=np.float64)
    sol.i_events = np.array([k for _, k in fired], dtype=np.int64)
    return sol


def _check_solver(solver):
    if solver is None:
        return Tsit5()
    if isinstance(solver, type) and issubclass(solver, Solver):
        raise TypeError(f"`solver` must be a solver instance: write {solver.__name__}() "
                        f"(with parentheses), not {solver.__name__}")
    if not isinstance(solver, Solver):
        raise TypeError(f"`solver` must be a sciml solver such as sciml.Tsit5(), "
                        f"got {solver!r}")
    return solver
