"""Training: `loss_and_grad` and `train`, both on the threaded compiled kernels.

A gradient over a batch is split into contiguous blocks of rows, one per
thread, each with its own workspace and gradient buffer, summed in thread
order (see `kernels.loss_grad`): for a given thread count the result does not
depend on scheduling. Batches smaller than two chunks run on one thread, as a
parallel launch costs more than it saves there.
"""

import os

import numba
import numpy as np

from . import layerwise
from ._checks import as_float_array, check_finite, check_params
from ._config import Threads
from .chain import Chain
from .losses import SquaredLoss, check_loss
from .optim import LBFGS, Adam, Optimizer
from .tiles import zeros

_NO_ROWS = np.zeros(0, dtype=np.int64)


def default_threads():
    return numba.config.NUMBA_NUM_THREADS


class _Buffers:
    """Per-thread workspaces and gradient buffers for one (chain, dtype, batch, threads)."""

    def __init__(self, chain, dtype, nt):
        size = int(chain._kernels["chunk_size"](chain._meta(dtype)))
        self.BUF = zeros((nt, size), dtype)  # the tiles' rows: chunk rows of B samples
        # One extra column (n_params) carries each thread's loss. Rows padded apart so
        # two threads never write one cache line; the kernels get the whole padded array
        # (a view of its first columns would be C-contiguous or not with the chain's size,
        # and each layout compiles the kernels again).
        width = (chain.n_params + 1 + 15) // 16 * 16
        self.G = np.zeros((nt, width), dtype=dtype)
        self.g = np.zeros(chain.n_params, dtype=dtype)
        self.nt = nt


def _prepare(chain, p, X, Y, loss, state):
    """Checked (loss, samples, targets, state) in the layout of the engine that runs
    `chain`; the checks and their messages are the same for every chain."""
    if not isinstance(chain, Chain):
        raise TypeError(f"`chain` must be a nets.Chain, got {type(chain).__name__}")
    check_params(p, chain.n_params)
    loss = check_loss(loss)
    X = as_float_array("X", X, dtype=p.dtype)
    if X.shape[1:] != chain.in_shape or X.shape[0] < 1:
        raise ValueError(f"`X` must have shape (N, {', '.join(map(str, chain.in_shape))}) "
                         f"with N >= 1 (the chain's input shape {chain.in_shape}, batch "
                         f"first), got {X.shape}")
    check_finite("X", X)
    X = np.ascontiguousarray(X)
    T = loss.targets(Y, X.shape[0], chain.n_out, p.dtype)
    if not np.all(np.isfinite(p)):
        raise ValueError("`p` contains NaN or Inf")
    state = chain._state(state, p.dtype)
    if not chain.fused:
        # The per-layer path reads samples batch-first: rows of (N, n_in).
        return loss, X.reshape(X.shape[0], -1), np.ascontiguousarray(T), state
    # The kernels read samples feature-major: transpose once, not per step. Their rows
    # kernel takes writeable arrays only (a transpose of one feature may be a read-only
    # view of the caller's array).
    return loss, _writeable(np.ascontiguousarray(X.T)), _writeable(np.ascontiguousarray(T.T)), \
        state


def _writeable(a):
    return a if a.flags.writeable else a.copy()


def _scale(loss, n, n_out):
    if not loss.mean:
        return 1.0
    return 1.0 / (n * (n_out if loss.code != 2 else 1))


def loss_and_grad(chain, p, X, Y, loss=SquaredLoss(), threads=None, *, state=None,
                  training=True, seed=0):
    """Loss of `chain` on (X, Y) and its gradient with respect to `p`.

    Parameters
    ----------
    chain : Chain
    p : ndarray, (n_params,)
    X : array, (N, *chain.in_shape) ((N, n_in) for a chain on vectors)
    Y : array, (N, n_out) (integer labels (N,) for `LogitCrossEntropyLoss`)
    loss : Loss
    threads : int, optional
        Threads to split the batch over (default: all numba threads).
    state, training, seed
        Chains with running statistics or Dropout (see `Chain`): the state vector
        (default: the chain's own; updated in training mode), the mode (default
        training) and the seed of random masks. Other chains have no state (a given
        one must be empty) and no random masks.

    Returns
    -------
    value : float
    grad : ndarray, (n_params,), dtype of `p`
    """
    loss, XT, TT, st = _prepare(chain, p, X, Y, loss, state)
    if not chain.fused:
        with Threads(threads):
            return layerwise.loss_and_grad(chain, p, XT, TT, loss, st, seed, training)
    k = chain._kernels
    meta = chain._meta(p.dtype)
    p = _writeable(p)
    n = XT.shape[1]
    with Threads(threads) as nt:
        buf = _Buffers(chain, p.dtype, nt)
        val = k["loss_grad"](k["rows_kernel"](p.dtype), meta, p, XT, TT, _NO_ROWS, False, 0,
                             n, loss.code, _scale(loss, n, chain.n_out), buf.g, buf.G, buf.BUF,
                             nt, True)
    val += k["penalty"](meta, p, buf.g, loss.l1, loss.l2)
    return float(val), buf.g


