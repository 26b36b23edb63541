"""`NLME.fit_multistart`: whole population fits from many start points, through the
mechanism of `sciml.fit_multistart` (`sciml.multistart.run_starts`: threads, a Dask
cluster, a resumable results folder)."""

import contextlib
import copy
import time

import numpy as np

from sciml._tier import one_blas_thread
from sciml.multistart import StartFit, failed_start, run_starts

__all__ = ["fit_multistart"]


def fit_multistart(pop, subjects, starts, seed, spread, method, fixed, client, results,
                   progress, workers, covariance, fit_options):
    """See `NLME.fit_multistart` (which checks ``method`` and ``spread``)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"NLME.fit_multistart: `seed` must be an int >= 0, got {seed!r}")
    x0 = pop._start(None)
    free = pop._free(fixed)
    if isinstance(starts, (int, np.integer)) and not isinstance(starts, bool):
        if starts < 1:
            raise ValueError(f"NLME.fit_multistart: `starts` must be a positive int or an "
                             f"array of start vectors, got {starts!r}")
        X = np.tile(x0, (int(starts), 1))
        for k, child in enumerate(np.random.SeedSequence(seed).spawn(int(starts))):
            X[k, free] += spread * np.random.default_rng(child).standard_normal(free.size)
    else:
        X = np.array(starts, dtype=float)
        if X.ndim != 2 or X.shape[1] != x0.shape[0] or not np.all(np.isfinite(X)):
            raise ValueError(f"NLME.fit_multistart: `starts` as an array must be finite, "
                             f"of shape (n_starts, {x0.shape[0]}), got {X.shape}")
    task = _StartTask(pop, list(subjects), method, dict(fit_options, fixed=fixed))
    res = run_starts(task, X, client, results, progress, workers)
    res.best_fit = pop.fit(subjects, method, start=res.best.params, fixed=fixed,
                           max_iter=0, covariance=covariance,
                           **{k: v for k, v in fit_options.items()
                              if k not in ("max_iter", "stages")})
    return res


class _StartTask:
    """One start of `NLME.fit_multistart` (`sciml.multistart.run_starts`'s task)."""

    def __init__(self, pop, subjects, method, options):
        self.pop, self.subjects, self.method, self.options = pop, subjects, method, options

    def __call__(self, k, x0):
        pop = copy.copy(self.pop)
        pop.threads = 1  # the starts fill the cores
        pop.workers = pop.client = None
        t0 = time.perf_counter()
        with one_blas_thread():
            try:
                f = pop.fit(self.subjects, self.method, start=x0, covariance=False,
                            **self.options)
            except Exception as e:  # one start's failure is a result, not the run's end
                return failed_start(k, x0, e, time.perf_counter() - t0)
        ok = np.isfinite(f.objective)
        return StartFit(k, x0, f._x.copy(), f.objective, 0.0, f.objective,
                        np.array([f.objective]), f.n_iter, 0,
                        "done" if f.success else "not_converged", "ok" if ok else "failed",
                        "" if ok else f.message, time.perf_counter() - t0)

    def warm(self, x0):
        """One objective here before the fan-out (the subjects' solves compiled or loaded)."""
        with contextlib.suppress(Exception):
            self.pop.objective(self.subjects[:1], method=self.method)

    def portable(self):
        return self
