"""The per-layer path of `Chain`: every chain the fused Dense kernels do not run (layers
other than Dense on vectors, or activations with constants).

Each layer is one compiled call (the protocol of `nets.layers.Layer`) on batch-first
arrays; between the calls the chain applies activations and seeds the loss's
cotangent, each one compiled call too.

Threads: a batch is cut into contiguous blocks, one per thread. Each thread runs the
whole chain on its block through its own `Lane` (every buffer it needs, sized once),
with its own gradient vector; the kernels release the GIL, so the lanes run in
parallel on ordinary Python threads, and the gradients are added in lane order (for a
given thread count the result does not depend on scheduling). A chain with a layer
that couples the samples (`Layer.couples_batch`) runs as one block instead. In
minibatch training, a chain whose layers all have a compiled form runs each lane's
step as one compiled call instead (`nets.lanestep`), on the same buffers.

A lane holds, for up to `rows` samples:

* per layer its output ``(rows, *out_shape)``, followed by room for the activation's
  derivative when the layer has a (non-identity) activation;
* two cotangent buffers (the widest layer boundary each), used in turn;
* per layer its scratch (`Layer.scratch_size`), kept for the lane's life;
* a gradient vector, and for training a minibatch of inputs and targets.
"""

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from . import registry
from .activations import run_row
from .lanestep import LOGITCE, Lanes, Program, add_lanes, gather, loss_seed, multiply, penalty
from .layers import Context
from .rng import layer_key
from .tiles import zeros

# ------------------------------------------------------------------------ workspace


class Lane:
    """One thread's buffers for up to `rows` samples (see the module text)."""

    def __init__(self, chain, rows, dtype, g, targets):
        self.rows = rows
        plan = chain._plan
        self.out = [zeros(rows * L.out_size * (2 if L.act >= 0 else 1), dtype) for L in plan]
        # Per layer with an activation, its row kernel for `dtype` and its constants
        # (`nets.registry.row`), else None.
        self.acts = [registry.row(L.layer.activation, dtype) if L.act >= 0 else None
                     for L in plan]
        widest = max([plan[0].in_size] + [L.out_size for L in plan])
        self.cot = (zeros(rows * widest, dtype), zeros(rows * widest, dtype))
        self.scratch = [zeros(max(1, int(L.layer.scratch_size(L.in_shape, rows))), dtype)
                        for L in plan]
        self.g = g
        self.x0 = zeros((rows, plan[0].in_size), dtype)
        self.t0 = np.zeros((rows, max(1, targets)), dtype)
        self._program = False

    def program(self, chain):
        """This lane's `nets.lanestep.Program` (made on first use), None if the chain's
        layers have no compiled form."""
        if self._program is False:
            self._program = Program.of(chain, self)
        return self._program

    def output(self, L, l, n):
        return self.out[l][:n * L.out_size].reshape((n, *L.out_shape))


