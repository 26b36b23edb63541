"""Pooling (`MaxPool`, `AvgPool`, `LPPool`, `AdaptiveMaxPool`, `AdaptiveAvgPool`) and
`Flatten`, with their kernels.

One kernel pair serves every pooling kind in 1, 2 and 3 dimensions: the geometry and
the kind are runtime data (`geo`, as in `nets.conv`), so each dtype compiles once. A
window along one dimension is a start, a count and a step (`_window`); an adaptive
window is PyTorch's ``floor(o * I / O) .. ceil((o + 1) * I / O)``. The pullbacks
recompute what they need from ``x`` and ``y`` (max: the first maximum of the window,
as PyTorch), so pooling needs no scratch.
"""

import math
from dataclasses import dataclass

import numpy as np
from numba.extending import overload

from ._config import jit
from .conv import _pad3, _spatial_input, _tuple
from .layers import FLATTEN, POOL, Kernels, Layer, _prod, _shape

MAX, AVG, LP = 0, 1, 2

_GEOS = {}  # (layer, input shape, ...) -> geo: made once, not per call

# Positions in `geo`.
C, ID, IH, IW, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, KIND, ADAPT, INCL = \
    range(22)


def _window_dims(owner, v, nd):
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (int(v),)
    if not isinstance(v, tuple) or not 1 <= len(v) <= 3:
        raise ValueError(f"{owner}: `kernel` must be a tuple of 1 to 3 positive ints (its "
                         f"length is the number of spatial dimensions), got {v!r}")
    return _tuple(owner, "kernel", v, len(v), 1)


class _Pooling(Layer):
    """What every pooling layer shares: its kernels, given `pool_args` (geometry, power)."""

    def pool_args(self, in_shape):
        raise NotImplementedError

    def forward(self, ctx, x, y, p, s, scratch):
        N = x.shape[0]
        pool_forward(*self.pool_args(x.shape[1:]), x.reshape(N, -1), y.reshape(N, -1))

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        if xbar is None:
            return
        N = x.shape[0]
        pool_pullback(*self.pool_args(x.shape[1:]), x.reshape(N, -1), y.reshape(N, -1),
                      ybar.reshape(N, -1), xbar.reshape(N, -1))

    def compiled(self, in_shape):
        geo, norm = self.pool_args(_shape(in_shape))
        return Kernels(POOL, geo=geo, taps=_taps(geo), norm=norm)


