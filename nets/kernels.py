"""Compiled kernels shared by every `Chain`: one generic set that loops over layers.

A chain is described to the kernels by `meta`, an int64 array with one row
per layer: (n_in, n_out, activation, weight offset, bias offset or -1, c0, c1),
offsets into the flat parameter vector `p` (weights row-major (out, in), then
the bias). The activation is the address of its row kernel for the dtype of `p`
(`nets.activations.row_address`, or a registered activation's), called through
that address, with its constants ``c0, c1`` (the bits of float64s): the kernels
hold no activation code, so they are compiled once whatever the activations.
Samples are processed in chunks of `B`: a chunk is copied into the
workspace feature-major, `(features)`, so that every inner loop runs over
contiguous samples and vectorises. A workspace row for one chunk holds

    [input (n_in*B) | per layer: value (n_out*B), derivative (n_out*B) |
     two cotangent buffers (width_max*B each)]

(`chunk_size`). Nothing here allocates: callers own every buffer.
"""

import math
import threading

import numpy as np
from numba import cfunc, from_dtype, prange, types

from ._bits import bits_to_float
from ._config import OPTIONS, jit, pjit
from .activations import call_row
from .gemm import gemm_nn_flat, gemm_nt_rows

IN, OUT, ACT, WOFF, BOFF, C0, C1 = range(7)

# Samples per chunk: a compile-time constant, so that rows of a layer sit at
# constant offsets from each other (see the per-layer cores). Measured on the
# 4-32-16-4 benchmark (2 threads, us/iteration): B=128 410, 256 380, 512 355,
# 1024 440. Longer chunks amortise the horizontal sums of the weight
# gradient; past 512 the layer buffers no longer stay near L1.
B = 512

# _ONE_COPY: a flag passed as a literal True or False is a numba type of its own, so a
# compiled function called with one would be compiled again beside the copy that takes
# a runtime bool (loss_and_grad's); the calls pass bool(True) / bool(False), a runtime
# bool. (Functions inlined at numba's level, as the layer loops, take literals freely.)


# ---------------------------------------------------------------- layout


@jit(inline="always")
def _widths(meta):
    """(n_in + 2 * sum of layer widths, widest row): the two sizes every layout uses."""
    n = meta[0, IN]
    w = meta[0, IN]
    for l in range(meta.shape[0]):
        n += 2 * meta[l, OUT]
        w = max(w, meta[l, OUT])
    return n, w