class LayerWorkspace:
    """Buffers of the per-layer path for batches of up to `batch` samples of one dtype,
    on up to `threads` threads (default: numba's thread count): `threads` lanes of
    ceil(batch / threads) rows, or one lane of `batch` rows for a chain whose layers
    couple the samples. Made by `Chain.workspace`."""

    def __init__(self, chain, batch, dtype, targets=0, threads=None, coupled=None):
        self.chain = chain
        self.dtype = np.dtype(dtype)
        self.batch = int(batch)
        nt = numba.config.NUMBA_NUM_THREADS if threads is None else int(threads)
        if coupled is None:
            coupled = any(L.layer.couples_batch(True) for L in chain._plan)
        self.coupled = coupled
        self.threads = 1 if coupled else max(1, min(nt, self.batch))
        rows = -(-self.batch // self.threads)
        # Gradient rows padded apart so that two threads never write one cache line.
        width = (chain.n_params + 15) // 16 * 16
        self.G = np.zeros((self.threads, max(width, 16)), self.dtype)
        self.lanes = [Lane(chain, rows, self.dtype, self.G[t, :chain.n_params], targets)
                      for t in range(self.threads)]
        self.rows = rows
        self.calls = 0

    def blocks(self, n, nt):
        """Contiguous (lo, hi) blocks of n <= rows * lanes samples for up to nt threads."""
        k = max(1, min(nt, self.threads, n))
        per = max(-(-n // k), -(-n // self.threads))
        if per > self.rows:
            raise ValueError(f"{n} samples do not fit this workspace ({self.threads} lanes "
                             f"of {self.rows}); make it with a larger batch")
        return [(lo, min(n, lo + per)) for lo in range(0, n, per)]


_POOL = None
_POOL_LOCK = threading.Lock()


def run_blocks(fn, nblk):
    """[fn(0), ..., fn(nblk - 1)], block 0 on the calling thread, the others on a pool."""
    if nblk == 1:
        return [fn(0)]
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < nblk - 1:
            _POOL = ThreadPoolExecutor(max_workers=max(nblk - 1, (os.cpu_count() or 2) - 1),
                                       thread_name_prefix="nets-lane")
    futures = [_POOL.submit(fn, t) for t in range(1, nblk)]
    first = fn(0)
    return [first] + [f.result() for f in futures]


def forward(chain, lane, x, p, state, training, seed, need_d, call, nt=1, row=0):
    """Run the layers on x (n, *in_shape), n <= lane.rows; returns the last output view.

    Keeps every layer's output (and activation derivative if `need_d`) in the lane for
    `backward`. `call` numbers the pass for the layers' random keys; `nt`: threads a
    batch-coupling layer may use; `row`: the position of x[0] in the whole batch."""
    n = x.shape[0]
    h = x
    for l, L in enumerate(chain._plan):
        y = lane.output(L, l, n)
        ctx = Context(training, layer_key(seed, call, l), nt, l, row)
        L.layer.forward(ctx, h, y, p[L.poff:L.poff + L.n_params],
                        state[L.soff:L.soff + L.n_state], lane.scratch[l])
        if L.act >= 0:
            addr, c0, c1 = lane.acts[l]
            run_row(addr, lane.out[l], 0, lane.rows * L.out_size, n * L.out_size, c0, c1,
                    need_d)
        h = y
    return h


def backward(chain, lane, x, p, state, pbar, training, seed, call, want_x, nt=1, row=0):
    """Pull the cotangent in lane.cot[0] (shaped like the output) back through the
    layers, after `forward` (same x, p, seed, call; need_d). ADDS into pbar; returns the
    view of dL/dx in the lane (n, *in_shape) if `want_x`, else None."""
    n = x.shape[0]
    a, b = lane.cot
    for l in range(len(chain._plan) - 1, -1, -1):
        L = chain._plan[l]
        ybar = a[:n * L.out_size].reshape((n, *L.out_shape))
        if L.act >= 0:
            multiply(a, lane.out[l][lane.rows * L.out_size:], n * L.out_size)
        h = x if l == 0 else lane.output(chain._plan[l - 1], l - 1, n)
        xbar = b[:n * L.in_size].reshape((n, *L.in_shape)) if (l > 0 or want_x) else None
        ctx = Context(training, layer_key(seed, call, l), nt, l, row)
        L.layer.pullback(ctx, ybar, h, lane.output(L, l, n), p[L.poff:L.poff + L.n_params],
                         state[L.soff:L.soff + L.n_state], pbar[L.poff:L.poff + L.n_params],
                         xbar, lane.scratch[l])
        a, b = b, a
    return a[:n * chain._plan[0].in_size].reshape((n, *chain.in_shape)) if want_x else None


def threads_now(ws):
    return min(numba.get_num_threads(), ws.threads) if not ws.coupled else \
        numba.get_num_threads()


def forward_batch(chain, ws, X, p, state, training, seed, need_d, Y=None):
    """Forward over all rows of X (chunks of the workspace's capacity, blocks per lane);
    copies into Y if given. Returns the blocks of the last chunk."""
    nt = threads_now(ws)
    cap = ws.rows * (min(nt, ws.threads))
    for lo in range(0, X.shape[0], cap):
        hi = min(X.shape[0], lo + cap)
        ws.calls += 1
        call = ws.calls
        blocks = ws.blocks(hi - lo, nt)

        def run(t, lo=lo, blocks=blocks, call=call):
            a, b = blocks[t]
            out = forward(chain, ws.lanes[t], X[lo + a:lo + b], p, state, training, seed,
                          need_d, call, nt, lo + a)
            if Y is not None:
                Y[lo + a:lo + b] = out
            return out

        run_blocks(run, len(blocks))


def vjp_batch(chain, ws, X, V, Xbar, p, pbar, state, training, seed):
    """Xbar = V^T dY/dX (written), pbar += V^T dY/dp over all rows of X (in chunks)."""
    nt = threads_now(ws)
    cap = ws.rows * (min(nt, ws.threads))
    top = chain._plan[-1].out_size
    for lo in range(0, X.shape[0], cap):
        hi = min(X.shape[0], lo + cap)
        ws.calls += 1
        call = ws.calls
        blocks = ws.blocks(hi - lo, nt)

        def run(t, lo=lo, blocks=blocks, call=call):
            lane = ws.lanes[t]
            a, b = blocks[t]
            x = X[lo + a:lo + b]
            forward(chain, lane, x, p, state, training, seed, True, call, nt, lo + a)
            lane.cot[0][:(b - a) * top] = V[lo + a:lo + b].reshape(-1)
            lane.g[:] = 0.0
            Xbar[lo + a:lo + b] = backward(chain, lane, x, p, state, lane.g, training, seed,
                                           call, True, nt, lo + a)

        run_blocks(run, len(blocks))
        for t in range(len(blocks)):
            pbar += ws.lanes[t].g


# ------------------------------------------------------------------------- training


def weight_ranges(chain):
    """(offset, length) of every layer's "weight" array in the flat vector (the arrays
    that penalties act on, as for Dense: not biases, not norms' scales)."""
    rows = []
    for L in chain._plan:
        off = L.poff
        for name, shape in L.layer.param_shapes(L.in_shape):
            size = math.prod(shape)
            if name == "weight":
                rows.append((off, size))
            off += size
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def _scale(loss, n, n_out):
    if not loss.mean:
        return 1.0
    return 1.0 / (n * (n_out if loss.code != LOGITCE else 1))


def _step(chain, ws, X2, T, rows, lo, hi, loss, scale, p, state, training, seed, g, nt):
    """Loss and gradient (written into g) of samples lo:hi (rows[...] if rows is not None,
    else consecutive) on the lanes; returns the loss (scaled)."""
    ws.calls += 1
    call = ws.calls
    blocks = ws.blocks(hi - lo, nt)
    top = chain._plan[-1]

    def run(t):
        lane = ws.lanes[t]
        a, b = blocks[t]
        nb = b - a
        program = lane.program(chain) if rows is not None else None
        if program is not None:
            return program.step(X2, T, rows, lo + a, lo + b, p, loss.code, scale)
        if rows is not None:
            x = lane.x0[:nb]
            gather(X2, rows, lo + a, lo + b, x)
            tt = lane.t0[:nb]
            gather(T, rows, lo + a, lo + b, tt)
        else:
            x = X2[lo + a:lo + b]
            tt = T[lo + a:lo + b]
        xs = x.reshape((nb, *chain.in_shape))
        y = forward(chain, lane, xs, p, state, training, seed, True, call, nt, a)
        G = lane.cot[0][:nb * top.out_size].reshape(nb, top.out_size)
        val = loss_seed(loss.code, y.reshape(nb, -1), tt, G, scale)
        lane.g[:] = 0.0
        backward(chain, lane, xs, p, state, lane.g, training, seed, call, False, nt, a)
        return val

    vals = run_blocks(run, len(blocks))
    add_lanes(g, ws.G, len(blocks), 0, g.shape[0])
    return sum(vals)


def loss_and_grad(chain, p, X2, T, loss, state, seed, training=True):
    """Loss over all rows of X2 (N, n_in) against T (N, k), and its gradient (new array),
    in chunks of at most 256 samples per lane."""
    N = X2.shape[0]
    nt = numba.get_num_threads()
    ws = LayerWorkspace(chain, min(N, 256 * nt), p.dtype, T.shape[1], nt)
    g = np.zeros(chain.n_params, p.dtype)
    gc = np.zeros(chain.n_params, p.dtype)
    scale = _scale(loss, N, chain.n_out)
    val = 0.0
    cap = ws.rows * ws.threads
    for lo in range(0, N, cap):
        hi = min(N, lo + cap)
        val += _step(chain, ws, X2, T, None, lo, hi, loss, scale, p, state, training, seed, gc,
                     threads_now(ws))
        g += gc
    val += penalty(weight_ranges(chain), p, g, loss.l1, loss.l2, 0, p.shape[0])
    return float(val), g


def train_epochs(chain, p, X2, T, loss, optimizer, epochs, batch_size, seed, state, bar,
                 callback, tick, out):
    """Minibatch training on the per-layer path (see `nets.train`): `epochs` passes over
    seeded shuffles; appends the per-epoch losses to `out` (1-element arrays, kept if
    interrupted) and returns it. When every layer has a compiled form, an epoch is one
    compiled call (`nets.lanestep.train_epoch`); otherwise a step at a time from here."""
    N = X2.shape[0]
    nt = numba.get_num_threads()
    ws = LayerWorkspace(chain, batch_size, p.dtype, T.shape[1], nt)
    nt = threads_now(ws)
    g = np.zeros(chain.n_params, p.dtype)
    ranges = weight_ranges(chain)
    rng = np.random.default_rng(seed)
    lanes = Lanes.of(chain, ws)
    for e in range(epochs):
        rows = rng.permutation(N).astype(np.int64)
        if lanes is not None:
            total = lanes.epoch(X2, T, rows, batch_size, nt, loss, optimizer, ranges, p, g)
        else:
            total = _epoch(chain, ws, X2, T, rows, batch_size, loss, optimizer, ranges, p,
                           state, seed, g, nt)
        out.append(np.array([total]))
        if tick(bar, 1, total, callback, e + 1, p):
            break
    return out


def _epoch(chain, ws, X2, T, rows, batch_size, loss, optimizer, ranges, p, state, seed, g,
           nt):
    """`nets.lanestep.train_epoch`'s steps, each from Python (`_step`)."""
    from . import kernels

    N = X2.shape[0]
    hyper = optimizer.hyper()
    total = 0.0
    for lo in range(0, N, batch_size):
        hi = min(N, lo + batch_size)
        nb = hi - lo
        scale = _scale(loss, nb, chain.n_out)
        val = _step(chain, ws, X2, T, rows, lo, hi, loss, scale, p, state, True, seed, g, nt)
        share = 1.0 if loss.mean else nb / N
        val += penalty(ranges, p, g, share * loss.l1, share * loss.l2, 0, p.shape[0])
        optimizer.step += 1
        kernels.optimizer_step(optimizer.code, hyper, p, g, optimizer.m, optimizer.v,
                               optimizer.step)
        total += val * (nb / N if loss.mean else 1.0)
    return total


def train_iters(chain, p, X2, T, loss, optimizer, iters, seed, state, bar, callback, tick,
                block, out):
    """Full-batch training on the per-layer path: appends per-iteration losses to `out`
    (kept if interrupted) and returns it."""
    from . import kernels

    hyper = optimizer.hyper()
    done = 0
    while done < iters:
        m = min(block, iters - done)
        hist = np.empty(m)
        for i in range(m):
            val, g = loss_and_grad(chain, p, X2, T, loss, state, seed)
            hist[i] = val
            optimizer.step += 1
            kernels.optimizer_step(optimizer.code, hyper, p, g, optimizer.m, optimizer.v,
                                   optimizer.step)
        out.append(hist)
        done += m
        if tick(bar, m, hist[-1], callback, done, p):
            break
    return out