@dataclass(frozen=True)
class _Pool(_Pooling):
    kernel: tuple
    stride: object = None
    padding: object = 0
    dilation: object = 1
    ceil_mode: bool = False

    _kind = MAX

    def __post_init__(self):
        name = type(self).__name__
        k = _window_dims(name, self.kernel, None)
        object.__setattr__(self, "kernel", k)
        nd = len(k)
        object.__setattr__(self, "stride", k if self.stride is None
                           else _tuple(name, "stride", self.stride, nd, 1))
        object.__setattr__(self, "padding", _tuple(name, "padding", self.padding, nd, 0))
        object.__setattr__(self, "dilation", _tuple(name, "dilation", self.dilation, nd, 1))
        if any(2 * p > kk for p, kk in zip(self.padding, k)):
            raise ValueError(f"{name}: `padding` {self.padding} must be at most half the "
                             f"kernel {k}")

    def out_shape(self, in_shape):
        nd = len(self.kernel)
        c, *sp = _spatial_input(type(self).__name__, in_shape, nd)
        out = []
        for i, (n, k, s, p, d) in enumerate(zip(sp, self.kernel, self.stride, self.padding,
                                                 self.dilation)):
            span = d * (k - 1) + 1
            if n + 2 * p < span:
                raise ValueError(f"{self!r}: the window spans {span} in spatial dimension "
                                 f"{i}, but the padded input is only {n + 2 * p} (input "
                                 f"shape {tuple(in_shape)})")
            num = n + 2 * p - span
            m = (-(-num // s) if self.ceil_mode else num // s) + 1
            if self.ceil_mode and (m - 1) * s >= n + p:
                m -= 1  # the last window must start inside the input or left padding
            out.append(m)
        return (c, *out)

    def _geo(self, in_shape, include_pad=True):
        key = (self, tuple(in_shape), include_pad)
        if key not in _GEOS:
            _GEOS[key] = self._make_geo(tuple(in_shape), include_pad)
        return _GEOS[key]

    def _make_geo(self, in_shape, include_pad):
        c, *sp = in_shape
        o = self.out_shape(in_shape)[1:]
        return np.array([c, *_pad3(sp, 1), *_pad3(o, 1), *_pad3(self.kernel, 1),
                         *_pad3(self.stride, 1), *_pad3(self.padding, 0),
                         *_pad3(self.dilation, 1), self._kind, 0, int(include_pad)],
                        dtype=np.int64)

    def pool_args(self, in_shape):
        return self._geo(in_shape, self._incl()), 1.0

    def _incl(self):
        return True


@dataclass(frozen=True)
class MaxPool(_Pool):
    """Max pooling (PyTorch's ``MaxPool1d/2d/3d``): kernel, stride (default: the kernel),
    padding (ignored positions, at most half the kernel), dilation, ceil_mode."""

    def jax_apply(self, params, state, x, ctx):
        import jax
        import jax.numpy as jnp

        nd = len(self.kernel)
        pads = [(0, 0), (0, 0)] + [(p, p + _extra(n, k, s, p, d, o)) for n, k, s, p, d, o in
                                   zip(x.shape[2:], self.kernel, self.stride, self.padding,
                                       self.dilation, self.out_shape(x.shape[1:])[1:])]
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1) + self.kernel,
                                     (1, 1) + self.stride, pads,
                                     window_dilation=(1, 1) + self.dilation) if nd else x


def _extra(n, k, s, p, d, o):
    """Right padding beyond p that ceil_mode's last window needs."""
    return max(0, (o - 1) * s + d * (k - 1) + 1 - (n + 2 * p))


@dataclass(frozen=True)
class AvgPool(_Pool):
    """Average pooling (PyTorch's ``AvgPool1d/2d/3d``): kernel, stride (default: the
    kernel), zero padding, ceil_mode, count_include_pad (whether padded zeros count in
    the divisor). No dilation."""

    count_include_pad: bool = True

    _kind = AVG

    def __post_init__(self):
        super().__post_init__()
        if self.dilation != (1,) * len(self.kernel):
            raise ValueError("AvgPool: `dilation` is not supported (PyTorch has none)")

    def _incl(self):
        return self.count_include_pad

    def jax_apply(self, params, state, x, ctx):
        return _jax_sum_pool(self, x, lambda v: v) / _jax_divisor(self, x)


@dataclass(frozen=True)
class LPPool(_Pooling):
    """Power-average pooling (PyTorch's ``LPPool1d/2d/3d``): ``(sum over the window of
    x**p) ** (1/p)``, no padding. As in PyTorch, negative sums give NaN for odd p."""

    norm_type: float
    kernel: tuple
    stride: object = None
    ceil_mode: bool = False

    def __post_init__(self):
        if isinstance(self.norm_type, bool) or not isinstance(self.norm_type, (int, float)) \
                or not self.norm_type > 0 or not math.isfinite(self.norm_type):
            raise ValueError(f"LPPool: `norm_type` must be a positive number, got "
                             f"{self.norm_type!r}")
        k = _window_dims("LPPool", self.kernel, None)
        object.__setattr__(self, "kernel", k)
        object.__setattr__(self, "stride", k if self.stride is None
                           else _tuple("LPPool", "stride", self.stride, len(k), 1))

    def _as_pool(self):
        return _LPWindow(self.kernel, self.stride, 0, 1, self.ceil_mode)


    def out_shape(self, in_shape):
        return self._as_pool().out_shape(in_shape)

    def pool_args(self, in_shape):
        return self._as_pool()._geo(in_shape, False), float(self.norm_type)

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        s = _jax_sum_pool(self._as_pool(), x, lambda v: v ** self.norm_type)
        return jnp.power(s, 1.0 / self.norm_type)


