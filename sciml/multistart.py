"""`sciml.fit_multistart`: many independent fits from seeded start points, on threads or Dask.

Multistart optimisation runs one `sciml.fit` per start point and keeps them
all, sorted by final loss: the lowest is the estimate, and how many starts
reach it (the waterfall plot, `MultistartResult.waterfall`) says how hard the
problem is. The starts are independent, so they run in parallel:

- ``client=None``: a pool of threads in this process. The compiled solvers
  and adjoints release the GIL, the optimizers' Python loop does not: on
  small models, whose gradients are quick next to that loop, the threads
  contend for it (see ``benchmarks/multistart.py``).
- ``client="local"``: an embedded ``dask.distributed.LocalCluster`` of
  worker processes, one per core with one thread each, started for the call
  and closed after it.
- a ``dask.distributed.Client``: whatever cluster it is connected to
  (``dask-jobqueue`` on HPC, ``dask-kubernetes``, a ``LocalCluster``).

Dask is optional (``pip install "dask[distributed]"``); ``import sciml`` never
imports it.

How the work is shipped to worker processes
-------------------------------------------
- The engine's compiled loops are cached on disk by numba. Before fanning
  out, this process computes one loss and gradient of the problem (compiling
  whatever is not cached yet), so that the workers load the machine code
  from the cache instead of compiling it again each. numba writes a cache
  file to a temporary name and renames it into place, so workers that do
  compile at the same time (an engine edited between runs, a fresh node)
  cannot leave a half-written file; at worst they compile the same code
  twice.
- The problems, data and fit options are pickled once and scattered to the
  workers (``client.scatter(..., broadcast=True)``). A `sciml.Model` pickles
  by its traced form (sympy expressions), its networks and its names, not
  by compiled code or the user's function; a worker rebuilds its kernels on
  first use (LLVM, milliseconds). A model made with `Model.from_kernels`
  cannot be pickled (its kernels are numba dispatchers): use threads.
  Custom activations (`nets.register_activation`) must be registered in the
  workers too (a module they import).
- Per task, only the start's index and its start point (n_params floats) go
  out, and one record (the fitted vector, losses, history) comes back.
- Each task limits numba to ``threads`` (default 1) and BLAS to one thread,
  and `client="local"` starts its workers with ``NUMBA_NUM_THREADS=1`` (and
  Dask's own ``OMP/MKL/OPENBLAS_NUM_THREADS=1``): workers x threads equals
  the cores, no oversubscription.
- A worker that dies mid-task has the task rerun on another worker by the
  scheduler. Results are written by this process only, one file per start
  index, so a start that ran twice is stored once; a start whose fit raised
  is recorded as ``status="failed"`` with the message and not retried. A
  start that kills every worker it runs on (Dask gives up after
  ``distributed.scheduler.allowed-failures``, 3) is a failed start too, not
  stored, so that a rerun tries it again.

Determinism
-----------
Start k depends on `seed` and k alone (``np.random.SeedSequence(seed).spawn``),
not on the number of starts, the workers or the order they finish in; each
fit is deterministic given its start point, so the same seed gives the same
fits on threads, on a cluster, and after a resume.
"""

import contextlib
import copy
import inspect
import logging
import math
import numbers
import os
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from ._tier import one_blas_thread, usable_cores
from ._validate import integer, number
from .fit import _check_problems, fit
from .solvers import Solver

__all__ = ["fit_multistart", "MultistartResult", "StartFit", "draw_starts", "run_starts",
           "FitTask"]

_INSTALL = 'pip install "dask[distributed]"'
_FIT_OPTIONS = frozenset(inspect.signature(fit).parameters) - {
    "prob_or_list", "data_or_list", "params", "progress", "objective"}


# ----------------------------------------------------------------------------- results


