"""A lane's training step as one compiled call, and an epoch of them as another.

The per-layer path (`nets.layerwise`) calls each layer's kernels from Python: some
forty calls a minibatch per lane, with Python (and, on two threads, the GIL) between
them. When every layer of a chain describes its kernels as data (`Layer.compiled` ->
`Kernels`), `Program` lays the chain out in tables and `train_step` runs gather,
forward, loss and pullback of one lane's block in a single nogil call: one compiled
function for every such chain, with the chain as its data. `train_epoch` runs a whole
epoch of minibatches in one call, the lanes of a step in a parallel loop, then the lane
sum and the optimizer's update; both call `train_step` by its address
(`nets._address`), so that neither compiles it again.

Layouts. The leading run of direct convolutions and max poolings (LeNet's first four
layers) runs feature-major, samples innermost (`nets.conv.conv_forward_fm`,
`nets.pool.pool_fm`): the layout the direct products compute in, so that no layer
converts from or to rows; the first layer after the run reads its input as rows from
the bridge. A relu before a max pooling in the run becomes the pooling's clamp at zero
(`Program._relu_into_pool`). Both make LeNet5's float32 training step faster than the
same step on rows (`python -m benchmarks.lenet5` times it).

The layer table's columns are `KIND` .. `ROW` (the address of the layer's activation's
row kernel, `nets.activations.call_row`); the buffers are the lane's own
(`nets.layerwise.Lane`) but for the run's scratch and the bridge, so both paths see the
same memory. The small compiled pieces
both paths use (`gather`, `loss_seed`, `multiply`, `add_lanes`, `penalty`) live here
too.
"""

import math

import numpy as np
from numba import prange
from numba.typed import List

from ._address import address_of, call_at
from ._config import jit, pjit
from .activations import CODES, call_row
from .conv import (
    _direct,
    conv_forward,
    conv_forward_fm,
    conv_pullback,
    conv_pullback_fm,
    fm_scratch_size,
)
from .kernels import LOGITCE, SQUARED, optimizer_step, penalize
from .layers import CONV, DENSE, POOL
from .linear import dense_forward, dense_pullback
from .pool import _pool, fm_pool_ok, pool_fm
from .tiles import zeros

KIND, ACT, IN, OUT, POFF, NPAR, TRANSPOSED, BIAS, NOUT, GEO, TAPS, FM, CLAMP, ROW = range(14)
C0, C1, NORM = range(3)
RELU = CODES["relu"]