@dataclass(frozen=True)
class _LPWindow(_Pool):
    _kind = LP


@dataclass(frozen=True)
class _Adaptive(_Pooling):
    output_size: tuple

    _kind = MAX

    def __post_init__(self):
        name = type(self).__name__
        v = self.output_size
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            v = (int(v),)
        if not isinstance(v, tuple) or not 1 <= len(v) <= 3:
            raise ValueError(f"{name}: `output_size` must be a tuple of 1 to 3 positive ints "
                             f"(one per spatial dimension), got {self.output_size!r}")
        object.__setattr__(self, "output_size", _tuple(name, "output_size", v, len(v), 1))

    def out_shape(self, in_shape):
        c, *_ = _spatial_input(type(self).__name__, in_shape, len(self.output_size))
        return (c, *self.output_size)


    def _geo(self, in_shape):
        key = (self, tuple(in_shape))
        if key not in _GEOS:
            _GEOS[key] = self._make_geo(tuple(in_shape))
        return _GEOS[key]

    def _make_geo(self, in_shape):
        c, *sp = in_shape
        o = self.output_size
        return np.array([c, *_pad3(sp, 1), *_pad3(o, 1), 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1,
                         self._kind, 1, 0], dtype=np.int64)

    def pool_args(self, in_shape):
        return self._geo(in_shape), 1.0

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        nd = len(self.output_size)
        sp = x.shape[2:]
        red = jnp.max if self._kind == MAX else jnp.mean
        out = x
        # one spatial axis at a time: windows along different axes are independent
        for ax in range(nd):
            n, m = sp[ax], self.output_size[ax]
            parts = [red(jnp.take(out, jnp.arange((o * n) // m, -(-((o + 1) * n) // m)),
                                  axis=2 + ax), axis=2 + ax, keepdims=True) for o in range(m)]
            out = jnp.concatenate(parts, axis=2 + ax)
        return out


@dataclass(frozen=True)
class AdaptiveMaxPool(_Adaptive):
    """Adaptive max pooling (PyTorch's ``AdaptiveMaxPool1d/2d/3d``) to `output_size`."""


@dataclass(frozen=True)
class AdaptiveAvgPool(_Adaptive):
    """Adaptive average pooling (PyTorch's ``AdaptiveAvgPool1d/2d/3d``) to `output_size`."""

    _kind = AVG


def _jax_sum_pool(pool, x, f):
    import jax

    pads = [(0, 0), (0, 0)] + [(p, p + _extra(n, k, s, p, 1, o)) for n, k, s, p, o in
                               zip(x.shape[2:], pool.kernel, pool.stride, pool.padding,
                                   pool.out_shape(x.shape[1:])[1:])]
    return jax.lax.reduce_window(f(x), 0.0, jax.lax.add, (1, 1) + pool.kernel,
                                 (1, 1) + pool.stride, pads)


def _jax_divisor(pool, x):
    """AvgPool's divisor per output position (PyTorch's rule), as a constant array."""
    import jax.numpy as jnp

    osp = pool.out_shape(x.shape[1:])[1:]
    div = np.ones(osp)
    for ax, (n, k, s, p, o) in enumerate(zip(x.shape[2:], pool.kernel, pool.stride,
                                             pool.padding, osp)):
        a = np.arange(o) * s - p
        if pool.count_include_pad:
            size = np.minimum(a + k, n + p) - a
        else:
            size = np.minimum(a + k, n) - np.maximum(a, 0)
        shape = [1] * len(osp)
        shape[ax] = o
        div = div * size.reshape(shape)
    return jnp.asarray(div, dtype=x.dtype)


@dataclass(frozen=True)
class Flatten(Layer):
    """Flattens each sample to a vector, ``(C, *spatial) -> (C * prod(spatial),)``, in C
    order (PyTorch's ``Flatten()`` with its default start_dim=1)."""

    def out_shape(self, in_shape):
        return (_prod(_shape(in_shape)),)

    def forward(self, ctx, x, y, p, s, scratch):
        np.copyto(y, x.reshape(y.shape))

    def compiled(self, in_shape):
        return Kernels(FLATTEN)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        if xbar is not None:
            np.copyto(xbar, ybar.reshape(xbar.shape))

    def jax_apply(self, params, state, x, ctx):
        return x.reshape(x.shape[0], -1)


# ------------------------------------------------------------------- the kernels


@jit(inline="always")
def _window(o, n, m, k, s, p, d, adaptive):
    """(first input index, count, step) of output index o's window along one dimension."""
    if adaptive:
        a = (o * n) // m
        e = ((o + 1) * n + m - 1) // m
        return a, e - a, 1
    a = o * s - p
    if d == 1:  # no integer division (tens of cycles) in the common case
        k0 = max(0, -a)
        k1 = min(k, n - a)
    else:
        k0 = 0 if a >= 0 else (-a + d - 1) // d
        k1 = min(k, (n - 1 - a) // d + 1) if n - 1 - a >= 0 else 0
    return a + k0 * d, max(0, k1 - k0), d


@jit(inline="always")
def _divisor(geo, od, oh, ow, cd, ch, cw):
    """AvgPool's divisor: the window size clipped to the padded input (count_include_pad),
    else the number of input positions in it."""
    if geo[ADAPT] or not geo[INCL]:
        return cd * ch * cw
    size = 1
    for (o, n, k, s, p) in ((od, geo[ID], geo[KD], geo[SD], geo[PD]),
                            (oh, geo[IH], geo[KH], geo[SH], geo[PH]),
                            (ow, geo[IW], geo[KW], geo[SW], geo[PW])):
        a = o * s - p
        size *= min(a + k, n + p) - a
    return size


@jit
def _max_block(geo, X, Y, V, Xbar, taps, backward):
    """Max pooling of every row (backward: Xbar = V routed to each window's first max).

    A window wholly inside the input reads its taps at fixed offsets `taps` from its
    origin (one short loop per output); windows at the borders and adaptive windows take
    the plain loop over the window's valid part."""
    nC = geo[C]
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    kd_, kh_, kw_ = geo[KD], geo[KH], geo[KW]
    sw_, pw_, dw_ = geo[SW], geo[PW], geo[DW]
    ad = geo[ADAPT] != 0
    S = D * H * W
    T = taps.shape[0]
    # 2 x 2 windows (the common case) unrolled: a loop of 4 costs more than its work
    t0, t1, t2, t3 = (taps[0], taps[1], taps[2], taps[3]) if T == 4 else (0, 0, 0, 0)
    neg = X.dtype.type(-np.inf)
    zero = X.dtype.type(0.0)
    # interior outputs along W: lo <= ow < hi have their whole window inside
    lo, hi = 0, 0
    if not ad:
        lo = min(oW, (pw_ + sw_ - 1) // sw_)
        last = W - 1 - (kw_ - 1) * dw_ + pw_
        hi = max(lo, min(oW, last // sw_ + 1)) if last >= 0 else lo
    for n in range(X.shape[0]):
        x = X[n]
        y = Y[n]
        v = V[n]
        xb = Xbar[n]
        if backward:
            for i in range(xb.shape[0]):
                xb[i] = 0.0
        for c in range(nC):
            for od in range(oD):
                d0, cd, sd = _window(od, D, oD, kd_, geo[SD], geo[PD], geo[DD], ad)
                for oh in range(oH):
                    h0, ch, sh = _window(oh, H, oH, kh_, geo[SH], geo[PH], geo[DH], ad)
                    j0 = ((c * oD + od) * oH + oh) * oW
                    inner = not ad and cd == kd_ and ch == kh_
                    a, b = (lo, hi) if inner else (0, 0)
                    origin = c * S + (d0 * H + h0) * W - pw_
                    for ow in range(a, b):
                        o = origin + ow * sw_
                        if backward and T == 4:
                            # branch-free: which tap holds the maximum is random data
                            m = y[j0 + ow]
                            g = v[j0 + ow]
                            e0 = x[o + t0] == m
                            e1 = (x[o + t1] == m) and not e0
                            e2 = (x[o + t2] == m) and not (e0 or e1)
                            e3 = not (e0 or e1 or e2)
                            xb[o + t0] += g if e0 else zero
                            xb[o + t1] += g if e1 else zero
                            xb[o + t2] += g if e2 else zero
                            xb[o + t3] += g if e3 else zero
                        elif backward:
                            m = y[j0 + ow]
                            for t in range(T):
                                if x[o + taps[t]] == m:
                                    xb[o + taps[t]] += v[j0 + ow]
                                    break
                        elif T == 4:
                            y[j0 + ow] = max(max(x[o + t0], x[o + t1]),
                                             max(x[o + t2], x[o + t3]))
                        else:
                            m = x[o + taps[0]]
                            for t in range(1, T):
                                m = max(m, x[o + taps[t]])
                            y[j0 + ow] = m
                    for r in range(oW - (b - a)):  # the border outputs: ow < a, ow >= b
                        ow = r if r < a else r + (b - a)
                        w0, cw, sw = _window(ow, W, oW, kw_, sw_, pw_, dw_, ad)
                        best = neg
                        at = -1
                        for i in range(cd):
                            for k in range(ch):
                                base = c * S + ((d0 + i * sd) * H + h0 + k * sh) * W + w0
                                for q in range(cw):
                                    val = x[base + q * sw]
                                    if val > best or at < 0:
                                        best = val
                                        at = base + q * sw
                        if backward:
                            if at >= 0:
                                xb[at] += v[j0 + ow]
                        else:
                            y[j0 + ow] = best


@jit
def _sum_block(geo, norm, X, Y, V, Xbar, backward):
    """Average (kind AVG) or power-average (LP, exponent `norm`) pooling of every row."""
    nC = geo[C]
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    kw_, sw_, pw_, dw_ = geo[KW], geo[SW], geo[PW], geo[DW]
    ad = geo[ADAPT] != 0
    avg = geo[KIND] == AVG
    S = D * H * W
    zero = X.dtype.type(0.0)
    for n in range(X.shape[0]):
        x = X[n]
        if backward:
            xb = Xbar[n]
            for i in range(xb.shape[0]):
                xb[i] = 0.0
        for c in range(nC):
            for od in range(oD):
                d0, cd, sd = _window(od, D, oD, geo[KD], geo[SD], geo[PD], geo[DD], ad)
                for oh in range(oH):
                    h0, ch, sh = _window(oh, H, oH, geo[KH], geo[SH], geo[PH], geo[DH], ad)
                    j0 = ((c * oD + od) * oH + oh) * oW
                    for ow in range(oW):
                        w0, cw, sw = _window(ow, W, oW, kw_, sw_, pw_, dw_, ad)
                        if backward:
                            if avg:
                                g = V[n, j0 + ow] / _divisor(geo, od, oh, ow, cd, ch, cw)
                            else:
                                y = Y[n, j0 + ow]
                                g = V[n, j0 + ow] * y ** (1.0 - norm) if y != 0 else zero
                        acc = zero
                        for i in range(cd):
                            for k in range(ch):
                                base = c * S + ((d0 + i * sd) * H + h0 + k * sh) * W + w0
                                for q in range(cw):
                                    at = base + q * sw
                                    if backward:
                                        if avg:
                                            xb[at] += g
                                        elif norm == 2.0:
                                            xb[at] += g * x[at]
                                        else:
                                            xb[at] += g * x[at] ** (norm - 1.0)
                                    elif avg:
                                        acc += x[at]
                                    elif norm == 2.0:
                                        acc += x[at] * x[at]
                                    else:
                                        acc += x[at] ** norm
                        if not backward:
                            if avg:
                                Y[n, j0 + ow] = acc / _divisor(geo, od, oh, ow, cd, ch, cw)
                            else:
                                Y[n, j0 + ow] = acc ** (1.0 / norm)


def _bits(a):
    """An integer view of a float array: its bit patterns (compiled only)."""


@overload(_bits, inline="always")
def _bits_overload(a):
    t = np.int32 if a.dtype.bitwidth == 32 else np.int64
    return lambda a: a.view(t)


@jit
def _tiles_2x2(geo):
    """Whether the windows are 2 x 2 (along H, W) and tile the input exactly: stride 2, no
    padding, no dilation (LeNet's pooling)."""
    return (geo[ADAPT] == 0 and geo[KD] == 1 and geo[KH] == 2 and geo[KW] == 2
            and geo[SD] == 1 and geo[SH] == 2 and geo[SW] == 2 and geo[PD] == 0
            and geo[PH] == 0 and geo[PW] == 0 and geo[DH] == 1 and geo[DW] == 1
            and geo[OD] == geo[ID] and 2 * geo[OH] == geo[IH] and 2 * geo[OW] == geo[IW])


@jit
def _max_2x2(geo, X, Y, V, Xbar, backward):
    """`_max_block` for windows that tile the input (`_tiles_2x2`), an output row at a
    time: each input position is in exactly one window, so the backward pass writes
    every position once (no adding). Flat indices, not views per row: a view costs more
    than a short row's work."""
    W = geo[IW]
    oH, oW = geo[OH], geo[OW]
    zero = X.dtype.type(0.0)
    # Unsigned offsets: a signed index pays a wraparound check at each access.
    one = np.uint64(1)
    uW = np.uint64(W)
    for n in range(X.shape[0]):
        x = X[n]
        y = Y[n]
        v = V[n]
        xb = Xbar[n]
        xi = _bits(x)
        yi = _bits(y)
        for q in range(geo[C] * geo[ID] * oH):  # output rows, all channels and depths
            i0 = np.uint64(2 * q * W)
            i1 = i0 + uW
            j = np.uint64(q * oW)
            if not backward:
                for ow in range(oW):
                    o = np.uint64(2 * ow)
                    y[j + np.uint64(ow)] = max(max(x[i0 + o], x[i0 + o + one]),
                                               max(x[i1 + o], x[i1 + o + one]))
                continue
            # Zero the window rows, then store the cotangent at the first maximum in
            # scan order. Integer selects on the bit patterns (max returns one of its
            # operands bit for bit): float selects become branches on random data.
            for t in range(2 * W):
                xb[i0 + np.uint64(t)] = zero
            i = i0
            for _ in range(oW):
                m = yi[j]
                k = uW + one
                k = uW if xi[i + uW] == m else k
                k = one if xi[i + one] == m else k
                k = np.uint64(0) if xi[i] == m else k
                xb[i + k] = v[j]
                i += np.uint64(2)
                j += one


def fm_pool_ok(geo):
    """Whether `pool_fm` serves this pooling: max pooling, not adaptive, no padding, every
    window inside the input (no ceil-mode overhang)."""
    g = [int(v) for v in geo]
    inside = all((g[o] - 1) * g[s] + (g[k] - 1) * g[d] < g[i]
                 for o, s, k, d, i in ((OD, SD, KD, DD, ID), (OH, SH, KH, DH, IH),
                                       (OW, SW, KW, DW, IW)))
    return g[KIND] == MAX and g[ADAPT] == 0 and g[PD] == g[PH] == g[PW] == 0 and inside


@jit
def pool_fm(geo, taps, X, Y, V, Xbar, r, n, backward, clamp):
    """Max pooling (`fm_pool_ok`) of n samples held feature-major (flat, samples
    innermost, as `nets.conv.conv_forward_fm`): Y overwritten; with `backward`, Xbar = V
    routed to each window's first maximum in scan order (overwritten; `r`, n elements,
    holds what each sample has left to route). A window's taps are rows of n samples, so
    the loops over samples vectorise; 2 x 2 windows that tile the input (LeNet's) take
    one pass per window, others one per tap, overlapping windows adding up.

    With `clamp`, Y = max(window, 0): relu then max pooling, which is the same function
    with the same gradient (a window whose maximum is not positive passes none either
    way, relu'(0) = 0), without a pass of its own over the input."""
    nC = geo[C]
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    T = taps.shape[0]
    zero = X.dtype.type(0.0)
    un = np.uint64(n)
    tiled = _tiles_2x2(geo)
    if backward and not tiled:
        for j in range(nC * D * H * W * n):
            Xbar[j] = zero
    # Unsigned offsets: a signed index pays a wraparound check at each access.
    t0, t1, t2, t3 = (np.uint64(taps[0]) * un, np.uint64(taps[1]) * un,
                      np.uint64(taps[2]) * un, np.uint64(taps[3]) * un) if T == 4 else \
        (un, un, un, un)
    q = np.uint64(0)
    for c in range(nC):
        for od in range(oD):
            for oh in range(oH):
                for ow in range(oW):
                    o = np.uint64(((c * D + od * geo[SD]) * H + oh * geo[SH]) * W
                                  + ow * geo[SW]) * un
                    if tiled and not backward:
                        for i in range(un):
                            y = max(max(X[o + t0 + i], X[o + t1 + i]),
                                    max(X[o + t2 + i], X[o + t3 + i]))
                            Y[q + i] = max(y, zero) if clamp else y
                    elif tiled:
                        # each input position in one window: written once, no zeroing
                        for i in range(un):
                            m = Y[q + i]
                            v = (V[q + i] if m > zero else zero) if clamp else V[q + i]
                            # selects only (no and/or: branches would stop the
                            # vectorising); `v` what is left to route
                            h = X[o + t0 + i] == m
                            Xbar[o + t0 + i] = v if h else zero
                            v = zero if h else v
                            h = X[o + t1 + i] == m
                            Xbar[o + t1 + i] = v if h else zero
                            v = zero if h else v
                            h = X[o + t2 + i] == m
                            Xbar[o + t2 + i] = v if h else zero
                            Xbar[o + t3 + i] = zero if h else v
                    elif not backward:
                        for i in range(un):
                            Y[q + i] = X[o + np.uint64(taps[0]) * un + i]
                        for t in range(1, T):
                            ot = o + np.uint64(taps[t]) * un
                            for i in range(un):
                                Y[q + i] = max(Y[q + i], X[ot + i])
                        if clamp:
                            for i in range(un):
                                Y[q + i] = max(Y[q + i], zero)
                    else:
                        for i in range(un):
                            v = V[q + i]
                            r[i] = (v if Y[q + i] > zero else zero) if clamp else v
                        for t in range(T):
                            ot = o + np.uint64(taps[t]) * un
                            for i in range(un):
                                hit = X[ot + i] == Y[q + i]
                                Xbar[ot + i] += r[i] if hit else zero
                                r[i] = zero if hit else r[i]
                    q += un


@jit
def _pool(geo, norm, X, Y, V, Xbar, taps, backward):
    if geo[KIND] == MAX and _tiles_2x2(geo):
        _max_2x2(geo, X, Y, V, Xbar, backward)
    elif geo[KIND] == MAX:
        _max_block(geo, X, Y, V, Xbar, taps, backward)
    else:
        _sum_block(geo, norm, X, Y, V, Xbar, backward)


def pool_forward(geo, norm, X, Y):
    """Y (N, C*out) = pooling of X (N, C*in), overwritten. `norm`: LPPool's p."""
    _pool(geo, norm, X, Y, Y, X, _taps(geo), False)


def pool_pullback(geo, norm, X, Y, V, Xbar):
    """Xbar (N, C*in) = V^T dY/dX, overwritten (V, the output cotangent, is read only)."""
    _pool(geo, norm, X, Y, V, Xbar, _taps(geo), True)


_TAPS = {}


def _taps(geo):
    """Offsets of a full window's taps from its origin, in scan order (made once per geo)."""
    key = geo.tobytes()
    if key not in _TAPS:
        H, W = int(geo[IH]), int(geo[IW])
        d, h, w = np.meshgrid(np.arange(geo[KD]) * geo[DD], np.arange(geo[KH]) * geo[DH],
                              np.arange(geo[KW]) * geo[DW], indexing="ij")
        _TAPS[key] = ((d * H + h) * W + w).ravel().astype(np.int64)
    return _TAPS[key]


__all__ = ["MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool", "AdaptiveAvgPool", "Flatten",
           "pool_forward", "pool_pullback", "pool_fm", "fm_pool_ok"]
