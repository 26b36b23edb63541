"""A lane's training step as one compiled call.

The per-layer path (`nets.layerwise`) calls each layer's kernels from Python: some
forty calls a minibatch per lane, with Python (and, on two threads, the GIL) between
them. When every layer of a chain describes its kernels as data (`Layer.compiled` ->
`Kernels`) and its activations are builtins, `Program` lays the chain out in tables
and `train_step` runs gather, forward, loss and pullback of one lane's block in a
single nogil call: one compiled function for every such chain, with the chain as its
data. Training LeNet5 in float32 on this project's AMD machine, 32 images a lane:
63.8 -> 50.8 us an image on one thread, 47.9 -> 38.2 on two (medians of 5 alternating
runs).

The layer table's columns are `KIND` .. `TAPS`; the buffers are the lane's own
(`nets.layerwise.Lane`), so both paths see the same memory. The small compiled pieces
both paths use (`gather`, `loss_seed`, `multiply`) live here too.
"""

import math

import numpy as np
from numba.typed import List

from ._config import jit
from .activations import _DEFAULT0, _DEFAULT1, activate_row_c
from .conv import conv_forward, conv_pullback
from .kernels import LOGITCE, SQUARED
from .layers import CONV, DENSE, POOL
from .linear import dense_forward, dense_pullback
from .pool import _pool

KIND, ACT, IN, OUT, POFF, NPAR, TRANSPOSED, BIAS, NOUT, GEO, TAPS = range(11)
C0, C1, NORM = range(3)


class Program:
    """One lane's chain as tables for `train_step`, or `None` from `Program.of` when a
    layer has no compiled form (or an activation is a custom one)."""

    @classmethod
    def of(cls, chain, lane):
        kernels = [L.layer.compiled(L.in_shape) for L in chain._plan]
        if any(k is None for k in kernels) or any(L.custom is not None for L in chain._plan):
            return None
        return cls(chain, lane, kernels)

    def __init__(self, chain, lane, kernels):
        plan = chain._plan
        self.table = np.zeros((len(plan), 11), np.int64)
        self.consts = np.zeros((len(plan), 3), np.float64)
        geos, ctaps, ptaps = [], [], []
        for l, (L, k) in enumerate(zip(plan, kernels)):
            row = self.table[l]
            row[KIND], row[ACT], row[IN], row[OUT] = k.kind, L.act, L.in_size, L.out_size
            row[POFF], row[NPAR] = L.poff, L.n_params
            row[TRANSPOSED], row[BIAS], row[NOUT] = k.transposed, k.bias, k.out
            if L.act >= 0:
                c = L.consts if L.consts is not None else (_DEFAULT0[L.act], _DEFAULT1[L.act])
                self.consts[l, C0], self.consts[l, C1] = c
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
        self.outs = _typed(lane.out)
        self.scratch = _typed(lane.scratch)
        self.lane = lane

    def step(self, X2, T, rows, lo, hi, p, code, scale):
        """Loss (scaled) of samples rows[lo:hi]; the lane's gradient overwritten."""
        lane = self.lane
        return train_step(self.table, self.consts, self.geos, self.ctaps, self.ptaps,
                          self.outs, self.scratch, lane.cot[0], lane.cot[1], lane.rows,
                          X2, T, rows, lo, hi, lane.x0, lane.t0, p, lane.g, code, scale)


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
def gather(src, rows, lo, hi, dst):
    """dst[i] = src[rows[lo + i]] for i < hi - lo (src, dst 2-D)."""
    for i in range(hi - lo):
        s = src[rows[lo + i]]
        d = dst[i]
        for j in range(s.shape[0]):
            d[j] = s[j]


def _typed(arrays):
    out = List()
    for a in arrays:
        out.append(np.ascontiguousarray(a))
    return out


@jit
def train_step(table, consts, geos, ctaps, ptaps, outs, scratch, cot_a, cot_b, cap, X2, T,
               rows, lo, hi, x0, t0, p, g, code, scale):
    """Gather rows[lo:hi] of X2 and T, run the layers forward (activations in place,
    derivatives kept), seed the loss's cotangent, pull it back through the layers:
    g = the gradient (overwritten). Returns scale * loss. `cap`: the lane's rows (where
    each output's derivative starts)."""
    n = hi - lo
    nl = table.shape[0]
    # Runtime values, not literals, for the kernels' flags and offsets: a literal
    # argument would compile a specialisation of the callee of its own (~30 s cold).
    no, yes, zero = n < 0, n >= 0, n - n
    gather(X2, rows, lo, hi, x0)
    gather(T, rows, lo, hi, t0)
    h = x0[:n]
    for l in range(nl):
        t = table[l]
        S = t[OUT]
        y = outs[l][:n * S].reshape((n, S))
        pl = p[t[POFF]:t[POFF] + t[NPAR]]
        if t[KIND] == CONV:
            conv_forward(geos[t[GEO]], ctaps[t[TAPS]], t[TRANSPOSED] != 0, h, pl,
                         t[BIAS] != 0, y, scratch[l])
        elif t[KIND] == POOL:
            _pool(geos[t[GEO]], consts[l, NORM], h, y, y, h, ptaps[t[TAPS]], no)
        elif t[KIND] == DENSE:
            dense_forward(h, pl, t[NOUT], t[BIAS] != 0, y, scratch[l])
        else:
            y[:, :] = h
        if t[ACT] >= 0:
            activate_row_c(t[ACT], consts[l, C0], consts[l, C1], outs[l], zero, cap * S, n * S,
                           yes)
        h = y
    top = table[nl - 1, OUT]
    val = loss_seed(code, h, t0[:n], cot_a[:n * top].reshape((n, top)), scale)
    g[:] = 0.0
    a, b = cot_a, cot_b
    for l in range(nl - 1, -1, -1):
        t = table[l]
        S, R = t[OUT], t[IN]
        if t[ACT] >= 0:
            multiply(a, outs[l][cap * S:], n * S)
        ybar = a[:n * S].reshape((n, S))
        x = x0[:n] if l == 0 else outs[l - 1][:n * R].reshape((n, R))
        y = outs[l][:n * S].reshape((n, S))
        xbar = b[:n * R].reshape((n, R))
        want_x = l > 0
        pl = p[t[POFF]:t[POFF] + t[NPAR]]
        gl = g[t[POFF]:t[POFF] + t[NPAR]]
        if t[KIND] == CONV:
            conv_pullback(geos[t[GEO]], ctaps[t[TAPS]], t[TRANSPOSED] != 0, x, pl,
                          t[BIAS] != 0, ybar, xbar, want_x, gl, scratch[l])
        elif t[KIND] == POOL:
            if want_x:
                _pool(geos[t[GEO]], consts[l, NORM], x, y, ybar, xbar, ptaps[t[TAPS]], yes)
        elif t[KIND] == DENSE:
            dense_pullback(x, pl, t[NOUT], t[BIAS] != 0, ybar, xbar, want_x, gl)
        elif want_x:
            xbar[:, :] = ybar
        a, b = b, a
    return val


__all__ = ["Program", "train_step"]