class Program:
    """One lane's chain as tables for `train_step`, or `None` from `Program.of` when a
    layer has no compiled form."""

    @classmethod
    def of(cls, chain, lane):
        kernels = [L.layer.compiled(L.in_shape) for L in chain._plan]
        if any(k is None for k in kernels):
            return None
        return cls(chain, lane, kernels)

    def __init__(self, chain, lane, kernels):
        plan = chain._plan
        self.table = np.zeros((len(plan), ROW + 1), np.int64)
        self.consts = np.zeros((len(plan), 3), np.float64)
        geos, ctaps, ptaps = [], [], []
        for l, (L, k) in enumerate(zip(plan, kernels)):
            row = self.table[l]
            row[KIND], row[ACT], row[IN], row[OUT] = k.kind, L.act, L.in_size, L.out_size
            row[POFF], row[NPAR] = L.poff, L.n_params
            row[TRANSPOSED], row[BIAS], row[NOUT] = k.transposed, k.bias, k.out
            if L.act >= 0:  # the row kernel and constants of the lane's dtype
                row[ROW], self.consts[l, C0], self.consts[l, C1] = lane.acts[l]
            self.consts[l, NORM] = k.norm
            row[GEO] = len(geos)
            geos.append(k.geo)
            taps = ctaps if k.kind == CONV else ptaps
            row[TAPS] = len(taps)
            taps.append(k.taps if k.kind == CONV else k.taps.reshape(-1))
        ctaps.append(np.zeros((1, 1), np.int64))  # typed lists are never empty
        ptaps.append(np.zeros(1, np.int64))
        self.geos = _typed(geos)
        self.ctaps = _typed(ctaps)
        self.ptaps = _typed(ptaps)
        scratch = list(lane.scratch)
        # The leading run of layers with feature-major kernels runs feature-major, with
        # scratch of its own; the bridge holds its last output as rows for what follows.
        rows = lane.rows
        for l, k in enumerate(kernels):
            if k.kind == CONV and _direct.py_func(k.geo, k.transposed):
                scratch[l] = zeros(max(1, int(fm_scratch_size.py_func(k.geo, rows))),
                                   lane.x0.dtype)
            elif k.kind == POOL and fm_pool_ok(k.geo):
                scratch[l] = np.zeros(rows, lane.x0.dtype)
            else:
                break
            self.table[l, FM] = 1
        self.scratch = _typed(scratch)
        self._relu_into_pool(plan)
        self.paths = self._paths()
        self.outs = _typed(lane.out)
        last = int(self.table[:, FM].sum()) - 1
        self.bridge = zeros(rows * plan[last].out_size if last >= 0 else 1, lane.x0.dtype)
        self.lane = lane

    def _relu_into_pool(self, plan):
        """relu then max pooling is max pooling clamped at zero (`nets.pool.pool_fm`'s
        `clamp`): the same outputs and gradient, with no pass over the larger input of
        its own and no derivative to keep. Folds such relus of the feature-major run into
        their pooling (column CLAMP)."""
        t = self.table
        for l in range(len(plan) - 1):
            if (t[l, FM] and t[l + 1, FM] and t[l + 1, KIND] == POOL and t[l, ACT] == RELU
                    and t[l + 1, ACT] < 0):
                t[l + 1, CLAMP], t[l, ACT] = 1, -1

    def _paths(self):
        """`train_step`'s last two arguments: True where a layer of the chain runs a
        convolution (a pooling) on rows, None where none does. numba drops a branch on an
        argument that is None before typing, so that the kernels behind it are not
        compiled: LeNet5 runs its convolutions and poolings feature-major, and those on
        rows (with their im2col path) took a third of its first step's compile. (The
        feature-major and Dense kernels, a few seconds, are always compiled: a path
        argument of their own would compile more variants of `train_step` than it saves.)"""
        rows, kind = self.table[:, FM] == 0, self.table[:, KIND]
        return tuple(True if used.any() else None
                     for used in (rows & (kind == CONV), rows & (kind == POOL)))

    def step_args(self, X2, T, rows, lo, hi, p, code, scale):
        """`train_step`'s arguments for samples rows[lo:hi] of this lane."""
        lane = self.lane
        return (self.table, self.consts, self.geos, self.ctaps, self.ptaps, self.outs,
                self.scratch, lane.cot[0], lane.cot[1], self.bridge, lane.rows, X2, T, rows, lo,
                hi, lane.x0, lane.t0, p, lane.g, code, scale, *self.paths)

    def step(self, X2, T, rows, lo, hi, p, code, scale):
        """Loss (scaled) of samples rows[lo:hi]; the lane's gradient overwritten."""
        return train_step(*self.step_args(X2, T, rows, lo, hi, p, code, scale))


class Lanes:
    """Every lane of a workspace (`nets.layerwise.LayerWorkspace`) for `train_epoch`, or
    `None` from `Lanes.of` when a lane has no `Program`. The buffers are the lanes' own."""

    @classmethod
    def of(cls, chain, ws):
        programs = [lane.program(chain) for lane in ws.lanes]
        return None if any(q is None for q in programs) else cls(programs, ws)

    def __init__(self, programs, ws):
        first = programs[0]  # the tables are the same in every lane
        # the paths flat: a parallel loop's body cannot take a tuple holding None
        self.net = (first.table, first.consts, first.geos, first.ctaps, first.ptaps,
                    *first.paths)
        lanes = ws.lanes
        self.bufs = (List([q.outs for q in programs]), List([q.scratch for q in programs]),
                     _typed([lane.cot[0] for lane in lanes]),
                     _typed([lane.cot[1] for lane in lanes]),
                     _typed([lane.x0 for lane in lanes]), _typed([lane.t0 for lane in lanes]),
                     ws.G, ws.rows, _typed([q.bridge for q in programs]),
                     np.zeros(len(lanes)))  # a step's lane losses, then penalty parts

    def epoch(self, X2, T, rows, batch, nt, loss, optimizer, ranges, p, g):
        """`train_epoch` over the samples in `rows` order; the optimizer's step count
        advanced. Returns the epoch's loss."""
        step_at = _step_address(self.net, self.bufs, X2, T, rows, p, loss.code)
        total, optimizer.step = train_epoch(
            self.net, self.bufs, X2, T, rows, batch, nt, (loss.code, loss.mean, loss.l1, loss.l2),
            (optimizer.code, optimizer.hyper(), optimizer.m, optimizer.v), ranges, p, g,
            optimizer.step, step_at)
        return total


