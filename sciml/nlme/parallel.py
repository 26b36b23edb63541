"""Subjects in parallel: worker processes on this machine (`NLME(workers=n)`) or blocks of
subjects on a Dask cluster (`NLME(client=...)`).

A subject's objective and gradient are Python around compiled solves: threads in one
process share the GIL, and on two cores they were no faster. Processes are:

- **Worker processes** (`Workers`) are forked once per fit, after the subjects are
  prepared: each inherits the model, its compiled kernels and its block of prepared
  subjects (nothing is pickled or compiled again) and keeps them until the fit ends.
  Per evaluation the parent sends the population parameters and the block's starting
  estimates; each worker returns its subjects' results (objective, gradient parts,
  `gradient.EtaStart`), which the parent sums in the subjects' order, so the result is
  the serial one bit for bit.
- **Dask** (`DaskBlocks`): the model and each block's subjects are scattered once
  (the `NLME` pickles by its traced expressions); a worker prepares its block on first
  use and keeps it for the fit. Each evaluation is one task per block, returning the
  block's results as above.

Blocks are contiguous runs of subjects of about equal work (observations times pieces).
"""

import multiprocessing
import os
import sys
import threading
import time
import traceback
import uuid

import numpy as np

from .gradient import subject_gradient, subject_objective

__all__ = ["Workers", "DaskBlocks", "blocks_of", "auto_workers"]

# Below this many subjects a worker, the default stays on threads: forking the workers
# costs tens of milliseconds once per fit and each evaluation a round trip per worker, and
# a small study gains little (theo_sd's 12 subjects, 2-core EPYC: 0.50-0.54 s on two
# workers against 0.56-0.59 s on two threads when quiet, slower than one thread under
# load); 500 subjects: 13.3 s against 18.0 s, warfarin's 32: 9.1 s against 10.9 s.
SUBJECTS_PER_WORKER = 16


def can_fork():
    """Whether forking worker processes is safe here and now: fork is the platform's
    default start method (Linux before Python 3.14), no other Python thread runs, JAX is
    not loaded (its runtime threads would not survive a fork), and numba's parallel
    layer, if started, is not OpenMP (GNU OpenMP aborts a forked child that uses it)."""
    try:
        if multiprocessing.get_context().get_start_method() != "fork":
            return False
    except ValueError:
        return False
    if threading.active_count() > 1 or "jax" in sys.modules:
        return False
    from numba.np.ufunc import parallel

    return not parallel._is_initialized or parallel._threading_layer != "omp"


def auto_workers(n_subjects, cores):
    """The worker processes a call forks when `NLME` was given neither ``workers`` nor
    ``client``: ``cores`` (its ``threads``) of them, fewer so that each holds at least
    `SUBJECTS_PER_WORKER` subjects, where `can_fork`; None (the subjects on threads) where
    that leaves fewer than two or forking is not safe."""
    n = min(cores, n_subjects // SUBJECTS_PER_WORKER)
    return n if n >= 2 and can_fork() else None


def blocks_of(fits, n):
    """Contiguous index ranges splitting ``fits`` into at most ``n`` blocks of about equal
    work."""
    work = np.array([sf.y.shape[0] * len(sf.pieces) + 5 for sf in fits], dtype=float)
    edges = np.searchsorted(np.cumsum(work), np.sum(work) * np.arange(1, n) / n)
    edges = np.unique(np.concatenate([[0], edges + 1, [len(fits)]]).clip(0, len(fits)))
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _run_block(pop, fits, kind, x, method, starts, ebe_tol):
    subject = pop._subject(x, method, ebe_tol)
    one = subject_objective if kind == "objective" else subject_gradient
    return [one(subject(sf), st) for sf, st in zip(fits, starts)]


# ---------------------------------------------------------------- worker processes


def _serve(pop, fits, conn):
    """A worker's loop: evaluate its block for each request until told to stop."""
    pop._runner = None
    pop.threads = 1
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        t0 = time.process_time()
        try:
            out = ("ok", _run_block(pop, fits, *msg), time.process_time() - t0)
        except BaseException as e:  # the parent re-raises it
            out = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", 0.0)
        conn.send(out)
    conn.close()


class Workers:
    """Forked worker processes, each holding a block of prepared subjects (module
    docstring); a context manager that stops them."""

    def __init__(self, pop, fits, n):
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("NLME(workers=): worker processes are forked with the prepared "
                               f"subjects, which {sys.platform} does not offer; use "
                               "client='local' (Dask) instead")
        ctx = multiprocessing.get_context("fork")
        self.fits = fits
        self.blocks = blocks_of(fits, n)
        self.procs, self.conns = [], []
        self.cpu = np.zeros(len(self.blocks))  # each worker's CPU seconds in evaluations
        sys.stdout.flush(), sys.stderr.flush()
        for b in self.blocks:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(pop, [fits[i] for i in b], theirs),
                            daemon=True, name="sciml-nlme-worker")
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)

    def holds(self, fits):
        return fits is self.fits

    def run(self, kind, x, method, starts, ebe_tol):
        for conn, b in zip(self.conns, self.blocks):
            conn.send((kind, x, method, [starts[i] for i in b], ebe_tol))
        out = []
        for k, (conn, p) in enumerate(zip(self.conns, self.procs)):
            try:
                status, res, cpu = conn.recv()
            except EOFError:
                raise RuntimeError(f"NLME(workers=): worker process {p.pid} died "
                                   f"(exit code {p.exitcode})") from None
            if status != "ok":
                raise RuntimeError(f"NLME(workers=): a worker process failed: {res}")
            self.cpu[k] += cpu
            out.extend(res)
        return out

    def close(self):
        for conn in self.conns:
            try:
                conn.send(None)
                conn.close()
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- Dask