def chunk_size(meta):
    """Length of one chunk's workspace row, padded to 64 bytes (in Python: a compile
    would cost more than every call)."""
    n, w = _widths.py_func(meta)
    return int((B * (n + 2 * w) + 15) // 16 * 16)


@jit(inline="always")
def _activate(meta, l, buf, zo, do, n, need_d):
    """Layer l's activation on buf[zo:zo+n] in place, its derivative into buf[do:do+n] if
    `need_d`."""
    call_row(meta[l, ACT], buf, zo, do, n, bits_to_float(meta[l, C0]),
             bits_to_float(meta[l, C1]), need_d)


@jit(inline="always")
def _delta_offsets(meta):
    n, w = _widths(meta)
    return n * B, (n + w) * B


# ------------------------------------------------------ per-layer cores
#
# Each core works on 4 output rows x 4 input rows at a time so that every
# element loaded feeds four FMAs. A block at the edge is shifted back to end
# at the last row (overlapping rows are recomputed identically, or get zero
# weights where the operation accumulates); layers narrower than 4 use the
# plain loops. Rows sit at constant multiples of the compile-time chunk
# width B, which lets LLVM vectorise with a single aliasing check.
#
# Cores and their small helpers are called, not inlined at numba's level (inline="always"
# copies a function's IR into every call site: for these, seconds of a cold compile);
# LLVM still inlines the small ones.


# The three products of a layer on a chunk are `nets.gemm`'s register tiles, on the
# chunk's rows (a feature's B samples) in place: the forward pass and the input gradient
# as products along rows, the weight gradient as dot products over the samples.


@jit
def _dense_forward(p, woff, boff, nin, nout, buf, xo, zo, nb):
    """z[o, :] = b[o] + sum_i W[o, i] x[i, :] for the chunk's nb columns."""
    W = p[woff:woff + nout * nin].reshape((nout, nin))
    bias = p[boff:boff + nout] if boff >= 0 else p[:0]
    gemm_nn_flat(buf, zo, B, nb, W[:, :], buf, None, xo, B, np.bool_(False), bias)


@jit
def _weight_grad(p, g, woff, nin, nout, buf, xo, go, nb):
    """g[W] += dz @ x^T over the chunk (reductions over samples)."""
    gW = g[woff:woff + nout * nin].reshape((nout, nin))
    dz = buf[go:go + nout * B].reshape((nout, 1, B))[:, :, :nb]
    gemm_nt_rows(gW, dz, buf, None, xo, B, np.int64(0))


@jit
def _input_grad(p, woff, nin, nout, buf, go, gi, nb):
    """gx[i, :] = sum_o W[o, i] dz[o, :]."""
    W = p[woff:woff + nout * nin].reshape((nout, nin))
    gemm_nn_flat(buf, gi, B, nb, W.T, buf, None, go, B, np.bool_(False), p[:0])


@jit(inline="always")
def _dense_backward(p, g, woff, boff, nin, nout, buf, xo, do, go, gi, nb, want_input):
    """Cotangent of one layer.

    On entry buf[go] holds dL/da (n_out); it is turned into dL/dz in place.
    Accumulates the weight and bias cotangents into `g`; if `want_input`,
    writes dL/dx (n_in) into buf[gi].
    """
    zero = p.dtype.type(0.0)
    for o in range(nout):
        dz = buf[go + o * B: go + o * B + nb]
        d = buf[do + o * B: do + o * B + nb]
        s = zero
        for b in range(nb):
            dz[b] *= d[b]
            s += dz[b]
        if boff >= 0:
            g[boff + o] += s
    _weight_grad(p, g, woff, nin, nout, buf, xo, go, nb)
    if want_input:
        _input_grad(p, woff, nin, nout, buf, go, gi, nb)


# The layer loops inline into their callers: numba optimises a function together with
# every compiled function it calls, so as functions of their own they were optimised once
# alone and again inside each caller. (The cores they call are big: numba would copy
# them into each caller at a cost above optimising them twice.)
@jit(inline="always")
def forward_layers(meta, p, buf, nb, need_d):
    """Run all layers on the chunk already in buf[0:n_in*B]; return the output offset."""
    xo = np.int64(0)  # a literal 0 would compile `_dense_forward` once more, for it
    off = meta[0, IN] * B
    for l in range(meta.shape[0]):
        nin = meta[l, IN]
        nout = meta[l, OUT]
        zo = off
        do = off + nout * B
        _dense_forward(p, meta[l, WOFF], meta[l, BOFF], nin, nout, buf, xo, zo, nb)
        if nb == B:  # a full chunk's rows are contiguous: one call for all of them
            _activate(meta, l, buf, zo, do, nout * B, need_d)
        else:
            for o in range(nout):
                _activate(meta, l, buf, zo + o * B, do + o * B, nb, need_d)
        xo = zo
        off = do + nout * B
    return xo


@jit(inline="always")
def backward_layers(meta, p, g, buf, nb, want_input):
    """Back-propagate the output cotangent found at the first cotangent buffer.

    Accumulates into `g`; returns the offset of dL/dx (n_in) (valid only
    if `want_input`).
    """
    ga, gb = _delta_offsets(meta)
    # Offsets of each layer's value/derivative, walked backwards.
    L = meta.shape[0]
    off = meta[0, IN] * B
    for l in range(L):
        off += 2 * meta[l, OUT] * B
    go = ga
    gi = gb
    for l in range(L - 1, -1, -1):
        nin = meta[l, IN]
        nout = meta[l, OUT]
        off -= 2 * nout * B
        do = off + nout * B
        xo = off - 2 * nin * B if l > 0 else 0
        _dense_backward(p, g, meta[l, WOFF], meta[l, BOFF], nin, nout, buf, xo, do, go, gi,
                        nb, want_input or l > 0)
        go, gi = gi, go
    return go


# -------------------------------------------------------------- batched API


@jit
def forward(meta, p, X, Y, buf):
    """Y[n, :] = chain(X[n, :]) for every row, in chunks of B."""
    N = X.shape[0]
    nin = meta[0, IN]
    nout = meta[-1, OUT]
    for r0 in range(0, N, B):
        nb = min(B, N - r0)
        for b in range(nb):
            for i in range(nin):
                buf[i * B + b] = X[r0 + b, i]
        yo = forward_layers(meta, p, buf, nb, bool(False))  # noqa: UP018 (see _ONE_COPY)
        for b in range(nb):
            for o in range(nout):
                Y[r0 + b, o] = buf[yo + o * B + b]


@jit
def vjp(meta, p, X, V, Xbar, pbar, buf):
    """Xbar = V^T dY/dX per row (written); pbar += sum over rows of V^T dY/dp."""
    N = X.shape[0]
    nin = meta[0, IN]
    nout = meta[-1, OUT]
    ga, _ = _delta_offsets(meta)
    for r0 in range(0, N, B):
        nb = min(B, N - r0)
        for b in range(nb):
            for i in range(nin):
                buf[i * B + b] = X[r0 + b, i]
        forward_layers(meta, p, buf, nb, bool(True))  # noqa: UP018 (see _ONE_COPY)
        for b in range(nb):
            for o in range(nout):
                buf[ga + o * B + b] = V[r0 + b, o]
        gx = backward_layers(meta, p, pbar, buf, nb, bool(True))  # noqa: UP018 (see _ONE_COPY)
        for b in range(nb):
            for i in range(nin):
                Xbar[r0 + b, i] = buf[gx + i * B + b]


@jit
def jacobian(meta, p, X, J, buf):
    """J[n] = dY/dX at X[n], shape (n_out, n_in), by forward mode.

    The chunk's batch axis carries the n_in tangent directions: a tangent
    goes through each layer as W @ t, scaled by the activation derivative.
    Needs B >= n_in (the workspace guarantees it).
    """
    N = X.shape[0]
    nin0 = meta[0, IN]
    L = meta.shape[0]
    for n in range(N):
        for i in range(nin0):
            buf[i * B] = X[n, i]
        forward_layers(meta, p, buf, 1, True)
        # Tangents ping-pong between the two cotangent buffers.
        ta, tb = _delta_offsets(meta)
        for i in range(nin0):
            for j in range(nin0):
                buf[ta + i * B + j] = 1.0 if i == j else 0.0
        off = nin0 * B
        for l in range(L):
            nin = meta[l, IN]
            nout = meta[l, OUT]
            do = off + nout * B
            _dense_forward(p, meta[l, WOFF], np.int64(-1), nin, nout, buf, ta, tb, nin0)
            for o in range(nout):
                s = buf[do + o * B]
                for j in range(nin0):
                    buf[tb + o * B + j] *= s
            off = do + nout * B
            ta, tb = tb, ta
        for o in range(meta[-1, OUT]):
            for j in range(nin0):
                J[n, o, j] = buf[ta + o * B + j]


# ----------------------------------------------------------- one sample
#
# Inside an ODE right-hand side a network sees one sample at a time. These
# kernels use a plain matrix-vector layout (no chunk stride, a scratch of a
# few hundred numbers): [x (n_in) | per layer: value, derivative (n_out each)
# | two cotangent rows (width_max each) | two tangent blocks (width_max*n_in
# each, for `jacobian1`)].


def sample_size(meta):
    """Length of the scratch vector of the one-sample kernels (in Python, as
    `chunk_size`)."""
    n, w = _widths.py_func(meta)
    return int(n + 2 * w + 2 * w * meta[0, IN])


@jit
def _forward1_layers(meta, p, buf, need_d):
    # The sample is in buf[0:n_in]; returns the offset of the output.
    zero = p.dtype.type(0.0)
    xo = 0
    off = meta[0, IN]
    for l in range(meta.shape[0]):
        nin = meta[l, IN]
        nout = meta[l, OUT]
        woff = meta[l, WOFF]
        boff = meta[l, BOFF]
        # views indexed from 0: buf[off + o] in the loops would keep numba's wraparound
        # of a negative index in them, which LLVM does not vectorise
        W = p[woff:woff + nout * nin].reshape((nout, nin))
        x = buf[xo:xo + nin]
        z = buf[off:off + nout]
        if nin < nout:
            # Few inputs, many outputs (e.g. 2 -> 50): a column at a time, so the
            # loop over outputs vectorises (a dot product of length 2 does not).
            for o in range(nout):
                z[o] = p[boff + o] if boff >= 0 else zero
            for i in range(nin):
                xi = x[i]
                for o in range(nout):
                    z[o] += W[o, i] * xi
        else:
            for o in range(nout):
                acc = p[boff + o] if boff >= 0 else zero
                w = W[o]
                for i in range(nin):
                    acc += w[i] * x[i]
                z[o] = acc
        _activate(meta, l, buf, off, off + nout, nout, need_d)
        xo = off
        off += 2 * nout
    return xo


@jit
def forward1(meta, p, x, y, buf):
    """y = chain(x) for one sample (x, y 1-D); buf of length `sample_size`."""
    for i in range(meta[0, IN]):
        buf[i] = x[i]
    yo = _forward1_layers(meta, p, buf, False)
    for o in range(meta[-1, OUT]):
        y[o] = buf[yo + o]


@jit
def vjp1(meta, p, x, v, xbar, pbar, buf):
    """One sample: xbar = v^T dy/dx (written), pbar += v^T dy/dp."""
    for i in range(meta[0, IN]):
        buf[i] = x[i]
    _forward1_layers(meta, p, buf, True)
    off, w = _widths(meta)
    go = off
    gi = off + w
    for o in range(meta[-1, OUT]):
        buf[go + o] = v[o]
    for l in range(meta.shape[0] - 1, -1, -1):
        nin = meta[l, IN]
        nout = meta[l, OUT]
        woff = meta[l, WOFF]
        boff = meta[l, BOFF]
        off -= 2 * nout
        do = off + nout
        xo = off - 2 * nin if l > 0 else 0
        # views from 0 (see `_forward1_layers`)
        W = p[woff:woff + nout * nin].reshape((nout, nin))
        gW = pbar[woff:woff + nout * nin].reshape((nout, nin))
        x = buf[xo:xo + nin]
        dzs = buf[go:go + nout]
        ds = buf[do:do + nout]
        gx = buf[gi:gi + nin]
        for o in range(nout):
            dz = dzs[o] * ds[o]
            dzs[o] = dz
            if boff >= 0:
                pbar[boff + o] += dz
            grow = gW[o]
            for i in range(nin):
                grow[i] += dz * x[i]
        for i in range(nin):
            gx[i] = 0.0
        for o in range(nout):
            dz = dzs[o]
            w = W[o]
            for i in range(nin):
                gx[i] += w[i] * dz
        go, gi = gi, go
    for i in range(meta[0, IN]):
        xbar[i] = buf[go + i]


@jit
def jacobian1(meta, p, x, J, buf):
    """One sample: J = dy/dx, shape (n_out, n_in), by forward mode."""
    n0 = meta[0, IN]
    for i in range(n0):
        buf[i] = x[i]
    _forward1_layers(meta, p, buf, True)
    off, w = _widths(meta)
    ta = off + 2 * w
    tb = ta + w * n0
    for i in range(n0):
        for j in range(n0):
            buf[ta + i * n0 + j] = 1.0 if i == j else 0.0
    off = n0
    for l in range(meta.shape[0]):
        nin = meta[l, IN]
        nout = meta[l, OUT]
        woff = meta[l, WOFF]
        do = off + nout
        # Row o of the new tangent block: d[o] * sum_i W[o, i] * (row i of the old one).
        for o in range(nout):
            row = buf[tb + o * n0: tb + (o + 1) * n0]
            for j in range(n0):
                row[j] = 0.0
            for i in range(nin):
                wv = p[woff + o * nin + i]
                src = buf[ta + i * n0: ta + (i + 1) * n0]
                for j in range(n0):
                    row[j] += wv * src[j]
            s = buf[do + o]
            for j in range(n0):
                row[j] *= s
        off = do + nout
        ta, tb = tb, ta
    for o in range(meta[-1, OUT]):
        for j in range(n0):
            J[o, j] = buf[ta + o * n0 + j]


# ------------------------------------------------------------------ losses

SQUARED, ABSOLUTE, LOGITCE = 0, 1, 2


@jit(inline="always")
def _load_columns(dst, src, rows, gather, r0, nb):
    """dst[k, b] = src[k, row(r0 + b)] for the chunk: src is feature-major (k, N)."""
    for k in range(src.shape[0]):
        d = dst[k * B: k * B + nb]
        s = src[k]
        if gather:
            for b in range(nb):
                d[b] = s[rows[r0 + b]]
        else:
            for b in range(nb):
                d[b] = s[r0 + b]


@jit(inline="always")
def _loss_and_seed(code, buf, yo, ga, to, nb, nout, scale):
    """Loss of the chunk's outputs buf[yo] vs targets buf[to]; writes scale*dL/dy at buf[ga]."""
    zero = buf.dtype.type(0.0)
    total = 0.0
    if code == SQUARED or code == ABSOLUTE:
        c = buf.dtype.type(2 * scale if code == SQUARED else scale)
        for o in range(nout):
            y = buf[yo + o * B: yo + o * B + nb]
            t = buf[to + o * B: to + o * B + nb]
            gy = buf[ga + o * B: ga + o * B + nb]
            s = zero
            if code == SQUARED:
                for b in range(nb):
                    e = y[b] - t[b]
                    s += e * e
                    gy[b] = c * e
            else:
                for b in range(nb):
                    e = y[b] - t[b]
                    s += abs(e)
                    gy[b] = c * (1 if e > 0 else (-1 if e < 0 else 0))
            total += s
    else:  # logit cross-entropy; the target row holds the class index
        for b in range(nb):
            m = buf[yo + b]
            for o in range(1, nout):
                m = max(m, buf[yo + o * B + b])
            s = 0.0
            for o in range(nout):
                s += math.exp(buf[yo + o * B + b] - m)
            label = int(buf[to + b])
            total += m + math.log(s) - buf[yo + label * B + b]
            for o in range(nout):
                q = math.exp(buf[yo + o * B + b] - m) / s
                buf[ga + o * B + b] = scale * (q - (1.0 if o == label else 0.0))
    return total * scale


def loss_grad_rows(meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, buf, want_grad):
    """Loss over samples lo:hi (and its gradient added to g), in chunks of B.

    XT (n_in, N) and TT (n_targets, N) are feature-major. Sample k is column
    rows[k] if `gather`, else column k (full batch: contiguous copies).

    Compiled as a C function, one per float type (`rows_kernel`), which the threaded
    kernels call through its address.
    """
    nout = meta[-1, OUT]
    ga, gb = _delta_offsets(meta)
    total = 0.0
    for r0 in range(lo, hi, B):
        nb = min(B, hi - r0)
        _load_columns(buf, XT, rows, gather, r0, nb)
        # Targets wait in the second cotangent buffer, unused until backward.
        _load_columns(buf[gb:], TT, rows, gather, r0, nb)
        yo = forward_layers(meta, p, buf, nb, want_grad)
        total += _loss_and_seed(code, buf, yo, ga, gb, nb, nout, scale)
        if want_grad:
            backward_layers(meta, p, g, buf, nb, False)
    return total


def _rows_signature(dtype):
    v, m = from_dtype(dtype)[::1], from_dtype(dtype)[:, ::1]
    return types.float64(types.int64[:, ::1], v, m, m, types.int64[::1], types.boolean,
                         types.int64, types.int64, types.int64, types.float64, v, v,
                         types.boolean)


_rows_kernels = {}
_rows_lock = threading.Lock()


def rows_kernel(dtype):
    """`loss_grad_rows` on `dtype` (float32 or float64) as a C function, compiled or loaded
    from the disk cache on first use: the `rows_fn` of `loss_grad` and `train_steps`.

    Called through its address, it is not compiled into its callers: numba optimises a
    function together with every compiled function it calls, and the parallel loop alone
    made four such copies of the layer kernels (the thread pool's entry and wrappers).
    Its arrays are C-contiguous and writeable.
    """
    dtype = np.dtype(dtype)
    with _rows_lock:
        if dtype not in _rows_kernels:
            _rows_kernels[dtype] = cfunc(_rows_signature(dtype), **OPTIONS)(loss_grad_rows)
        return _rows_kernels[dtype]


@jit
def loss_grad(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, G, BUF, nt,
              want_grad):
    """Threaded loss (and gradient written into g) over samples lo:hi (see loss_grad_rows,
    `rows_fn` its `rows_kernel`).

    Thread t takes one contiguous block of samples, its own workspace BUF[t]
    and gradient buffer G[t] (its first n_params entries, its loss at n_params; the
    rows may be longer); the blocks are summed in thread order, so for a
    given `nt` the result does not depend on scheduling. Fewer than two
    chunks run on the calling thread: a parallel launch costs more there.
    """
    return _loss_grad(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, G, BUF,
                      nt, want_grad)


# Inlined into `train_steps` rather than called: numba optimises a function together with
# every compiled function it calls (linked in), so each level of calls over the layer
# kernels optimises them once more, and a cold `train_steps` paid for one level more.
@jit(inline="always")
def _loss_grad(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, G, BUF, nt,
               want_grad):
    """`loss_grad`."""
    n = hi - lo
    npar = g.shape[0]
    for k in range(npar):
        g[k] = 0.0
    if nt <= 1 or n < 2 * B:
        return rows_fn(meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, BUF[0],
                       want_grad)
    per = (n + nt - 1) // nt
    per = (per + B - 1) // B * B  # whole chunks per thread
    nblk = (n + per - 1) // per
    _loss_grad_blocks(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, per, nblk, code, scale,
                      G, BUF, want_grad)
    total = 0.0
    for t in range(nblk):
        total += G[t, npar]
        if want_grad:
            for k in range(npar):
                g[k] += G[t, k]
    return total


@pjit
def _loss_grad_blocks(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, per, nblk, code, scale,
                      G, BUF, want_grad):
    # Only the prange lives here: in a parallel function numba turns array
    # expressions into parallel regions too, each one a thread-pool launch.
    npar = p.shape[0]  # G's rows may be padded past the loss column
    for t in prange(nblk):
        gt = G[t]
        for k in range(npar + 1):
            gt[k] = 0.0
        a = lo + t * per
        gt[npar] = rows_fn(meta, p, XT, TT, rows, gather, a, min(a + per, hi), code, scale,
                           gt[:npar], BUF[t], want_grad)


@jit
def penalty(meta, p, g, l1, l2):
    """l1*|W|_1 + l2*|W|_2^2 over weights (not biases); gradient added to g."""
    total = 0.0
    if l1 == 0.0 and l2 == 0.0:
        return total
    for l in range(meta.shape[0]):
        woff = meta[l, WOFF]
        total = penalize(p, g, woff, woff + meta[l, IN] * meta[l, OUT], l1, l2, total)
    return total


@jit
def penalize(p, g, k0, k1, l1, l2, total):
    """total + l1*|w| + l2*w^2 summed over w = p[k0:k1]; the gradient added to
    g[k0:k1]. The penalties of Dense chains (`penalty`) and of layer chains
    (`nets.lanestep.penalty`) both sum through it."""
    w_, g_ = p[k0:k1], g[k0:k1]  # views, indexed from 0: see `nets.lanestep.add_lanes`
    for k in range(w_.shape[0]):
        w = w_[k]
        total += l1 * abs(w) + l2 * w * w
        g_[k] += l1 * (1.0 if w > 0 else (-1.0 if w < 0 else 0.0)) + 2 * l2 * w
    return total


# -------------------------------------------------------------- optimizers

ADAM, ADAMW, SGD = 0, 1, 2


@jit
def optimizer_step(code, hyper, p, g, m, v, step):
    """One in-place update of p; `step` is the 1-based count after this update.

    hyper: Adam/AdamW (lr, beta1, beta2, eps, weight_decay); SGD (lr, momentum,
    nesterov (0/1), weight_decay). The arithmetic is in p's dtype, as PyTorch's is: in
    float64 a float32 update would not vectorise as wide.
    """
    f = p.dtype.type
    lr = f(hyper[0])
    one = f(1.0)
    if code == SGD:
        mom = f(hyper[1])
        nesterov = hyper[2] != 0.0
        wd = f(hyper[3])
        for k in range(p.shape[0]):
            gk = g[k] + wd * p[k]
            m[k] = mom * m[k] + gk
            p[k] -= lr * (gk + mom * m[k] if nesterov else m[k])
        return
    b1, b2, eps, wd = f(hyper[1]), f(hyper[2]), f(hyper[3]), f(hyper[4])
    c1 = f(1.0 / (1.0 - hyper[1]**step))
    c2 = f(1.0 / (1.0 - hyper[2]**step))
    if code == ADAMW:  # a loop of its own: inside the update, LLVM kept the branch per
        for k in range(p.shape[0]):  # element (LeNet5's Adam step 39 -> 14 us, Zen 4)
            p[k] -= lr * wd * p[k]
    for k in range(p.shape[0]):
        gk = g[k]
        m[k] = b1 * m[k] + (one - b1) * gk
        v[k] = b2 * v[k] + (one - b2) * gk * gk
        p[k] -= lr * (m[k] * c1) / (np.sqrt(v[k] * c2) + eps)


@jit
def train_steps(rows_fn, meta, p, data, bs, nsteps, loss, optimizer, step, hist, g, G, BUF,
                nt):
    """`nsteps` optimizer steps on consecutive batches of `bs` samples (`rows_fn`: the
    `rows_kernel` of p's dtype).

    ``data = (XT, TT, rows, gather)`` as `loss_grad_rows` takes them, ``loss =
    (code, mean, l1, l2)``, ``optimizer = (code, hyper, m, v)`` as `optimizer_step`.

    Samples are taken as in `loss_grad_rows`; step s covers samples
    (s*bs) % N up to at most N, so a full-batch run passes bs == N and an
    epoch's last batch may be short. With sum losses each step carries the
    penalty in proportion to its share of the N samples, so that an epoch
    applies it once; with mean losses every step carries all of it.
    hist[s] = loss (plus penalty) before step s.
    Returns the updated step count.
    """
    XT, TT, rows, gather = data
    code, mean, l1, l2 = loss
    opt, hyper, m, v = optimizer
    n = XT.shape[1]
    nout = meta[-1, OUT]
    want_grad = bool(True)  # noqa: UP018 (see _ONE_COPY)
    for s in range(nsteps):
        lo = (s * bs) % n
        hi = min(lo + bs, n)
        scale = 1.0 / ((hi - lo) * (nout if code != LOGITCE else 1)) if mean else 1.0
        val = _loss_grad(rows_fn, meta, p, XT, TT, rows, gather, lo, hi, code, scale, g, G,
                         BUF, nt, want_grad)
        share = 1.0 if mean else (hi - lo) / n
        val += penalty(meta, p, g, share * l1, share * l2)
        hist[s] = val
        step += 1
        optimizer_step(opt, hyper, p, g, m, v, step)
    return step


__all__ = ["chunk_size", "forward", "vjp", "jacobian", "sample_size", "forward1", "vjp1",
           "jacobian1", "loss_grad", "train_steps",
           "optimizer_step", "penalty", "penalize", "forward_layers", "backward_layers"]
