"""Python side of what every solver shares: the dose schedule and storage sizing.

`schedule` turns a problem's doses into the arrays the compiled loops read
(see `_common_template` for their meaning). Everything here runs once per
solve, outside the compiled loop.
"""

from dataclasses import dataclass

import numpy as np

from .base import NEED_STORAGE

_NO_INT = np.zeros(0, dtype=np.int64)
_NO_FLOAT = np.zeros(0)


@dataclass
class Schedule:
    """Stops, per-segment infusion rates and boluses of one problem over its tspan.

    stops : (m + 1,) float64 -- t0, dose boundaries and tstops inside the span, tf
    seg_rate : (m, n) float64 -- infusion rate added to du/dt on [stops[k], stops[k+1])
    bolus_k, bolus_i : (nb,) int64 -- stop index and state index of each bolus
    bolus_a : (nb,) float64 -- amounts
    """

    stops: np.ndarray
    seg_rate: np.ndarray
    bolus_k: np.ndarray
    bolus_i: np.ndarray
    bolus_a: np.ndarray

    @property
    def n_segments(self):
        return self.stops.shape[0] - 1


def schedule(prob):
    """The `Schedule` of an `ODEProblem` (doses outside ``[t0, tf]`` are dropped).

    Dose times come from the same float arrays as the stops, so matching them
    by equality is exact: a bolus at ``t`` is applied on arrival at the stop
    ``t``, an infusion is active on exactly the segments it covers.
    """
    t0, tf = prob.tspan
    da = prob.dose_arrays
    n = prob.u0.shape[0]
    if da.tstops.size == 0:  # no doses, no tstops: the common case, made cheap
        return Schedule(np.array([t0, tf]), np.zeros((1, n)), _NO_INT, _NO_INT, _NO_FLOAT)
    inner = da.tstops[(da.tstops > t0) & (da.tstops < tf)]
    stops = np.concatenate([[t0], inner, [tf]]).astype(np.float64)
    starts = stops[:-1]
    seg_rate = np.zeros((starts.shape[0], n))
    for a, b, i, r in zip(da.inf_t0, da.inf_t1, da.inf_i, da.inf_rate):
        seg_rate[(a <= starts) & (starts < b), i] += r
    keep = (da.bolus_t >= t0) & (da.bolus_t <= tf)
    bolus_k = np.searchsorted(stops, da.bolus_t[keep]).astype(np.int64)
    assert np.array_equal(stops[bolus_k], da.bolus_t[keep]), "bolus time missing from stops"
    return Schedule(stops, seg_rate, bolus_k, da.bolus_i[keep].astype(np.int64),
                    da.bolus_a[keep].astype(np.float64))


def initial_capacity(sched, max_steps, dt=None):
    """Steps to reserve for per-step storage before the first try.

    Exact for a fixed step ``dt``; a guess for adaptive solves (grown by
    `grown_capacity` when the loop reports NEED_STORAGE).
    """
    span = sched.stops[-1] - sched.stops[0]
    if dt is not None:
        need = int(np.ceil(span / dt * (1 + 1e-12))) + 2 * sched.n_segments + 1
    else:
        need = 128 + 4 * sched.n_segments
    return max(1, min(need, max_steps + 1))


def grown_capacity(cap, t_reached, sched, max_steps):
    """A larger capacity after running out at ``t_reached``: extrapolate, with margin."""
    t0, tf = sched.stops[0], sched.stops[-1]
    frac = (t_reached - t0) / (tf - t0)
    guess = cap / frac * 1.3 if frac > 0.05 else 8 * cap
    return int(min(max(2 * cap, guess), max_steps + 1))


def needs_storage(status):
    return status == NEED_STORAGE
