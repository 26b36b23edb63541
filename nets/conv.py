"""Convolutions: `Conv` and `ConvTranspose` in 1, 2 and 3 dimensions, and their kernels.

One kernel family serves every dimension, stride, padding, dilation and group count:
a 1-D or 2-D convolution is a 3-D one with leading spatial sizes 1, and the geometry
is runtime data (an int64 vector `geo`, see `_geometry`), so each dtype compiles once.

A convolution is, per group, a product of the weight matrix ``(out, in/groups *
prod(kernel))`` with the input's taps, for a block of samples at once (`nets.gemm`). With
stride 1 along W (the common case, `_direct_*`) the taps are windows of the zero-padded
input itself, held with the sample as the fastest axis and read in place: no unfolding,
and each product row is (output width) x (samples) long. Otherwise the input is unfolded
into columns (im2col, `_cols_*`) and folded back (col2im). A transposed convolution is
the same pieces with the roles of input and output exchanged: its forward is a
convolution's input gradient, its input gradient a convolution's forward (on the
columns path).

The kernels run on one thread over the rows they are given (the chain threads over
the batch, see `nets.layers.Layer`).
"""

import math
from dataclasses import dataclass

import numpy as np

from ._config import jit
from .gemm import gemm_nn, gemm_nn_rows, gemm_nt, gemm_nt_rows, gemm_tn_rows
from .layers import (
    CONV,
    Kernels,
    Layer,
    _shape,
    check_activation,
    check_positive_int,
    torch_uniform,
)
from .tiles import total

# Positions in `geo`: the convolution's input ("image") side, its output ("column") side,
# kernel, stride, padding, dilation, groups.
CI, ID, IH, IW, CO, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, GR = range(21)


# ----------------------------------------------------------------- layer settings


def _tuple(owner, name, v, nd, minimum):
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (int(v),) * nd
    if not isinstance(v, tuple) or len(v) != nd or not all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) and a >= minimum
            for a in v):
        raise ValueError(f"{owner}: `{name}` must be an int >= {minimum} or a tuple of {nd} "
                         f"such ints (one per spatial dimension), got {v!r}")
    return tuple(int(a) for a in v)


def _kernel(owner, kernel):
    if isinstance(kernel, (int, np.integer)) and not isinstance(kernel, bool):
        kernel = (int(kernel),)
    if not isinstance(kernel, tuple) or not 1 <= len(kernel) <= 3 or not all(
            isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1
            for k in kernel):
        raise ValueError(f"{owner}: `kernel` must be a tuple of 1 to 3 positive ints (its "
                         f"length is the number of spatial dimensions), got {kernel!r}")
    return tuple(int(k) for k in kernel)


def _spatial_input(owner, in_shape, nd):
    in_shape = _shape(in_shape)
    if len(in_shape) != nd + 1:
        raise ValueError(f"{owner} has a {nd}-D kernel and takes inputs (C, "
                         f"{', '.join('DHW'[3 - nd:])}), got input shape {in_shape}")
    return in_shape


def _pad3(t, fill):
    return (fill,) * (3 - len(t)) + tuple(t)


@dataclass(frozen=True)
class _ConvBase(Layer):
    out: int
    kernel: tuple
    activation: str = "identity"
    stride: object = 1
    padding: object = 0
    dilation: object = 1
    groups: int = 1
    bias: bool = True

    def __post_init__(self):
        name = type(self).__name__
        check_positive_int(name, "out", self.out)
        k = _kernel(name, self.kernel)
        object.__setattr__(self, "kernel", k)
        nd = len(k)
        object.__setattr__(self, "stride", _tuple(name, "stride", self.stride, nd, 1))
        object.__setattr__(self, "dilation", _tuple(name, "dilation", self.dilation, nd, 1))
        if isinstance(self.padding, str):
            same_ok = type(self) is Conv and self.stride == (1,) * nd
            if self.padding not in ("valid", "same") or (self.padding == "same" and not same_ok):
                raise ValueError(f"{name}: `padding` as a string must be 'valid', or 'same' "
                                 f"for a Conv with stride 1, got {self.padding!r}")
            pad = (0,) * nd if self.padding == "valid" else self._same_padding()
        else:
            pad = _tuple(name, "padding", self.padding, nd, 0)
        object.__setattr__(self, "padding", pad)
        check_positive_int(name, "groups", self.groups)
        if self.out % self.groups:
            raise ValueError(f"{name}: `out` ({self.out}) must be divisible by `groups` "
                             f"({self.groups})")
        object.__setattr__(self, "activation", check_activation(name, self.activation))

    def _same_padding(self):
        total = [d * (k - 1) for k, d in zip(self.kernel, self.dilation)]
        if any(t % 2 for t in total):
            raise ValueError(f"{type(self).__name__}: padding='same' needs an even "
                             f"dilation*(kernel-1) in every dimension, got {tuple(total)}")
        return tuple(t // 2 for t in total)

    @property
    def ndim(self):
        return len(self.kernel)

    def __repr__(self):
        s = f"{type(self).__name__}({self.out}, {self.kernel}"
        if self.activation != "identity":
            s += f", {self.activation!r}"
        for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
            v = getattr(self, name)
            if v != (default,) * self.ndim:
                s += f", {name}={v}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias else ", bias=False") + ")"

    def _check_groups(self, cin):
        if cin % self.groups:
            raise ValueError(f"{type(self).__name__}: the input's {cin} channels are not "
                             f"divisible by groups={self.groups}")

    # ------------------------------------------------------------------ kernels

    def scratch_size(self, in_shape, batch):
        return scratch_size(self._geo(_shape(in_shape))[0], self._transposed, batch)

    def compiled(self, in_shape):
        geo, taps = self._geo(_shape(in_shape))
        return Kernels(CONV, geo=geo, taps=taps, transposed=self._transposed, bias=self.bias)

    def forward(self, ctx, x, y, p, s, scratch):
        geo, taps = self._geo(x.shape[1:])
        N = x.shape[0]
        conv_forward(geo, taps, self._transposed, x.reshape(N, -1), p, self.bias,
                     y.reshape(N, -1), scratch)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        geo, taps = self._geo(x.shape[1:])
        N = x.shape[0]
        want_x = xbar is not None
        xb = xbar.reshape(N, -1) if want_x else x.reshape(N, -1)[:0]
        conv_pullback(geo, taps, self._transposed, x.reshape(N, -1), p, self.bias,
                      ybar.reshape(N, -1), xb, want_x, pbar, scratch)