def train(chain, p, X, Y, loss=SquaredLoss(), optimizer=None, iters=None, epochs=None,
          batch_size=None, seed=0, threads=None, progress=False, callback=None, *,
          state=None):
    """Fit `p` (updated in place) to (X, Y).

    Either ``iters=`` full-batch steps, or ``epochs=`` passes of shuffled
    minibatches of ``batch_size`` (the last one of an epoch may be smaller).

    Parameters
    ----------
    optimizer : Optimizer or LBFGS, default Adam(1e-3)
        Its state carries over between calls (call ``optimizer.init(p)`` to reset).
        With `LBFGS`, `iters` defaults to ``optimizer.iters`` and the history
        is the loss after each L-BFGS iteration.
    seed : int
        Seed of the minibatch shuffle (and of the layers' random masks).
    state : ndarray, optional
        Chains with running statistics: the state vector updated while training
        (default: the chain's own, ``chain.default_state(p.dtype)``).
    progress : bool
        Show a progress bar with the loss.
    callback : callable, optional
        ``callback(step, p, loss)`` after each block of steps (each epoch, or
        each 1% of `iters` when `progress` or `callback` is set); return True
        to stop early.

    Returns
    -------
    ndarray
        Loss per iteration (``iters=``) or per epoch (``epochs=``: summed over
        the epoch's minibatches, averaged for mean losses); evaluated before
        each update. Shorter if stopped early (callback or Ctrl-C, which keeps
        the parameters reached so far).
    """
    optimizer = Adam(1e-3) if optimizer is None else optimizer
    lbfgs = isinstance(optimizer, LBFGS)
    if lbfgs and epochs is not None:
        raise ValueError("train: LBFGS is full batch; use `iters` (or LBFGS(iters=)), "
                         "not `epochs`")
    if (iters is None) == (epochs is None) and not (lbfgs and iters is None):
        raise ValueError("train: give exactly one of `iters` (full batch) or `epochs` "
                         "(minibatches, with `batch_size`)")
    for name, v in (("iters", iters), ("epochs", epochs)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 1):
            raise ValueError(f"train: `{name}` must be a positive int, got {v!r}")
    loss, XT, TT, st = _prepare(chain, p, X, Y, loss, state)
    n = XT.shape[0] if not chain.fused else XT.shape[1]
    if epochs is not None:
        if batch_size is None:
            raise ValueError("train: `epochs` needs `batch_size`")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or not 1 <= batch_size <= n:
            raise ValueError(f"train: `batch_size` must be an int in 1..{n}, got {batch_size!r}")
    elif batch_size is not None:
        raise ValueError("train: `batch_size` goes with `epochs`; `iters` is full batch")

    if lbfgs:
        return optimizer.minimize(lambda q: loss_and_grad(chain, q, X, Y, loss, threads), p,
                                  callback=callback, iters=iters)
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"train: `optimizer` must be nets.Adam, AdamW, SGD or LBFGS, "
                        f"got {optimizer!r}")
    optimizer._ready(p)
    if not chain.fused:
        return _train_layerwise(chain, p, XT, TT, loss, optimizer, iters, epochs, batch_size,
                                seed, threads, progress, callback, st)

    k = chain._kernels
    meta = chain._meta(p.dtype)
    rows_fn = k["rows_kernel"](p.dtype)
    hyper = optimizer.hyper()
    bar = _bar(progress, epochs if epochs is not None else iters)

    def run(rows, bs, nsteps, hist, buf):
        optimizer.step = k["train_steps"](
            rows_fn, meta, p, (XT, TT, rows, rows.shape[0] > 0), bs, nsteps,
            (loss.code, loss.mean, loss.l1, loss.l2),
            (optimizer.code, hyper, optimizer.m, optimizer.v), optimizer.step,
            hist, buf.g, buf.G, buf.BUF, buf.nt)

    out = []
    try:
        with Threads(threads) as nt:
            if iters is not None:
                rows = _NO_ROWS
                buf = _Buffers(chain, p.dtype, nt)
                block = iters if not (progress or callback) else max(1, iters // 100)
                done = 0
                while done < iters:
                    m = min(block, iters - done)
                    hist = np.empty(m)
                    run(rows, n, m, hist, buf)
                    out.append(hist)
                    done += m
                    if _tick(bar, m, hist[-1], callback, done, p):
                        break
            else:
                rng = np.random.default_rng(seed)
                buf = _Buffers(chain, p.dtype, nt)
                nsteps = -(-n // batch_size)
                sizes = np.minimum(batch_size, n - batch_size * np.arange(nsteps))
                for e in range(epochs):
                    hist = np.empty(nsteps)
                    run(rng.permutation(n).astype(np.int64), batch_size, nsteps, hist, buf)
                    val = hist @ sizes / n if loss.mean else hist.sum()
                    out.append(np.array([val]))
                    if _tick(bar, 1, val, callback, e + 1, p):
                        break
    except KeyboardInterrupt:
        pass  # keep what was reached; `p` is already updated in place
    finally:
        if bar is not None:
            bar.close()
    return np.concatenate(out) if out else np.empty(0)


def _train_layerwise(chain, p, X2, T, loss, optimizer, iters, epochs, batch_size, seed,
                     threads, progress, callback, st):
    bar = _bar(progress, epochs if epochs is not None else iters)
    out = []
    try:
        with Threads(threads):
            if epochs is not None:
                out = layerwise.train_epochs(chain, p, X2, T, loss, optimizer, epochs,
                                             batch_size, seed, st, bar, callback, _tick, out)
            else:
                block = iters if not (progress or callback) else max(1, iters // 100)
                out = layerwise.train_iters(chain, p, X2, T, loss, optimizer, iters, seed, st,
                                            bar, callback, _tick, block, out)
    except KeyboardInterrupt:
        pass
    finally:
        if bar is not None:
            bar.close()
    return np.concatenate(out) if out else np.empty(0)


def _bar(progress, total):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=os.environ.get("NETS_NO_PROGRESS") == "1")


def _tick(bar, n, val, callback, step, p):
    if bar is not None:
        bar.update(n)
        bar.set_postfix(loss=f"{val:.4g}")
    return callback is not None and callback(step, p, val) is True