@dataclass
class StartFit:
    """One start's fit (what `MultistartResult` holds, one per start).

    Attributes
    ----------
    index : int
        The start's index (row of the start array; what `seed` drew for it).
    x0 : ndarray, (n_params,)
        The start point.
    params : ndarray, (n_params,)
        The best parameters the fit found (``x0`` for a failed start).
    loss, penalty, objective : float
        As in `sciml.FitResult` (``inf`` for a failed start).
    history : ndarray, (n_iters,)
        The objective per iteration.
    n_iters, n_evals : int
    stopped : str
        `sciml.FitResult.stopped` (``"done"``, ``"early_stop"``, ...), or
        ``"error"`` for a failed start.
    status : str
        ``"ok"``, or ``"failed"`` when the fit raised (``message`` says what).
    message : str
        The exception's type and text for a failed start, else ``""``.
    time_s : float
        Wall time of this start's fit, where it ran.
    """

    index: int
    x0: np.ndarray
    params: np.ndarray
    loss: float
    penalty: float
    objective: float
    history: np.ndarray
    n_iters: int
    n_evals: int
    stopped: str
    status: str
    message: str
    time_s: float

    def __repr__(self):
        extra = f", message={self.message!r}" if self.message else ""
        return (f"StartFit(index={self.index}, loss={self.loss:.6g}, status={self.status!r}, "
                f"n_iters={self.n_iters}, stopped={self.stopped!r}, "
                f"time_s={self.time_s:.3g}{extra})")

    def _arrays(self):
        return {k: np.asarray(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def _from_arrays(cls, z):
        kw = {}
        for k, f in cls.__dataclass_fields__.items():
            v = z[k]
            if f.type is np.ndarray:
                kw[k] = np.array(v, dtype=np.float64)
            elif f.type is int:
                kw[k] = int(v)
            elif f.type is float:
                kw[k] = float(v)
            else:
                kw[k] = str(v)
        return cls(**kw)


class MultistartResult:
    """What `fit_multistart` returns: every start's `StartFit`, sorted by final loss.

    Iterating gives the fits from the lowest loss up (failed starts last);
    ``result[0]`` (or ``result.best``) is the best fit.

    Attributes
    ----------
    fits : list of StartFit
        Sorted by (objective, index): ties keep the start order.
    time_s : float
        Wall time of the call (starts loaded from `results` cost nothing).
    n_resumed : int
        Starts read from the results folder rather than fitted by this call.
    """

    def __init__(self, fits, time_s=0.0, n_resumed=0):
        self.fits = sorted(fits, key=_order)
        self.time_s = float(time_s)
        self.n_resumed = int(n_resumed)

    def __iter__(self):
        return iter(self.fits)

    def __len__(self):
        return len(self.fits)

    def __getitem__(self, i):
        return self.fits[i]

    @property
    def best(self):
        """The fit with the lowest objective."""
        return self.fits[0]

    @property
    def losses(self):
        """Final objectives (loss + penalty), sorted, (n_starts,); inf for failed starts."""
        return np.array([f.objective for f in self.fits])

    @property
    def params(self):
        """Fitted vectors in the sorted order, (n_starts, n_params)."""
        return np.stack([f.params for f in self.fits])

    @property
    def indices(self):
        """Start indices in the sorted order, (n_starts,)."""
        return np.array([f.index for f in self.fits], dtype=np.int64)

    @property
    def n_failed(self):
        return sum(f.status != "ok" for f in self.fits)

    def n_best(self, rtol=1e-3, atol=1e-8):
        """How many starts ended within ``atol + rtol * |best|`` of the best objective."""
        v = self.losses
        return int(np.sum(v <= v[0] + atol + rtol * abs(v[0]))) if len(v) else 0

    def __repr__(self):
        best = f"{self.best.objective:.6g}" if self.fits else "-"
        return (f"MultistartResult({len(self)} starts, best={best}, "
                f"n_best={self.n_best()}, n_failed={self.n_failed}, "
                f"time_s={self.time_s:.3g})")

    def waterfall(self, ax=None, path=None, rtol=1e-3, log=None, title=None):
        """The waterfall plot: final objectives sorted from the best, one point per start.

        A plateau at the left is the starts that reached the best value (as
        many as `n_best`, drawn in another colour); steps are other local
        minima. PEtab/pyPESTO users know the plot from their own multistarts.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw; default: a new figure.
        path : str or path-like, optional
            Also save the figure there (PNG, PDF, ... by its extension).
        rtol : float
            The tolerance of "reached the best value" (see `n_best`).
        log : bool, optional
            A log y axis (default: when every finite objective is > 0).
        title : str, optional

        Returns
        -------
        matplotlib.figure.Figure
            Made without pyplot (any backend; no figure left open).
        """
        from matplotlib.figure import Figure

        if ax is None:
            fig = Figure(figsize=(5.5, 3.6), layout="constrained")
            ax = fig.subplots()
        else:
            fig = ax.figure
        v = self.losses
        ok = np.isfinite(v)
        rank = np.arange(1, len(v) + 1)
        nb = self.n_best(rtol)
        if log is None:
            log = bool(ok.any() and np.all(v[ok] > 0))
        ax.plot(rank[ok], v[ok], "-", color="0.7", lw=1, zorder=1)
        ax.plot(rank[:nb], v[:nb], "o", color="C3", ms=4, zorder=2,
                label=f"best value ({nb} of {len(v)})")
        rest = ok & (rank > nb)
        ax.plot(rank[rest], v[rest], "o", color="C0", ms=4, zorder=2, label="other starts")
        if (~ok).any():
            top = v[ok].max() if ok.any() else 1.0
            ax.plot(rank[~ok], np.full((~ok).sum(), top), "x", color="k", ms=5,
                    label=f"failed ({(~ok).sum()})")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("start (sorted by final objective)")
        ax.set_ylabel("final objective")
        ax.set_title(title or f"waterfall: {len(v)} starts", fontsize=10)
        ax.legend(fontsize=8)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _order(f):
    v = f.objective
    return (0 if math.isfinite(v) else 1, v if math.isfinite(v) else 0.0, f.index)


# ----------------------------------------------------------------------------- starts


def draw_starts(prob, n, seed=0, params=None, spread=0.5, bounds=None):
    """The start points `fit_multistart` uses for ``starts=n``: (n, n_params) float64.

    Start k is drawn from ``np.random.default_rng(np.random.SeedSequence(seed).spawn(n)[k])``,
    so it depends on `seed` and k only (the first 10 of 64 starts are the 10
    starts of ``starts=10``).

    - With `bounds` ``(lower, upper)`` (numbers or arrays of n_params):
      uniform in the box, every parameter (PEtab's convention, on the scale
      the parameters have in the vector).
    - Without: around `params` (default: the problem's ``params``). Each
      mechanistic parameter ``c`` becomes ``c * exp(spread * z)`` (z standard
      normal: the sign kept, log-normal spread; ``spread * z`` where c is 0),
      and each network's weights are drawn afresh as ``Chain.init_params``
      draws them (PyTorch's default: uniform in +-1/sqrt(fan_in)), with a seed from the
      same generator.
    """
    probs, _ = _problems(prob)
    model = probs[0].model
    n_params = model.n_params
    n = _n_starts(n)
    seed = _seed(seed)
    children = np.random.SeedSequence(seed).spawn(n)
    if bounds is not None:
        lo, hi = _bounds(bounds, n_params)
        return np.stack([lo + (hi - lo) * np.random.default_rng(c).random(n_params)
                         for c in children])
    center = _center(params, probs[0], n_params)
    number(spread, "spread", "fit_multistart", lo=0.0, lo_open=False)
    slices = model.param_slices
    mech = [slices[p].start for p in model.params]
    nets = model.nets
    out = np.empty((n, n_params))
    for k, c in enumerate(children):
        rng = np.random.default_rng(c)
        x = center.copy()
        z = rng.standard_normal(len(mech))
        for j, i in enumerate(mech):
            x[i] = center[i] * math.exp(spread * z[j]) if center[i] != 0 else spread * z[j]
        for name, chain in nets.items():
            x[slices[name]] = chain.init_params(int(rng.integers(2**63)), dtype=np.float64)
        out[k] = x
    return out


def _problems(prob):
    from .problem import problem_list

    return problem_list(prob, "fit_multistart: ", "prob_or_list", ": nothing to fit")


def _n_starts(n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"fit_multistart: `starts` must be a positive int or an array of "
                         f"shape (n_starts, n_params), got {n!r}")
    return int(n)


def _seed(seed):
    return integer(seed, "seed", "fit_multistart", lo=0)


def _bounds(bounds, n):
    try:
        lo, hi = bounds
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), (n,)).copy()
        hi = np.broadcast_to(np.asarray(hi, dtype=np.float64), (n,)).copy()
    except (TypeError, ValueError):
        raise ValueError(f"fit_multistart: `bounds` must be (lower, upper), numbers or arrays "
                         f"of length {n} (n_params), got {bounds!r}") from None
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        raise ValueError("fit_multistart: `bounds` must be finite with lower < upper for "
                         "every parameter")
    return lo, hi