@dataclass(frozen=True, repr=False)
class Conv(_ConvBase):
    """Convolution (cross-correlation, as PyTorch's ``Conv1d/2d/3d``) ``y = act(W * x + b)``.

    Parameters
    ----------
    out : int
        Output channels.
    kernel : tuple of 1, 2 or 3 ints
        Kernel size; its length is the number of spatial dimensions (an int: 1-D).
        Inputs are ``(C, L)``, ``(C, H, W)`` or ``(C, D, H, W)`` per sample.
    activation : str, default "identity"
        A name of the activation registry, applied after the bias.
    stride, padding, dilation : int or tuple
        As in PyTorch (zero padding); ``padding`` may be "valid" or, with stride 1, "same".
    groups : int
        Input and output channels split into this many independent groups.
    bias : bool

    In the flat parameter vector: weight ``(out, in/groups, *kernel)`` row-major, then
    bias ``(out,)``: PyTorch's ``state_dict``. Initialised as PyTorch does (uniform in
    +-1/sqrt(in/groups * prod(kernel))).
    """

    _transposed = False

    def out_shape(self, in_shape):
        nd = self.ndim
        cin, *sp = _spatial_input("Conv", in_shape, nd)
        self._check_groups(cin)
        out = []
        for i, (n, k, s, p, d) in enumerate(zip(sp, self.kernel, self.stride, self.padding,
                                                 self.dilation)):
            span = d * (k - 1) + 1
            if n + 2 * p < span:
                raise ValueError(f"{self!r}: the kernel spans {span} (dilation*(kernel-1)+1) "
                                 f"in spatial dimension {i}, but the padded input is only "
                                 f"{n + 2 * p} (input shape {tuple(in_shape)}, padding {p})")
            out.append((n + 2 * p - span) // s + 1)
        return (self.out, *out)

    def param_shapes(self, in_shape):
        cin = _shape(in_shape)[0]
        w = ("weight", (self.out, cin // self.groups, *self.kernel))
        return (w, ("bias", (self.out,))) if self.bias else (w,)

    def init_params(self, in_shape, arrays, rng):
        fan_in = _shape(in_shape)[0] // self.groups * math.prod(self.kernel)
        torch_uniform(rng, arrays["weight"], fan_in)
        if self.bias:
            torch_uniform(rng, arrays["bias"], fan_in)

    def _geo(self, in_shape):
        key = (self, tuple(in_shape))
        if key not in _LAYER_GEO:
            in_shape = tuple(in_shape)
            o = self.out_shape(in_shape)
            _LAYER_GEO[key] = _geometry(in_shape, o, self.kernel, self.stride, self.padding,
                                        self.dilation, self.groups)
        return _LAYER_GEO[key]

    def jax_apply(self, params, state, x, ctx):
        import jax

        nd = self.ndim
        spec = ("NCH", "OIH", "NCH") if nd == 1 else (
            ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW"))
        y = jax.lax.conv_general_dilated(
            x, params["weight"], window_strides=self.stride,
            padding=[(p, p) for p in self.padding], rhs_dilation=self.dilation,
            dimension_numbers=spec, feature_group_count=self.groups,
            precision=jax.lax.Precision.HIGHEST)
        if self.bias:
            y = y + params["bias"].reshape((1, -1) + (1,) * nd)
        return y


@dataclass(frozen=True, repr=False)
class ConvTranspose(_ConvBase):
    """Transposed convolution (PyTorch's ``ConvTranspose1d/2d/3d``): the adjoint of `Conv`.

    Parameters as `Conv`, plus ``output_padding`` (int or tuple, each < stride or <
    dilation, added to one side of the output). Output size per spatial dimension:
    ``(n - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1``.

    In the flat parameter vector: weight ``(in, out/groups, *kernel)`` row-major (PyTorch's
    layout for transposed convolutions), then bias ``(out,)``. Initialised as PyTorch
    does (uniform in +-1/sqrt(out/groups * prod(kernel))).
    """

    output_padding: object = 0

    _transposed = True

    def __post_init__(self):
        super().__post_init__()
        op = _tuple("ConvTranspose", "output_padding", self.output_padding, self.ndim, 0)
        object.__setattr__(self, "output_padding", op)
        for o, s, d in zip(op, self.stride, self.dilation):
            if o >= s and o >= d:
                raise ValueError(f"ConvTranspose: `output_padding` {op} must be smaller than "
                                 f"the stride {self.stride} or the dilation {self.dilation}")

    def __repr__(self):
        s = super().__repr__()
        if self.output_padding != (0,) * self.ndim:
            s = s[:-1] + f", output_padding={self.output_padding})"
        return s

    def out_shape(self, in_shape):
        nd = self.ndim
        cin, *sp = _spatial_input("ConvTranspose", in_shape, nd)
        self._check_groups(cin)
        out = []
        for i, (n, k, s, p, d, op) in enumerate(zip(sp, self.kernel, self.stride, self.padding,
                                                     self.dilation, self.output_padding)):
            m = (n - 1) * s - 2 * p + d * (k - 1) + op + 1
            if m < 1:
                raise ValueError(f"{self!r}: output size {m} < 1 in spatial dimension {i} "
                                 f"for input shape {tuple(in_shape)}")
            out.append(m)
        return (self.out, *out)

    def param_shapes(self, in_shape):
        cin = _shape(in_shape)[0]
        w = ("weight", (cin, self.out // self.groups, *self.kernel))
        return (w, ("bias", (self.out,))) if self.bias else (w,)

    def init_params(self, in_shape, arrays, rng):
        # PyTorch computes fan_in from dim 1 of the weight: out/groups * prod(kernel).
        fan_in = self.out // self.groups * math.prod(self.kernel)
        torch_uniform(rng, arrays["weight"], fan_in)
        if self.bias:
            torch_uniform(rng, arrays["bias"], fan_in)

    def _geo(self, in_shape):
        # The convolution whose input is this layer's output and whose output is its input.
        key = (self, tuple(in_shape))
        if key not in _LAYER_GEO:
            in_shape = tuple(in_shape)
            o = self.out_shape(in_shape)
            _LAYER_GEO[key] = _geometry(o, in_shape, self.kernel, self.stride, self.padding,
                                        self.dilation, self.groups)
        return _LAYER_GEO[key]

    def jax_apply(self, params, state, x, ctx):
        import jax
        import jax.numpy as jnp

        nd = self.ndim
        spec = ("NCH", "OIH", "NCH") if nd == 1 else (
            ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW"))
        W = params["weight"]  # (in, out/g, *k)
        g = self.groups
        cin = W.shape[0]
        # As a convolution of the dilated input with the flipped kernel, (out, in/g, *k).
        Wg = W.reshape((g, cin // g, self.out // g) + self.kernel)
        Wg = jnp.swapaxes(Wg, 1, 2).reshape((self.out, cin // g) + self.kernel)
        Wg = jnp.flip(Wg, axis=tuple(range(2, 2 + nd)))
        pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, p, d, op in
                zip(self.kernel, self.padding, self.dilation, self.output_padding)]
        y = jax.lax.conv_general_dilated(
            x, Wg, window_strides=(1,) * nd, padding=pads, lhs_dilation=self.stride,
            rhs_dilation=self.dilation, dimension_numbers=spec, feature_group_count=g,
            precision=jax.lax.Precision.HIGHEST)
        if self.bias:
            y = y + params["bias"].reshape((1, -1) + (1,) * nd)
        return y


_GEO = {}
_LAYER_GEO = {}  # (layer, input shape) -> (geo, taps)

# Samples per block: a block's buffers (`_per_sample` each) are kept near this many
# elements, so that they stay in L2 while the products sweep them.
BLOCK_ELEMS = 1 << 17


def _geometry(img_shape, col_shape, kernel, stride, padding, dilation, groups):
    """(`geo`, `taps`) of a convolution from image (C, *sp) to columns (C', *sp'), made
    once per shape: `geo` the int64 geometry vector, `taps` its per-tap table (`_taps`)."""
    key = (tuple(img_shape), tuple(col_shape), kernel, stride, padding, dilation, groups)
    if key not in _GEO:
        ci, *isp = img_shape
        co, *osp = col_shape
        geo = np.array([ci, *_pad3(isp, 1), co, *_pad3(osp, 1), *_pad3(kernel, 1),
                        *_pad3(stride, 1), *_pad3(padding, 0), *_pad3(dilation, 1), groups],
                       dtype=np.int64)
        _GEO[key] = (geo, _taps(geo))
    return _GEO[key]


def _taps(geo):
    """One row per tap (c, kd, kh, kw) of a group, as the kernels' rows: the channel's
    offset c * D * H * W; the input position of output (0, 0, 0) along D, H, W (negative
    in the padding); the output columns lo <= ow < hi whose input column is inside; and
    1 if every output position reads inside the input (no padding reached, stride 1
    along W: one plain copy per output row), else 0; and the tap's offset in the padded
    image (C, D + 2 pd, H + 2 ph, W + 2 pw) from output (0, 0, 0)'s window (`_direct_*`)."""
    D, H, W = (int(v) for v in geo[[ID, IH, IW]])
    oD, oH, oW = (int(v) for v in geo[[OD, OH, OW]])
    sd, sh, sw = (int(v) for v in geo[[SD, SH, SW]])
    rows = []
    for c in range(int(geo[CI] // geo[GR])):
        for kd in range(int(geo[KD])):
            for kh in range(int(geo[KH])):
                for kw in range(int(geo[KW])):
                    d0 = kd * int(geo[DD]) - int(geo[PD])
                    h0 = kh * int(geo[DH]) - int(geo[PH])
                    w0 = kw * int(geo[DW]) - int(geo[PW])
                    inside_w = [0 <= ow * sw + w0 < W for ow in range(oW)]
                    lo = inside_w.index(True) if any(inside_w) else oW
                    hi = oW - inside_w[::-1].index(True) if any(inside_w) else oW
                    inside = (lo == 0 and hi == oW and sw == 1 and d0 >= 0 and h0 >= 0
                              and (oD - 1) * sd + d0 < D and (oH - 1) * sh + h0 < H)
                    Dp, Hp, Wp = D + 2 * int(geo[PD]), H + 2 * int(geo[PH]), W + 2 * int(geo[PW])
                    direct = ((c * Dp + kd * int(geo[DD])) * Hp + kh * int(geo[DH])) * Wp \
                        + kw * int(geo[DW])
                    rows.append((c * D * H * W, d0, h0, w0, lo, hi, int(inside), direct))
    return np.array(rows, dtype=np.int64).reshape(-1, 8)


def scratch_size(geo, transposed, batch):
    """Room for one block of up to `batch` samples, fewer if that is over `BLOCK_ELEMS`
    (the kernels read the block size back from the scratch's length): see
    `_direct_forward` and `_cols_forward` for what a block holds."""
    per = int(_per_sample.py_func(geo, transposed))
    cap = BLOCK_ELEMS // per
    # whole vectors: a direct product row is OW x (block size) long
    cap = cap - cap % 16 if cap >= 16 else max(1, cap)
    return per * min(int(batch), cap)


# ------------------------------------------------------------ the columns path
#
# Strides along W other than 1, and transposed convolutions. A block of m samples is one
# matrix product per group: the samples' columns side by
# side, col (rows, m * P), and the column side channel-major, Z (C', m * P), so that a
# product's rows are long (m * P) and its register blocks run at the speed of the FMA
# units rather than of their loop overhead. Z is copied from and to the batch-first
# (N, C', P) arrays by `_gather_cols` and `_scatter_cols` (runs of P).


@jit
def _im2col(geo, taps, img, c0, col, j0):
    """col[(c, kd, kh, kw), j0 + (od, oh, ow)] = img[c0 + c, input position] (0 in the
    padding): one sample's columns of a block's matrix.

    img: one sample's image side, flat (C * D * H * W); col: (rows, block positions),
    its columns j0 .. j0 + OD * OH * OW overwritten; taps: `_taps`.
    """
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    sd, sh, sw = geo[SD], geo[SH], geo[SW]
    P = oD * oH * oW
    zero = col.dtype.type(0.0)
    for r in range(taps.shape[0]):
        base = c0 * D * H * W + taps[r, 0]
        d0, h0, w0, lo, hi = taps[r, 1], taps[r, 2], taps[r, 3], taps[r, 4], taps[r, 5]
        row = col[r, j0:j0 + P]
        if taps[r, 6]:
            for od in range(oD):
                for oh in range(oH):
                    d = row[(od * oH + oh) * oW:(od * oH + oh + 1) * oW]
                    s = img[base + ((od * sd + d0) * H + oh * sh + h0) * W + w0:]
                    for t in range(oW):
                        d[t] = s[t]
            continue
        for t in range(P):
            row[t] = zero
        for od in range(oD):
            i_d = od * sd + d0
            for oh in range(oH):
                ih = oh * sh + h0
                if 0 <= i_d < D and 0 <= ih < H:
                    d = row[(od * oH + oh) * oW + lo:(od * oH + oh) * oW + hi]
                    s = img[base + (i_d * H + ih) * W + lo * sw + w0:]
                    for t in range(hi - lo):
                        d[t] = s[t * sw]


@jit
def _col2im(geo, taps, col, j0, c0, img):
    """img[c0 + c, input position] += col[(c, kd, kh, kw), j0 + (od, oh, ow)]: the adjoint
    of `_im2col` (padding entries dropped). Accumulates into img."""
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    sd, sh, sw = geo[SD], geo[SH], geo[SW]
    P = oD * oH * oW
    for r in range(taps.shape[0]):
        base = c0 * D * H * W + taps[r, 0]
        d0, h0, w0, lo, hi = taps[r, 1], taps[r, 2], taps[r, 3], taps[r, 4], taps[r, 5]
        row = col[r, j0:j0 + P]
        if taps[r, 6]:
            for od in range(oD):
                for oh in range(oH):
                    s = row[(od * oH + oh) * oW:(od * oH + oh + 1) * oW]
                    d = img[base + ((od * sd + d0) * H + oh * sh + h0) * W + w0:]
                    for t in range(oW):
                        d[t] += s[t]
            continue
        for od in range(oD):
            i_d = od * sd + d0
            for oh in range(oH):
                ih = oh * sh + h0
                if 0 <= i_d < D and 0 <= ih < H:
                    s = row[(od * oH + oh) * oW + lo:(od * oH + oh) * oW + hi]
                    d = img[base + (i_d * H + ih) * W + lo * sw + w0:]
                    for t in range(hi - lo):
                        d[t * sw] += s[t]


@jit
def _gather_cols(Xc, n0, m, Z):
    """Z[o, i * P + j] = Xc[n0 + i, o * P + j] for i < m: a block channel-major."""
    O, J = Z.shape
    P = J // m
    for i in range(m):
        x = Xc[n0 + i]
        for o in range(O):
            z = Z[o, i * P:(i + 1) * P]
            s = x[o * P:(o + 1) * P]
            for j in range(P):
                z[j] = s[j]


@jit
def _scatter_cols(Z, n0, m, Yc, bias, has_bias):
    """Yc[n0 + i, o * P + j] = Z[o, i * P + j] (+ bias[o]) for i < m."""
    O, J = Z.shape
    P = J // m
    for i in range(m):
        y = Yc[n0 + i]
        for o in range(O):
            b = bias[o] if has_bias else Z.dtype.type(0.0)
            z = Z[o, i * P:(i + 1) * P]
            d = y[o * P:(o + 1) * P]
            for j in range(P):
                d[j] = z[j] + b


@jit
def _direct(geo, transposed):
    """Whether the direct path serves this convolution: a `Conv` with stride 1 along W."""
    return not transposed and geo[SW] == 1


@jit
def _per_sample(geo, transposed):
    """Scratch elements per sample of a block (same test as `_direct`, spelled out so that
    `scratch_size` can run it as plain Python)."""
    rows = geo[CI] // geo[GR] * geo[KD] * geo[KH] * geo[KW]
    P = geo[OD] * geo[OH] * geo[OW]
    if not transposed and geo[SW] == 1:
        padded = geo[CI] * (geo[ID] + 2 * geo[PD]) * (geo[IH] + 2 * geo[PH]) \
            * (geo[IW] + 2 * geo[PW])
        return 2 * padded + geo[CO] * P + geo[CO] // geo[GR] * geo[OW]  # (the last: `pack`)
    return (rows + geo[CO]) * P


@jit
def _cols_forward(geo, taps, transposed, X, p, has_bias, Y, scratch):
    """`conv_forward` on the columns path."""
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    Cg, Og = cimg // G, ccol // G
    rows = Cg * geo[KD] * geo[KH] * geo[KW]
    P = geo[OD] * geo[OH] * geo[OW]
    S = geo[ID] * geo[IH] * geo[IW]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    bias = p[ccol * rows:]
    N = X.shape[0]
    nb = max(1, min(N, scratch.shape[0] // _per_sample(geo, transposed)))
    for n0 in range(0, N, nb):
        m = min(nb, N - n0)
        J = m * P
        col = scratch[:rows * J].reshape((rows, J))
        Z = scratch[rows * J:(rows + ccol) * J].reshape((ccol, J))
        if not transposed:
            for g in range(G):
                for i in range(m):
                    _im2col(geo, taps, X[n0 + i], g * Cg, col, i * P)
                gemm_nn(Z[g * Og:(g + 1) * Og], W2[g * Og:(g + 1) * Og], col, False)
            _scatter_cols(Z, n0, m, Y, bias, has_bias)
        else:
            # the layer's output is the image side: col2im of W^T x
            _gather_cols(X, n0, m, Z)
            for i in range(m):
                y = Y[n0 + i]
                for c in range(cimg):
                    bc = bias[c] if has_bias else p.dtype.type(0.0)
                    for j in range(c * S, (c + 1) * S):
                        y[j] = bc
            for g in range(G):
                gemm_nn(col, W2[g * Og:(g + 1) * Og].T, Z[g * Og:(g + 1) * Og], False)
                for i in range(m):
                    _col2im(geo, taps, col, i * P, g * Cg, Y[n0 + i])


@jit
def _cols_pullback(geo, taps, transposed, X, p, has_bias, V, Xbar, want_x, gp, scratch):
    """`conv_pullback` on the columns path."""
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    Cg, Og = cimg // G, ccol // G
    rows = Cg * geo[KD] * geo[KH] * geo[KW]
    P = geo[OD] * geo[OH] * geo[OW]
    S = geo[ID] * geo[IH] * geo[IW]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    gW = gp[:ccol * rows].reshape((ccol, rows))
    zero = p.dtype.type(0.0)
    N = X.shape[0]
    nb = max(1, min(N, scratch.shape[0] // _per_sample(geo, transposed)))
    for n0 in range(0, N, nb):
        m = min(nb, N - n0)
        J = m * P
        col = scratch[:rows * J].reshape((rows, J))
        Z = scratch[rows * J:(rows + ccol) * J].reshape((ccol, J))
        # Z: the column side's cotangent (a Conv) or value (a ConvTranspose's input)
        _gather_cols(V if not transposed else X, n0, m, Z)
        if has_bias:
            if not transposed:
                for o in range(ccol):
                    s = zero
                    z = Z[o]
                    for j in range(J):
                        s += z[j]
                    gp[ccol * rows + o] += s
            else:
                for i in range(m):
                    img = V[n0 + i]
                    for c in range(cimg):
                        s = zero
                        for j in range(c * S, (c + 1) * S):
                            s += img[j]
                        gp[ccol * rows + c] += s
        if want_x and not transposed:
            for i in range(m):
                xb = Xbar[n0 + i]
                for j in range(xb.shape[0]):
                    xb[j] = zero
        for g in range(G):
            zg = Z[g * Og:(g + 1) * Og]
            for i in range(m):
                _im2col(geo, taps, X[n0 + i] if not transposed else V[n0 + i], g * Cg, col,
                        i * P)
            gemm_nt(gW[g * Og:(g + 1) * Og], zg, col)
            if want_x:
                if not transposed:
                    # col no longer needed: it takes the columns' cotangent
                    gemm_nn(col, W2[g * Og:(g + 1) * Og].T, zg, False)
                    for i in range(m):
                        _col2im(geo, taps, col, i * P, g * Cg, Xbar[n0 + i])
                else:
                    # this group's rows of Z are done with: they take its input gradient
                    gemm_nn(zg, W2[g * Og:(g + 1) * Og], col, False)
        if want_x and transposed:
            _scatter_cols(Z, n0, m, Xbar, p, False)


# ------------------------------------------------------------------ the direct path
#
# Stride 1 along W. A block of m samples is held sample-fastest and zero-padded, Ib
# (C, D + 2 pd, H + 2 ph, W + 2 pw, m), so that the input of a tap for one output row
# (all ow, all samples) is one contiguous window of Ib, read in place by the products
# (`gemm_nn_rows`: no unfolding); the column side is held as the feature-major path
# holds it, Zb (G, C'/G, OD * OH, OW * m): each row's product writes a plane
# (`nets.gemm`), and the weight gradient reads an od's planes in one call. The
# conversions from and to the batch-first arrays cost a few percent of the products;
# unfolding LeNet's second convolution cost as much as its product.


@jit
def _pad_block(geo, X, n0, m, Ib):
    """Ib (C, Dp, Hp, Wp, m) = samples n0 .. n0 + m of X (N, C * D * H * W), padded."""
    C, D, H, W = geo[CI], geo[ID], geo[IH], geo[IW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    Dp, Hp, Wp = D + 2 * pd, H + 2 * ph, W + 2 * pw
    if pd or ph or pw:
        for t in range(C * Dp * Hp * Wp * m):
            Ib[t] = 0.0
    # the samples innermost: contiguous writes, m strided reads each
    Xm = X[n0:n0 + m]
    for c in range(C):
        for d in range(D):
            for h in range(H):
                s = ((c * D + d) * H + h) * W
                o = (((c * Dp + d + pd) * Hp + h + ph) * Wp + pw) * m
                for w in range(W):
                    dst = Ib[o + w * m:o + w * m + m]
                    for i in range(m):
                        dst[i] = Xm[i, s + w]


@jit
def _unpad_block(geo, Ib, n0, m, X):
    """X[n0 + i] = the inner part of the padded block Ib, for i < m: `_pad_block` undone."""
    C, D, H, W = geo[CI], geo[ID], geo[IH], geo[IW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    Dp, Hp, Wp = D + 2 * pd, H + 2 * ph, W + 2 * pw
    um = np.uint64(m)
    for i in range(m):
        x = X[n0 + i]
        for c in range(C):
            for d in range(D):
                for h in range(H):
                    s = np.uint64(((c * D + d) * H + h) * W)
                    o = np.uint64((((c * Dp + d + pd) * Hp + h + ph) * Wp + pw) * m + i)
                    for w in range(np.uint64(W)):
                        x[s + w] = Ib[o + w * um]


# The transpose between a block's lines (sample fastest) and the batch-first rows, both
# ways. Eight samples at a time: a sample's rows lie a whole row length apart, often a
# multiple of 4 KiB (conv2's 16 x 8 x 8 floats), and reading all m at once would
# evict them from L1 (8 ways) before the next position; unsigned offsets, because a
# signed index pays a wraparound check at each access (together 3-6x faster).
TILE = 8


@jit
def _block_rows(geo, Zb, n0, m, Y, bias, has_bias, to_rows):
    """Between a block's lines Zb (g, c' - g C'/G, (od, oh), ow * m + i) and rows n0 ..
    n0 + m of the batch-first Y (i, (c', od, oh, ow)): into Y (+ bias) if `to_rows`, else
    into Zb (no bias)."""
    G = geo[GR]
    Og = geo[CO] // G
    L = geo[OD] * geo[OH]
    oW = np.uint64(geo[OW])
    um = np.uint64(m)
    R = np.uint64(Y.shape[1])
    Yf = Y[n0:n0 + m].reshape(-1)
    zero = Y.dtype.type(0.0)
    for i0 in range(0, m, TILE):
        i1 = min(m, i0 + TILE)
        for g in range(G):
            for o in range(Og):
                b = bias[g * Og + o] if has_bias else zero
                for l in range(L):
                    q = np.uint64((g * Og + o) * L + l) * oW * um
                    d = np.uint64((g * Og + o) * L + l) * oW
                    for i in range(np.uint64(i0), np.uint64(i1)):
                        y = i * R + d
                        z = q + i
                        if to_rows:
                            for w in range(oW):
                                Yf[y + w] = Zb[z + w * um] + b
                        else:
                            for w in range(oW):
                                Zb[z + w * um] = Yf[y + w]


@jit
def _direct_blocks(geo, scratch, m):
    """A block's buffers: Ib, its cotangent Xb (both padded images), Zb, and room for a
    plane of Zb (`gemm_tn_rows`' pack)."""
    SP = geo[CI] * (geo[ID] + 2 * geo[PD]) * (geo[IH] + 2 * geo[PH]) * (geo[IW] + 2 * geo[PW])
    nz = geo[CO] * geo[OD] * geo[OH] * geo[OW] * m
    z0 = 2 * SP * m
    pk = geo[CO] // geo[GR] * geo[OW] * m
    return (scratch[:SP * m], scratch[SP * m:z0], scratch[z0:z0 + nz],
            scratch[z0 + nz:z0 + nz + pk])


@jit(inline="always")
def _line_base(geo, g, l, m):
    """Offset in Ib of output row l = (od, oh)'s window origin in group g."""
    Hp, Wp = geo[IH] + 2 * geo[PH], geo[IW] + 2 * geo[PW]
    Dp = geo[ID] + 2 * geo[PD]
    od, oh = l // geo[OH], l % geo[OH]
    return ((g * (geo[CI] // geo[GR]) * Dp + od * geo[SD]) * Hp + oh * geo[SH]) * Wp * m


@jit
def _direct_forward(geo, taps, X, p, has_bias, Y, scratch):
    """`conv_forward` of a `Conv` with stride 1 along W: per block, the products of
    `_direct_products` on the padded block, then into rows with the bias."""
    ccol = geo[CO]
    L = geo[OD] * geo[OH]
    bias = p[ccol * taps.shape[0]:]
    N = X.shape[0]
    nb = max(1, min(N, scratch.shape[0] // _per_sample(geo, False)))
    for n0 in range(0, N, nb):
        m = min(nb, N - n0)
        Ib, _, Zb, _ = _direct_blocks(geo, scratch, m)
        _pad_block(geo, X, n0, m, Ib)
        _direct_products(geo, taps, p, p[:0], Ib, Zb.reshape((ccol, L, geo[OW] * m)), m)
        _block_rows(geo, Zb, n0, m, Y, bias, has_bias, True)


@jit
def _direct_pullback(geo, taps, X, p, has_bias, V, Xbar, want_x, gp, scratch):
    """`conv_pullback` of a `Conv` with stride 1 along W: per block, the bias gradient
    from the rows, then `_direct_pullbacks` on the block's cotangent lines."""
    ccol = geo[CO]
    rows = taps.shape[0]
    L = geo[OD] * geo[OH]
    P = L * geo[OW]
    N = X.shape[0]
    nb = max(1, min(N, scratch.shape[0] // _per_sample(geo, False)))
    for n0 in range(0, N, nb):
        m = min(nb, N - n0)
        Ib, Xb, Zb, pack = _direct_blocks(geo, scratch, m)
        _block_rows(geo, Zb, n0, m, V, gp, False, False)  # (the bias is not read)
        if has_bias:
            for i in range(m):
                v = V[n0 + i]
                for o in range(ccol):
                    gp[ccol * rows + o] += total(v, o * P, P)
        _pad_block(geo, X, n0, m, Ib)
        _direct_pullbacks(geo, taps, p, gp, Ib, Xb, Zb.reshape((ccol, L, geo[OW] * m)), m,
                          want_x, pack)
        if want_x:
            _unpad_block(geo, Xb, n0, m, Xbar)


@jit(inline="always")  # compiled as part of each layout's caller
def _direct_products(geo, taps, p, bias, Ib, Z, m):
    """Z (C', OD * OH, OW * m) = the weights times the taps' windows of the padded input
    Ib (samples innermost, m of them), one product per group and output row, each row
    from bias[c'] (from zero where `bias` is empty): both layouts' forward pass."""
    G = geo[GR]
    ccol = geo[CO]
    Og = ccol // G
    rows = taps.shape[0]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    offs = taps[:, 7]
    for g in range(G):
        Zg = Z[g * Og:(g + 1) * Og]
        bg = bias[g * Og:(g + 1) * Og] if bias.shape[0] else bias
        for l in range(Z.shape[1]):
            gemm_nn_rows((Zg, l), W2[g * Og:(g + 1) * Og], Ib, offs, _line_base(geo, g, l, m),
                         m, np.bool_(False), bg)


@jit(inline="always")
def _direct_pullbacks(geo, taps, p, gp, Ib, Xb, Z, m, want_x, pack):
    """`_direct_products`' pullback for the cotangent Z: the weight gradient added into
    gp, and with `want_x` the padded input's gradient into Xb (overwritten), added into
    the windows in place (`gemm_tn_rows`, its rows packed into `pack`)."""
    G = geo[GR]
    ccol = geo[CO]
    Og = ccol // G
    rows = taps.shape[0]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    gW = gp[:ccol * rows].reshape((ccol, rows))
    offs = taps[:, 7]
    if want_x:
        for t in range(Xb.shape[0]):
            Xb[t] = 0.0
    nh, lstride = geo[OH], geo[SH] * (geo[IW] + 2 * geo[PW]) * m
    for g in range(G):
        Zg = Z[g * Og:(g + 1) * Og]
        for od in range(geo[OD]):  # the rows oh of one od at once, windows lstride apart
            l0 = od * nh
            gemm_nt_rows(gW[g * Og:(g + 1) * Og], Zg[:, l0:l0 + nh], Ib, offs,
                         _line_base(geo, g, l0, m), m, lstride)
        if want_x:
            for l in range(Z.shape[1]):
                gemm_tn_rows(Xb, _line_base(geo, g, l, m), offs, m, W2[g * Og:(g + 1) * Og],
                             (Zg, l), geo[KW], pack)


# -------------------------------------------------------- samples innermost
#
# The lane step (`nets.lanestep`) keeps a run of direct convolutions and poolings in the
# layout the direct path computes in: feature-major, samples innermost (feature f of
# sample i at f * n + i, for n samples). An unpadded input is then the block Ib itself,
# and each output row of the product is a plane of the output (`nets.gemm`'s planes):
# no conversion from or to rows. Padding is copied in runs of a row's W * n.


@jit
def fm_scratch_size(geo, n):
    """Scratch the feature-major kernels need for n samples: the padded input and its
    cotangent (`fm_pad_size`), then room for one output plane (`gemm_tn_rows`' pack)."""
    return fm_pad_size(geo, n) + geo[CO] // geo[GR] * geo[OW] * n


@jit
def fm_pad_size(geo, n):
    """Scratch a padded input of n samples needs in the feature-major kernels (its copy
    and its cotangent's); 0 without padding."""
    if geo[PD] == 0 and geo[PH] == 0 and geo[PW] == 0:
        return 0
    return 2 * geo[CI] * (geo[ID] + 2 * geo[PD]) * (geo[IH] + 2 * geo[PH]) \
        * (geo[IW] + 2 * geo[PW]) * n


@jit
def _fm_pad(geo, X, n, Ib, unpad):
    """Ib (C, Dp, Hp, Wp, n) = X (C, D, H, W, n) with zero borders; with `unpad`, X = the
    inner part of Ib instead."""
    C, D, H, W = geo[CI], geo[ID], geo[IH], geo[IW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    Dp, Hp, Wp = D + 2 * pd, H + 2 * ph, W + 2 * pw
    if not unpad:
        for t in range(C * Dp * Hp * Wp * n):
            Ib[t] = 0.0
    run = W * n
    for c in range(C):
        for d in range(D):
            for h in range(H):
                s = ((c * D + d) * H + h) * run
                o = (((c * Dp + d + pd) * Hp + h + ph) * Wp + pw) * n
                # views from 0: X[s + j] in the loop would keep numba's wraparound of a
                # negative index in it, which LLVM does not vectorise
                inner, padded = X[s:s + run], Ib[o:o + run]
                if unpad:
                    for j in range(run):
                        inner[j] = padded[j]
                else:
                    for j in range(run):
                        padded[j] = inner[j]


@jit
def conv_forward_fm(geo, taps, X, p, has_bias, Y, n, scratch):
    """Y = conv(X) for n samples held feature-major (flat, samples innermost), a `Conv`
    on the direct path (`_direct`); Y overwritten, `scratch` (`fm_scratch_size`) holds the
    padded input, kept for `conv_pullback_fm`."""
    ccol = geo[CO]
    L = geo[OD] * geo[OH]
    half = fm_pad_size(geo, n) // 2
    Ib = X
    if half:
        Ib = scratch[:half]
        _fm_pad(geo, X, n, Ib, False)
    # the products start from the bias (or zero): no pass over Y of its own
    b0 = ccol * taps.shape[0]
    bias = p[b0:b0 + ccol] if has_bias else p[:0]
    Z = Y[:ccol * L * geo[OW] * n].reshape((ccol, L, geo[OW] * n))
    _direct_products(geo, taps, p, bias, Ib, Z, n)


@jit
def conv_pullback_fm(geo, taps, X, p, has_bias, V, Xbar, want_x, gp, n, scratch):
    """`conv_forward_fm`'s pullback: gp += V^T dY/dp, Xbar = V^T dY/dX if `want_x`
    (overwritten), all feature-major; the padded input as the forward left it in
    `scratch`."""
    ccol = geo[CO]
    rows = taps.shape[0]
    L = geo[OD] * geo[OH]
    P = L * geo[OW] * n
    if has_bias:
        for o in range(ccol):
            gp[ccol * rows + o] += total(V, o * P, P)
    half = fm_pad_size(geo, n) // 2
    Ib, Xb = X, Xbar
    if half:
        Ib, Xb = scratch[:half], scratch[half:2 * half]
    pack = scratch[2 * half:2 * half + ccol // geo[GR] * geo[OW] * n]
    Z = V[:ccol * P].reshape((ccol, L, geo[OW] * n))
    _direct_pullbacks(geo, taps, p, gp, Ib, Xb, Z, n, want_x, pack)
    if want_x and half:
        _fm_pad(geo, Xbar, n, Xb, True)


@jit
def conv_forward(geo, taps, transposed, X, p, has_bias, Y, scratch):
    """Y = conv(X) (or its transpose) for every row: X (N, in), Y (N, out), flat per
    sample; Y overwritten, `scratch` (`scratch_size`) holds a block's buffers."""
    if _direct(geo, transposed):
        _direct_forward(geo, taps, X, p, has_bias, Y, scratch)
    else:
        _cols_forward(geo, taps, transposed, X, p, has_bias, Y, scratch)


@jit
def conv_pullback(geo, taps, transposed, X, p, has_bias, V, Xbar, want_x, gp, scratch):
    """gp += V^T dY/dp over the rows; Xbar = V^T dY/dX if `want_x` (overwritten).
    V is read only; `scratch` holds a block's buffers."""
    if _direct(geo, transposed):
        _direct_pullback(geo, taps, X, p, has_bias, V, Xbar, want_x, gp, scratch)
    else:
        _cols_pullback(geo, taps, transposed, X, p, has_bias, V, Xbar, want_x, gp, scratch)


__all__ = ["Conv", "ConvTranspose", "conv_forward", "conv_pullback", "conv_forward_fm",
           "conv_pullback_fm", "fm_pad_size", "fm_scratch_size", "scratch_size"]