_PREPARED = {}  # on a Dask worker: (token, block) -> (pop, prepared subjects)


class _Shipped:
    """What a Dask block needs, pickled as one object (a scattered tuple would be split)."""

    def __init__(self, pop, subjects, solve):
        self.pop, self.subjects, self.solve = pop, subjects, solve


def _dask_block(shared, token, k, kind, x, method, starts, ebe_tol):
    key = (token, k)
    if key not in _PREPARED:
        pop, subjects, solve = shared.pop, shared.subjects, shared.solve
        pop._runner = None
        pop.threads = 1
        pop.initial = None  # in the subjects' problems already
        with _quiet():
            _PREPARED[key] = (pop, pop.prepare(subjects, **solve))
    pop, fits = _PREPARED[key]
    return _run_block(pop, fits, kind, x, method, starts, ebe_tol)


def _forget(token):
    for key in [k for k in _PREPARED if k[0] == token]:
        del _PREPARED[key]


class _quiet:
    """Warnings of `prepare` were given in the client already."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


class DaskBlocks:
    """Blocks of subjects on a Dask cluster (module docstring): ``client`` a
    ``dask.distributed.Client`` or ``"local"`` (an embedded ``LocalCluster`` of ``n``
    processes, one thread each, closed at the end)."""

    def __init__(self, pop, fits, solve, client, n):
        from sciml.multistart import WORKER_ENV, _distributed

        distributed = _distributed()
        self.cluster = None
        if isinstance(client, str):
            import logging

            self.cluster = distributed.LocalCluster(
                n_workers=n or (os.cpu_count() or 1), threads_per_worker=1, processes=True,
                dashboard_address=None, env=dict(WORKER_ENV), silence_logs=logging.ERROR)
            client = distributed.Client(self.cluster, set_as_default=False)
        self.client = client
        if n is None:
            n = max(1, len(client.scheduler_info().get("workers", {})))
        self.fits = fits
        self.blocks = blocks_of(fits, n)
        self.token = uuid.uuid4().hex[:12]
        # the subjects as prepared (initial states already in their problems); one object
        # per block, so that its subjects' model is the population's after unpickling
        self.shared = [client.scatter(_Shipped(pop, [fits[i].subject for i in b], solve),
                                      hash=False) for b in self.blocks]

    def holds(self, fits):
        return fits is self.fits

    def run(self, kind, x, method, starts, ebe_tol):
        futures = [self.client.submit(_dask_block, sh, self.token, k, kind, x, method,
                                      [starts[i] for i in b], ebe_tol, pure=False)
                   for k, (sh, b) in enumerate(zip(self.shared, self.blocks))]
        out = []
        for res in self.client.gather(futures):
            out.extend(res)
        return out

    def close(self):
        try:
            self.client.run(_forget, self.token)
        except Exception:  # a cluster already gone has nothing to forget
            pass
        if self.cluster is not None:
            self.client.close()
            self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