@jit
def multiply(v, d, n):
    """v[:n] *= d[:n] (the cotangent through an activation)."""
    for j in range(n):
        v[j] *= d[j]


@jit
def loss_seed(code, Y, T, G, scale):
    """Loss of outputs Y (N, k) against targets T; G = scale * dL/dY (overwritten).
    Returns scale * loss. For LOGITCE, T[:, 0] holds the class index."""
    N, k = Y.shape
    total = 0.0
    for n in range(N):
        y = Y[n]
        g = G[n]
        if code == LOGITCE:
            m = y[0]
            for o in range(1, k):
                m = max(m, y[o])
            s = 0.0
            for o in range(k):
                s += math.exp(y[o] - m)
            label = int(T[n, 0])
            total += m + math.log(s) - y[label]
            for o in range(k):
                q = math.exp(y[o] - m) / s
                g[o] = scale * (q - (1.0 if o == label else 0.0))
        else:
            t = T[n]
            for o in range(k):
                e = y[o] - t[o]
                if code == SQUARED:
                    total += e * e
                    g[o] = 2.0 * scale * e
                else:
                    total += abs(e)
                    g[o] = scale * (1.0 if e > 0 else (-1.0 if e < 0 else 0.0))
    return total * scale


@jit
def copy_rows(src, dst):
    """dst[:, :] = src[:, :] as loops: numba's slice assignment compiles, for its error
    message, the formatting of shapes into text (~3.5 s of a cold `train_step`)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@jit
def gather(src, rows, lo, hi, dst):
    """dst[i] = src[rows[lo + i]] for i < hi - lo (src, dst 2-D)."""
    for i in range(hi - lo):
        s = src[rows[lo + i]]
        d = dst[i]
        for j in range(s.shape[0]):
            d[j] = s[j]


@jit
def add_lanes(g, G, n, a, b):
    """g[a:b] = G[0, a:b] + G[1, a:b] + ... + G[n-1, a:b], in this order."""
    # On views, from 0: indexing with k in range(a, b) keeps numba's wraparound of a
    # negative index in the loop, which LLVM does not vectorise (9x slower: 66 against
    # 7.4 us for LeNet5's two lanes, Zen 4).
    out, first = g[a:b], G[0, a:b]
    for k in range(out.shape[0]):
        out[k] = first[k]
    for t in range(1, n):
        lane = G[t, a:b]
        for k in range(out.shape[0]):
            out[k] += lane[k]


@jit
def penalty(ranges, p, g, l1, l2, a, b):
    """l1*|w|_1 + l2*|w|^2 over the weight ranges (offset, length) within p[a:b];
    gradient added to g."""
    total = 0.0
    if l1 == 0.0 and l2 == 0.0:
        return total
    for r in range(ranges.shape[0]):
        k0 = max(a, ranges[r, 0])
        k1 = min(b, ranges[r, 0] + ranges[r, 1])
        if k0 < k1:
            total = penalize(p, g, k0, k1, l1, l2, total)
    return total


def _typed(arrays):
    out = List()
    for a in arrays:
        out.append(np.ascontiguousarray(a))
    return out


@jit
def train_step(table, consts, geos, ctaps, ptaps, outs, scratch, cot_a, cot_b, bridge, cap,
               X2, T, rows, lo, hi, x0, t0, p, g, code, scale, rows_conv, rows_pool):
    """Gather rows[lo:hi] of X2 and T, run the layers forward (activations in place,
    derivatives kept), seed the loss's cotangent, pull it back through the layers:
    g = the gradient (overwritten). Returns scale * loss. `cap`: the lane's rows (where
    each output's derivative starts).

    Layers marked FM (a leading run of convolutions and poolings) hold their outputs
    and cotangents feature-major (`nets.conv.conv_forward_fm`); `bridge` holds the last
    such output as rows, the input of the layers after it. `rows_conv`, `rows_pool`: None
    where the chain has no convolution (pooling) on rows (`Program._paths`)."""
    n = hi - lo
    nl = table.shape[0]
    # Runtime values, not literals, for the kernels' flags and offsets: a literal
    # argument would compile a specialisation of the callee of its own (~30 s cold).
    no, yes, zero = n < 0, n >= 0, n - n
    x0f = x0.reshape(-1)
    if table[0, FM]:
        gather_fm(X2, rows, lo, hi, x0f)
    else:
        gather(X2, rows, lo, hi, x0)
    gather(T, rows, lo, hi, t0)
    h = x0[:n]
    for l in range(nl):
        t = table[l]
        S, R = t[OUT], t[IN]
        y = outs[l][:n * S].reshape((n, S))
        pl = p[t[POFF]:t[POFF] + t[NPAR]]
        if t[FM]:
            yf = outs[l][:n * S]
            xf = x0f[:n * R] if l == 0 else outs[l - 1][:n * R]
            if t[KIND] == CONV:
                conv_forward_fm(geos[t[GEO]], ctaps[t[TAPS]], xf, pl, t[BIAS] != 0, yf, n,
                                scratch[l])
            else:
                pool_fm(geos[t[GEO]], ptaps[t[TAPS]], xf, yf, yf, xf, scratch[l], n, no,
                        t[CLAMP] != 0)
        else:
            if l > 0 and table[l - 1, FM]:
                h = bridge[:n * R].reshape((n, R))
                transpose(outs[l - 1], R, n, bridge)
            if t[KIND] == CONV:
                if rows_conv is not None:
                    conv_forward(geos[t[GEO]], ctaps[t[TAPS]], t[TRANSPOSED] != 0, h, pl,
                                 t[BIAS] != 0, y, scratch[l])
            elif t[KIND] == POOL:
                if rows_pool is not None:
                    _pool(geos[t[GEO]], consts[l, NORM], h, y, y, h, ptaps[t[TAPS]], no)
            elif t[KIND] == DENSE:
                dense_forward(h, pl, t[NOUT], t[BIAS] != 0, y, scratch[l])
            else:
                copy_rows(h, y)
        if t[ACT] >= 0:
            call_row(t[ROW], outs[l], zero, cap * S, n * S, consts[l, C0], consts[l, C1], yes)
        h = y
    top = table[nl - 1, OUT]
    if table[nl - 1, FM]:
        h = bridge[:n * top].reshape((n, top))
        transpose(outs[nl - 1], top, n, bridge)
    val = loss_seed(code, h, t0[:n], cot_a[:n * top].reshape((n, top)), scale)
    g[:] = 0.0
    a, b = cot_a, cot_b
    if table[nl - 1, FM]:
        transpose(a, n, top, b)
        a, b = b, a
    for l in range(nl - 1, -1, -1):
        t = table[l]
        S, R = t[OUT], t[IN]
        if t[ACT] >= 0:
            multiply(a, outs[l][cap * S:], n * S)
        want_x = l > 0
        pl = p[t[POFF]:t[POFF] + t[NPAR]]
        gl = g[t[POFF]:t[POFF] + t[NPAR]]
        if t[FM]:
            xf = x0f[:n * R] if l == 0 else outs[l - 1][:n * R]
            if t[KIND] == CONV:
                conv_pullback_fm(geos[t[GEO]], ctaps[t[TAPS]], xf, pl, t[BIAS] != 0,
                                 a[:n * S], b[:n * R], want_x, gl, n, scratch[l])
            elif want_x:
                pool_fm(geos[t[GEO]], ptaps[t[TAPS]], xf, outs[l][:n * S], a[:n * S],
                        b[:n * R], scratch[l], n, yes, t[CLAMP] != 0)
            a, b = b, a
            continue
        ybar = a[:n * S].reshape((n, S))
        after_fm = l > 0 and table[l - 1, FM] != 0
        if l == 0:
            x = x0[:n]
        elif after_fm:
            x = bridge[:n * R].reshape((n, R))
        else:
            x = outs[l - 1][:n * R].reshape((n, R))
        y = outs[l][:n * S].reshape((n, S))
        xbar = b[:n * R].reshape((n, R))
        if t[KIND] == CONV:
            if rows_conv is not None:
                conv_pullback(geos[t[GEO]], ctaps[t[TAPS]], t[TRANSPOSED] != 0, x, pl,
                              t[BIAS] != 0, ybar, xbar, want_x, gl, scratch[l])
        elif t[KIND] == POOL:
            if want_x and rows_pool is not None:
                _pool(geos[t[GEO]], consts[l, NORM], x, y, ybar, xbar, ptaps[t[TAPS]], yes)
        elif t[KIND] == DENSE:
            dense_pullback(x, pl, t[NOUT], t[BIAS] != 0, ybar, xbar, want_x, gl)
        elif want_x:
            copy_rows(ybar, xbar)
        if after_fm:  # back to feature-major, in the buffer just read
            transpose(b, n, R, a)
        else:
            a, b = b, a
    return val


@jit
def gather_fm(src, rows, lo, hi, dst):
    """dst[f * n + i] = src[rows[lo + i], f], n = hi - lo: `gather` feature-major. Eight
    rows at a time, each feature's eight values stored side by side (one vector), several
    times faster than a loop over samples."""
    n = hi - lo
    n8 = n - n % 8
    for i in range(0, n8, 8):
        s0, s1, s2, s3 = src[rows[lo + i]], src[rows[lo + i + 1]], src[rows[lo + i + 2]], \
            src[rows[lo + i + 3]]
        s4, s5, s6, s7 = src[rows[lo + i + 4]], src[rows[lo + i + 5]], \
            src[rows[lo + i + 6]], src[rows[lo + i + 7]]
        for f in range(src.shape[1]):
            d = dst[f * n + i:f * n + i + 8]
            d[0], d[1], d[2], d[3] = s0[f], s1[f], s2[f], s3[f]
            d[4], d[5], d[6], d[7] = s4[f], s5[f], s6[f], s7[f]
    for i in range(n8, n):
        s = src[rows[lo + i]]
        for f in range(src.shape[1]):
            dst[f * n + i] = s[f]


@jit
def transpose(src, r, c, dst):
    """dst (c, r) = src (r, c), both flat: rows of dst written in turn (strided reads
    cost less than strided writes)."""
    for i in range(c):
        d = dst[i * r:(i + 1) * r]
        for j in range(r):
            d[j] = src[j * c + i]


@jit
def train_epoch(net, bufs, X2, T, rows, batch, nt, loss, optimizer, ranges, p, g, step,
                step_at):
    """Minibatches of `batch` samples in `rows` order, each a step of the optimizer: the
    batch cut into contiguous blocks, one per lane, run in parallel (`train_step`), the
    lanes' gradients added in lane order, then the penalty and the update (`_update`, in
    parallel too), all in one call. ``loss = (code, mean, l1, l2)``, ``optimizer = (code,
    hyper, m, v)`` as `nets.kernels.optimizer_step` takes them; ``step_at``:
    `train_step`'s address (`_step_address`). Returns (the epoch's loss, the step count).

    Between steps numba's pool threads wait spinning: handing each step to a Python
    thread pool and collecting it cost LeNet5 a large share of a step."""
    code, mean, l1, l2 = loss
    table = net[0]
    G, vals = bufs[6], bufs[9]
    lanes = G.shape[0]
    N = rows.shape[0]
    nout = table[table.shape[0] - 1, OUT]
    total = 0.0
    for lo in range(0, N, batch):
        hi = min(N, lo + batch)
        nb = hi - lo
        scale = 1.0 / (nb * (nout if code != LOGITCE else 1)) if mean else 1.0
        # as `LayerWorkspace.blocks`
        k = max(1, min(nt, lanes, nb))
        per = max(-(-nb // k), -(-nb // lanes))
        nblk = -(-nb // per)
        if nblk == 1:
            vals[0] = _lane_step(step_at, net, bufs, 0, X2, T, rows, lo, hi, p, code, scale)
        else:
            _lane_steps(step_at, net, bufs, X2, T, rows, lo, hi, per, nblk, p, code, scale,
                        vals)
        val = 0.0
        for t in range(nblk):
            val += vals[t]
        share = 1.0 if mean else nb / N
        step += 1
        parts = min(nt, lanes)
        _update(G, nblk, ranges, share * l1, share * l2, optimizer, p, g, step, parts, vals)
        for t in range(parts):
            val += vals[t]
        total += val * (nb / N if mean else 1.0)
    return total, step


@pjit
def _update(G, nlanes, ranges, l1, l2, optimizer, p, g, step, parts, pen):
    """The step's end, on `parts` blocks of the parameters in parallel: g = the sum of
    the lanes' gradients (`add_lanes`), the penalty's gradient added (`penalty`, its
    value in pen[block]), then the optimizer's update. Run by one thread while the others waited,
    it was a tenth of LeNet5's two-thread step on a Zen 4 (the update's writes to the
    parameters invalidate the other core's copies, the lane sum reads its gradient); the
    blocks are whole cache lines apart."""
    opt, hyper, m, v = optimizer
    n = p.shape[0]
    per = (-(-n // parts) + 15) // 16 * 16
    for t in prange(0, parts):
        a = min(n, t * per)
        b = min(n, a + per)
        add_lanes(g, G, nlanes, a, b)
        pen[t] = penalty(ranges, p, g, l1, l2, a, b)
        optimizer_step(opt, hyper, p[a:b], g[a:b], m[a:b], v[a:b], step)


@jit(inline="always")
def _lane_args(net, bufs, t, X2, T, rows, lo, hi, p, code, scale):
    """`train_step`'s arguments for lane ``t``: one function, so that the address taken
    (`_step_address`) and the calls made (`_lane_step`) see the same types."""
    table, consts, geos, ctaps, ptaps, rows_conv, rows_pool = net
    outs, scratch, cot_a, cot_b, x0, t0, G, cap, bridge, _ = bufs
    return (table, consts, geos, ctaps, ptaps, outs[t], scratch[t], cot_a[t], cot_b[t],
            bridge[t], cap, X2, T, rows, lo, hi, x0[t], t0[t], p, G[t, :p.shape[0]], code,
            scale, rows_conv, rows_pool)


@jit(cache=False)  # an address holds in this process only
def _step_address(net, bufs, X2, T, rows, p, code):
    return address_of(train_step, _lane_args(net, bufs, 0, X2, T, rows, 0, 0, p, code, 1.0))


# `train_step` is called by its address: linked, it would be optimised again in each
# caller (the parallel loop's body, `_lane_steps`, `train_epoch`), see `nets._address`.
@jit(inline="always")
def _lane_step(step_at, net, bufs, t, X2, T, rows, lo, hi, p, code, scale):
    return call_at(step_at, train_step, _lane_args(net, bufs, t, X2, T, rows, lo, hi, p, code,
                                                   scale))


@pjit
def _lane_steps(step_at, net, bufs, X2, T, rows, lo, hi, per, nblk, p, code, scale, vals):
    # Only the prange lives here (see `nets.kernels._loss_grad_blocks`). prange(0, n), not
    # prange(n): the latter's index is unsigned, and indexing the typed lists with it
    # warns of an unsafe cast to int64 on every cold compile.
    for t in prange(0, nblk):
        a = lo + t * per
        vals[t] = _lane_step(step_at, net, bufs, t, X2, T, rows, a, min(a + per, hi), p, code,
                             scale)