def _center(params, prob, n):
    if params is None:
        return np.array(prob.params, dtype=np.float64)
    x = np.asarray(params, dtype=np.float64)
    if x.shape != (n,) or not np.all(np.isfinite(x)):
        raise ValueError(f"fit_multistart: `params` must be finite, of shape ({n},) "
                         f"(model.n_params), got shape {x.shape}")
    return x.copy()


def _start_array(starts, n_params):
    x = np.array(starts, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != n_params or x.shape[0] < 1:
        raise ValueError(f"fit_multistart: `starts` as an array must have shape (n_starts, "
                         f"{n_params}) (n_params), got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("fit_multistart: `starts` has non-finite entries")
    return np.ascontiguousarray(x)


# ----------------------------------------------------------------------------- the store


class _Store:
    """One ``start_NNNNN.npz`` per completed start in a folder; each written to a
    temporary name and renamed into place (atomic), by the calling process only."""

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise ValueError(f"fit_multistart: `results` must be a folder (created if "
                             f"missing), got the file {self.folder!r}")
        os.makedirs(self.folder, exist_ok=True)

    def path(self, k):
        return os.path.join(self.folder, f"start_{k:05d}.npz")

    def load(self, X):
        done = {}
        for k in range(X.shape[0]):
            p = self.path(k)
            if not os.path.exists(p):
                continue
            with np.load(p, allow_pickle=False) as z:
                rec = StartFit._from_arrays(z)
            if rec.x0.shape != X[k].shape or not np.array_equal(rec.x0, X[k]):
                raise ValueError(f"fit_multistart: `results` folder {self.folder!r} holds a "
                                 f"start {k} from another start point (another problem, seed "
                                 "or `starts`); use a new folder, or the same problem and "
                                 "starts to resume")
            done[k] = rec
        return done

    def save(self, rec):
        tmp = os.path.join(self.folder, f".start_{rec.index:05d}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **rec._arrays())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(rec.index))
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


# ----------------------------------------------------------------------------- one start


class FitTask:
    """One start of `fit_multistart`: ``task(k, x0) -> StartFit`` runs `sciml.fit` from
    ``x0`` (in a thread or a Dask worker). `run_starts` takes any object with this call,
    ``warm(x0)`` (compile here before the fan-out) and ``portable()`` (a copy that
    pickles): `sciml.nlme.NLME.fit_multistart` passes its own."""

    def __init__(self, prob, data, options):
        self.prob, self.data, self.options = prob, data, options

    def __call__(self, k, x0):
        opts = dict(self.options)
        if opts.get("optimizers") is not None:
            # Optimizers keep their state (Adam's moments) on the object: one copy per start,
            # or concurrent starts would share it.
            opts["optimizers"] = copy.deepcopy(opts["optimizers"])
        t0 = time.perf_counter()
        with one_blas_thread():
            try:
                r = fit(self.prob, self.data, params=x0, progress=False, **opts)
            except Exception as e:  # one start's failure is a result, not the run's end
                return failed_start(k, x0, e, time.perf_counter() - t0)
        return StartFit(k, x0, r.params, r.loss, r.penalty, r.objective, r.history,
                        r.n_iters, r.n_evals, r.stopped, "ok", "", time.perf_counter() - t0)

    def warm(self, x0):
        """One loss and gradient here, before the fan-out: compiles (or loads from numba's
        disk cache) the engine's loops the fits use, so that workers load them rather than
        compile."""
        if self.options.get("backend", "numba") != "numba":
            return
        from .gradient import loss_and_grad

        keys = ("loss", "solver", "sensealg", "rtol", "atol", "max_steps", "threads")
        kw = {k: self.options[k] for k in keys if k in self.options}
        with contextlib.suppress(Exception):  # a bad start point is the fit's to report
            loss_and_grad(self.prob, self.data, params=x0, **kw)

    def portable(self):
        """The task with solver objects copied without their per-process caches (compiled
        entry points, threads), which neither pickle nor mean anything elsewhere."""
        out = dict(self.options)
        s = out.get("solver")
        if isinstance(s, Solver):
            s = copy.copy(s)
            for key in [k for k in s.__dict__ if k.startswith("_")]:
                s.__dict__.pop(key)
            out["solver"] = s
        return FitTask(self.prob, self.data, out)


def failed_start(k, x0, error, seconds):
    """The `StartFit` of a start whose fit raised ``error``."""
    return StartFit(k, x0, x0.copy(), math.inf, 0.0, math.inf, np.zeros(0), 0, 0, "error",
                    "failed", f"{type(error).__name__}: {error}", seconds)


# ----------------------------------------------------------------------------- entry


def fit_multistart(prob_or_list, data_or_list, starts=64, seed=0, client=None, results=None,
                   progress=True, params=None, spread=0.5, bounds=None, workers=None,
                   **fit_options):
    """Fit from many start points in parallel (threads or Dask); every fit, sorted by loss.

    Parameters
    ----------
    prob_or_list, data_or_list
        As in `sciml.fit`: one problem and its `sciml.Data`, or lists (one
        shared parameter vector).
    starts : int or array_like (n_starts, n_params)
        How many start points to draw (see `draw_starts`: from `seed`,
        around `params` with `spread`, or uniform in `bounds`), or the start
        points themselves, used as they are.
    seed : int
        Seeds the draw; start k depends on the seed and k alone.
    client : None, "local" or dask.distributed.Client
        Where the fits run: ``None``, threads in this process; ``"local"``,
        an embedded ``LocalCluster`` of `workers` processes (default: one per
        core), one thread each, closed at the end; a ``Client``: its cluster.
    results : str or path-like, optional
        A folder that keeps every completed start (``start_NNNNN.npz``, one
        per start, written atomically as each finishes). A rerun with the
        same folder and the same starts skips the completed ones and returns
        all; a start point that differs from the one stored is an error.
    progress : bool
        One progress bar (tqdm) over all starts, with the best loss so far.
    params : array_like (n_params,), optional
        The centre of the drawn starts (default: the first problem's
        ``params``); ignored with `bounds` or an array of `starts`.
    spread : float
        Log-normal spread of the mechanistic parameters around `params`.
    bounds : (lower, upper), optional
        Draw uniformly in this box instead (numbers or arrays of n_params).
    workers : int, optional
        Threads (``client=None``) or worker processes (``"local"``); default:
        the cores this process may use.
    **fit_options
        Passed to every `sciml.fit` (``optimizers``, ``loss``, ``solver``,
        ``sensealg``, ``rtol``, ``atol``, ``l2``, ``penalty``, ``patience``,
        ``threads``, ...); ``threads`` (numba threads inside one fit of a
        list of problems) defaults to 1 there. With a cluster they must pickle
        (Dask uses cloudpickle: closures and lambdas do).

    Returns
    -------
    MultistartResult
        The `StartFit` of every start, sorted by final objective (failed
        starts last), with ``best``, ``losses``, ``params`` and ``waterfall()``.

    Examples
    --------
    >>> res = sciml.fit_multistart(prob, data, starts=64, seed=0,
    ...                            optimizers=[nets.Adam(0.05, iters=100), sciml.LBFGS(iters=200)])
    >>> res.best.params, res.n_best()
    >>> res = sciml.fit_multistart(prob, data, starts=64, client="local", results="ms_lv")
    >>> res.waterfall(path="waterfall.png")
    """
    t_start = time.perf_counter()
    probs, datas, many = _check_problems(prob_or_list, data_or_list)
    n_params = probs[0].model.n_params
    unknown = sorted(set(fit_options) - _FIT_OPTIONS)
    if unknown:
        refused = {"params": "give `params=` (the centre of the draws) or `starts=` (an array)",
                   "objective": "fit_multistart fits problems; run sciml.fit per start for a "
                                "custom objective"}
        k = unknown[0]
        raise TypeError(f"fit_multistart: unknown option `{k}`"
                        + (f" ({refused[k]})" if k in refused else
                           f"; it takes sciml.fit's options: {', '.join(sorted(_FIT_OPTIONS))}"))
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"fit_multistart: `progress` must be True or False, got {progress!r}")
    integer(workers, "workers", "fit_multistart", optional=True)
    if isinstance(starts, (numbers.Integral, bool)) and not isinstance(starts, np.ndarray):
        X = draw_starts(probs, starts, seed, params, spread, bounds)
    else:
        _seed(seed)
        X = _start_array(starts, n_params)
    options = dict(fit_options)
    if many:  # numba threads inside one fit of several problems: one, the starts fill the cores
        options.setdefault("threads", 1)
    task = FitTask(probs if many else probs[0], datas if many else datas[0], options)
    return run_starts(task, X, client, results, progress, workers, t_start)


def run_starts(task, X, client=None, results=None, progress=True, workers=None,
               t_start=None):
    """Run ``task(k, X[k])`` for every start k not already in ``results``: the mechanism
    of `fit_multistart` (threads, a LocalCluster or a Dask client; the resumable
    folder; one progress bar), for any task with ``warm`` and ``portable`` (`FitTask`).
    Returns the `MultistartResult`."""
    t_start = time.perf_counter() if t_start is None else t_start
    client_kind = _client_kind(client)
    store = _Store(results) if results is not None else None
    done = store.load(X) if store is not None else {}
    n_resumed = len(done)
    todo = [k for k in range(X.shape[0]) if k not in done]
    if todo:
        task.warm(X[todo[0]])
    bar = _bar(progress, X.shape[0], done)
    lock = threading.Lock()

    def finished(rec, save=True):
        with lock:
            if rec.index in done:  # a rerun of a start (a worker died after it finished)
                return
            done[rec.index] = rec
            if store is not None and save:
                store.save(rec)
            if bar is not None:
                best = min(r.objective for r in done.values())
                bar.update(1)
                bar.set_postfix(best=f"{best:.4g}", refresh=False)

    try:
        if todo:
            n = workers or usable_cores()
            if client_kind == "threads":
                _run_threads(task, X, todo, n, finished)
            else:
                _run_dask(client if client_kind == "client" else None, task.portable(), X,
                          todo, n, finished)
    finally:
        if bar is not None:
            bar.close()
    return MultistartResult(list(done.values()), time.perf_counter() - t_start, n_resumed)


def _bar(progress, total, done):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=len(done), desc="multistart", unit="start",
                dynamic_ncols=True)


def _client_kind(client):
    if client is None:
        return "threads"
    if isinstance(client, str):
        if client != "local":
            raise ValueError(f"fit_multistart: `client` must be None (threads), \"local\" (an "
                             f"embedded Dask LocalCluster) or a dask.distributed.Client, got "
                             f"{client!r}")
        _distributed()
        return "local"
    dist = sys.modules.get("distributed")
    if dist is None or not isinstance(client, dist.Client):
        raise TypeError(f"fit_multistart: `client` must be None (threads), \"local\" (an "
                        f"embedded Dask LocalCluster) or a dask.distributed.Client, got "
                        f"{type(client).__name__}")
    return "client"


def _distributed():
    try:
        import distributed
    except ImportError as e:
        raise ImportError(f"fit_multistart: client=\"local\" (and any Dask client) needs Dask "
                          f"distributed: {_INSTALL} (or pip install \"sciml-nets[dask]\"); "
                          f"importing it failed: {e}") from e
    return distributed


def _run_threads(task, X, todo, n, finished):
    with ThreadPoolExecutor(max_workers=min(n, len(todo)),
                            thread_name_prefix="sciml-multistart") as pool:
        pending = {pool.submit(task, k, X[k].copy()) for k in todo}
        try:
            while pending:
                ready, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in ready:
                    finished(f.result())
        except BaseException:
            for f in pending:
                f.cancel()
            raise


#: Environment of the workers `client="local"` starts (set before they import numpy / numba;
#: Dask's own pre-spawn environment already sets OMP/MKL/OPENBLAS_NUM_THREADS=1).
WORKER_ENV = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}


def _call(task, k, x0):
    return task(k, x0)


def _run_dask(client, task, X, todo, n, finished):
    distributed = _distributed()
    cluster = None
    try:
        if client is None:
            cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                               processes=True, dashboard_address=None,
                                               env=dict(WORKER_ENV),
                                               silence_logs=logging.ERROR)
            client = distributed.Client(cluster, set_as_default=False)
        token = uuid.uuid4().hex[:12]
        shared = client.scatter(task, broadcast=True, hash=False)
        futures = [client.submit(_call, shared, k, X[k].copy(),
                                 key=f"sciml-multistart-{token}-{k}", pure=False)
                   for k in todo]
        index = {fut.key: k for fut, k in zip(futures, todo)}
        try:
            for fut in distributed.as_completed(futures, loop=client.loop):
                try:
                    rec = fut.result()
                except distributed.KilledWorker as e:
                    # The start took down every worker it ran on (Dask's allowed-failures):
                    # a failed start, not the run's end; not stored, so a rerun retries it.
                    k = index[fut.key]
                    finished(failed_start(k, X[k].copy(), e, math.nan), save=False)
                    continue
                finished(rec)
        except BaseException:
            client.cancel(futures)
            raise
    finally:
        if cluster is not None:
            client.close()
            cluster.close()
