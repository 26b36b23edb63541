"""Convolutions: `Conv` and `ConvTranspose` in 1, 2 and 3 dimensions, and their kernels.

One kernel family serves every dimension, stride, padding, dilation and group count:
a 1-D or 2-D convolution is a 3-D one with leading spatial sizes 1, and the geometry
is runtime data (an int64 vector `geo`, see `_geometry`), so each dtype compiles once.

Per sample and group, a convolution is a product of the weight matrix ``(out, in/groups *
prod(kernel))`` with the input's taps (`nets.gemm`). With stride 1 (the common case) the
taps are windows of the zero-padded input itself, read in place (`gemm_nn_rows`: no
unfolding), and the product is a "wide" output over the padded positions whose valid
entries are then copied out; its input gradient adds each tap's row back at its offset.
With other strides the input is unfolded into columns first (im2col) and folded back
(col2im). A transposed convolution is the same pieces with the roles of input and output
exchanged: its forward is a convolution's input gradient, its input gradient a
convolution's forward.

The kernels run on one thread over the rows they are given (the chain threads over
the batch, see `nets.layers.Layer`).
"""

import math
from dataclasses import dataclass

import numpy as np

from ._config import jit
from .gemm import gemm_nn, gemm_nn_rows, gemm_nt, gemm_nt_rows
from .layers import Layer, _shape, check_activation, check_positive_int, torch_uniform

# Positions in `geo`: the convolution's input ("image") side, its output ("column") side,
# kernel, stride, padding, dilation, groups.
# XD, XH, XW: the padded image; JW: the length of a "wide" output row (see `_wide_*`).
CI, ID, IH, IW, CO, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, GR, \
    XD, XH, XW, JW = range(25)


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
        check_activation(name, self.activation)

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
        return scratch_size(self._geo(_shape(in_shape))[0])

    def forward(self, ctx, x, y, p, s, scratch):
        geo, offs = self._geo(x.shape[1:])
        N = x.shape[0]
        conv_forward(geo, offs, self._transposed, x.reshape(N, -1), p, self.bias,
                     y.reshape(N, -1), scratch)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        geo, offs = self._geo(x.shape[1:])
        N = x.shape[0]
        want_x = xbar is not None
        xb = xbar.reshape(N, -1) if want_x else x.reshape(N, -1)[:0]
        conv_pullback(geo, offs, self._transposed, x.reshape(N, -1), p, self.bias,
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
_LAYER_GEO = {}  # (layer, input shape) -> (geo, offs)


def _geometry(img_shape, col_shape, kernel, stride, padding, dilation, groups):
    """(`geo`, `offs`) of a convolution from image (C, *sp) to columns (C', *sp'), made once
    per shape: `geo` the int64 geometry vector, `offs` the offsets of the kernel taps in
    the padded image (for stride 1: see `_wide`)."""
    key = (tuple(img_shape), tuple(col_shape), kernel, stride, padding, dilation, groups)
    if key not in _GEO:
        ci, *isp = img_shape
        co, *osp = col_shape
        isp, osp, k = _pad3(isp, 1), _pad3(osp, 1), _pad3(kernel, 1)
        pad, dil = _pad3(padding, 0), _pad3(dilation, 1)
        Dp, Hp, Wp = (n + 2 * p for n, p in zip(isp, pad))
        jw = (osp[0] - 1) * Hp * Wp + (osp[1] - 1) * Wp + osp[2]
        geo = np.array([ci, *isp, co, *osp, *k, *_pad3(stride, 1), *pad, *dil, groups,
                        Dp, Hp, Wp, jw], dtype=np.int64)
        cg = ci // groups
        c, kd, kh, kw = np.meshgrid(np.arange(cg), np.arange(k[0]), np.arange(k[1]),
                                    np.arange(k[2]), indexing="ij")
        offs = (c * Dp * Hp * Wp + kd * dil[0] * Hp * Wp + kh * dil[1] * Wp
                + kw * dil[2]).ravel().astype(np.int64)
        _GEO[key] = (geo, offs)
    return _GEO[key]


def scratch_size(geo):
    """Stride 1: the padded image and its cotangent, two wide outputs, the taps' cotangent;
    otherwise: the unfolded columns and their cotangent."""
    rows = geo[CI] // geo[GR] * geo[KD] * geo[KH] * geo[KW]
    if _wide(geo):
        return int(2 * geo[CI] * geo[XD] * geo[XH] * geo[XW] + (2 * geo[CO] + rows) * geo[JW])
    return int(2 * rows * geo[OD] * geo[OH] * geo[OW])


def _wide(geo):
    return geo[SD] == 1 and geo[SH] == 1 and geo[SW] == 1


# ------------------------------------------------------------------- the kernels


@jit
def _im2col(geo, img, c0, col):
    """col[(c, kd, kh, kw), (od, oh, ow)] = img[c0 + c, input position] (0 in the padding).

    img: one sample's image side, flat (C * D * H * W); col: (rows, positions), overwritten.
    """
    Cg = geo[CI] // geo[GR]
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    kD, kH, kW = geo[KD], geo[KH], geo[KW]
    sd, sh, sw = geo[SD], geo[SH], geo[SW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    dd, dh, dw = geo[DD], geo[DH], geo[DW]
    zero = col.dtype.type(0.0)
    r = 0
    for c in range(Cg):
        src = img[(c0 + c) * D * H * W:(c0 + c + 1) * D * H * W]
        for kd in range(kD):
            for kh in range(kH):
                for kw in range(kW):
                    row = col[r]
                    r += 1
                    iw0 = kw * dw - pw
                    # output columns whose input column is inside: lo <= ow < hi
                    lo = min(oW, max(0, (-iw0 + sw - 1) // sw))
                    hi = max(lo, min(oW, (W - 1 - iw0) // sw + 1)) if W - 1 - iw0 >= 0 else lo
                    for od in range(oD):
                        i_d = od * sd + kd * dd - pd
                        for oh in range(oH):
                            ih = oh * sh + kh * dh - ph
                            dst = row[(od * oH + oh) * oW:(od * oH + oh + 1) * oW]
                            if i_d < 0 or i_d >= D or ih < 0 or ih >= H:
                                for ow in range(oW):
                                    dst[ow] = zero
                                continue
                            line = src[(i_d * H + ih) * W:(i_d * H + ih + 1) * W]
                            for ow in range(lo):
                                dst[ow] = zero
                            if sw == 1:
                                for ow in range(lo, hi):
                                    dst[ow] = line[ow + iw0]
                            else:
                                for ow in range(lo, hi):
                                    dst[ow] = line[ow * sw + iw0]
                            for ow in range(hi, oW):
                                dst[ow] = zero


@jit
def _col2im(geo, col, c0, img):
    """img[c0 + c, input position] += col[(c, kd, kh, kw), (od, oh, ow)]: the adjoint of
    `_im2col` (padding entries dropped). Accumulates into img."""
    Cg = geo[CI] // geo[GR]
    D, H, W = geo[ID], geo[IH], geo[IW]
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    kD, kH, kW = geo[KD], geo[KH], geo[KW]
    sd, sh, sw = geo[SD], geo[SH], geo[SW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    dd, dh, dw = geo[DD], geo[DH], geo[DW]
    r = 0
    for c in range(Cg):
        dst = img[(c0 + c) * D * H * W:(c0 + c + 1) * D * H * W]
        for kd in range(kD):
            for kh in range(kH):
                for kw in range(kW):
                    row = col[r]
                    r += 1
                    iw0 = kw * dw - pw
                    lo = min(oW, max(0, (-iw0 + sw - 1) // sw))
                    hi = max(lo, min(oW, (W - 1 - iw0) // sw + 1)) if W - 1 - iw0 >= 0 else lo
                    for od in range(oD):
                        i_d = od * sd + kd * dd - pd
                        if i_d < 0 or i_d >= D:
                            continue
                        for oh in range(oH):
                            ih = oh * sh + kh * dh - ph
                            if ih < 0 or ih >= H:
                                continue
                            src = row[(od * oH + oh) * oW:(od * oH + oh + 1) * oW]
                            line = dst[(i_d * H + ih) * W:(i_d * H + ih + 1) * W]
                            if sw == 1:
                                for ow in range(lo, hi):
                                    line[ow + iw0] += src[ow]
                            else:
                                for ow in range(lo, hi):
                                    line[ow * sw + iw0] += src[ow]


@jit
def _forward_block(geo, transposed, X, p, has_bias, Y, buf, a, b):
    """Samples a:b of the forward pass on one thread (its scratch `buf`)."""
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    rows = cimg // G * geo[KD] * geo[KH] * geo[KW]
    P = geo[OD] * geo[OH] * geo[OW]
    S = geo[ID] * geo[IH] * geo[IW]
    Og = ccol // G
    W2 = p[:ccol * rows].reshape((ccol, rows))
    col = buf[:rows * P].reshape((rows, P))
    for n in range(a, b):
        if not transposed:
            z = Y[n].reshape((ccol, P))
            for o in range(ccol):
                bo = p[ccol * rows + o] if has_bias else p.dtype.type(0.0)
                zo = z[o]
                for j in range(P):
                    zo[j] = bo
            for g in range(G):
                _im2col(geo, X[n], g * (cimg // G), col)
                gemm_nn(z[g * Og:(g + 1) * Og], W2[g * Og:(g + 1) * Og], col, True)
        else:
            # the layer's output is the image side: col2im of W^T x
            y = Y[n]
            for c in range(cimg):
                bc = p[ccol * rows + c] if has_bias else p.dtype.type(0.0)
                for j in range(c * S, (c + 1) * S):
                    y[j] = bc
            x = X[n].reshape((ccol, P))
            for g in range(G):
                gemm_nn(col, W2[g * Og:(g + 1) * Og].T, x[g * Og:(g + 1) * Og], False)
                _col2im(geo, col, g * (cimg // G), y)


@jit
def _pullback_block(geo, transposed, X, p, has_bias, V, Xbar, want_x, gp, buf, a, b):
    """Samples a:b of the pullback on one thread: gp += parameter cotangent; Xbar written."""
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    rows = cimg // G * geo[KD] * geo[KH] * geo[KW]
    P = geo[OD] * geo[OH] * geo[OW]
    S = geo[ID] * geo[IH] * geo[IW]
    Og = ccol // G
    Cg = cimg // G
    W2 = p[:ccol * rows].reshape((ccol, rows))
    gW = gp[:ccol * rows].reshape((ccol, rows))
    col = buf[:rows * P].reshape((rows, P))
    dcol = buf[rows * P:2 * rows * P].reshape((rows, P))
    zero = p.dtype.type(0.0)
    for n in range(a, b):
        if not transposed:
            # V[n]: dL/dz (ccol, P); X[n]: image
            dz = V[n].reshape((ccol, P))
            img = X[n]
            if has_bias:
                for o in range(ccol):
                    s = zero
                    d = dz[o]
                    for j in range(P):
                        s += d[j]
                    gp[ccol * rows + o] += s
            if want_x:
                xb = Xbar[n]
                for j in range(xb.shape[0]):
                    xb[j] = zero
        else:
            # V[n]: dL/dy, the image side; X[n]: the columns' side (ccol, P)
            dz = X[n].reshape((ccol, P))
            img = V[n]
            if has_bias:
                for c in range(cimg):
                    s = zero
                    for j in range(c * S, (c + 1) * S):
                        s += img[j]
                    gp[ccol * rows + c] += s
        for g in range(G):
            _im2col(geo, img, g * Cg, col)
            gemm_nt(gW[g * Og:(g + 1) * Og], dz[g * Og:(g + 1) * Og], col)
            if want_x:
                if not transposed:
                    gemm_nn(dcol, W2[g * Og:(g + 1) * Og].T, dz[g * Og:(g + 1) * Og], False)
                    _col2im(geo, dcol, g * Cg, Xbar[n])
                else:
                    xb = Xbar[n].reshape((ccol, P))
                    gemm_nn(xb[g * Og:(g + 1) * Og], W2[g * Og:(g + 1) * Og], col, False)


# ------------------------------------------------------- stride 1: the wide path
#
# With stride 1, output position (od, oh, ow) of tap k reads the padded image at
# j + offs[k], where j = (od * XH + oh) * XW + ow is the position in the padded image's
# index space. So the taps are windows of the padded image itself (no unfolding): the
# kernels compute a "wide" output over j in 0..JW-1 (`gemm_nn_rows`), whose entries at
# oh >= OH or ow >= OW are discarded, and the input gradient adds each tap's row back
# at its offset.


@jit
def _pad(geo, img, ipad):
    """ipad = img zero-padded, (C, xd, xh, xw) flat."""
    C, D, H, W = geo[CI], geo[ID], geo[IH], geo[IW]
    xd, xh, xw = geo[XD], geo[XH], geo[XW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    if pd == 0 and ph == 0 and pw == 0:
        for i in range(C * D * H * W):
            ipad[i] = img[i]
        return
    for i in range(C * xd * xh * xw):
        ipad[i] = 0.0
    for c in range(C):
        for d in range(D):
            for h in range(H):
                src = ((c * D + d) * H + h) * W
                dst = ((c * xd + d + pd) * xh + h + ph) * xw + pw
                for w in range(W):
                    ipad[dst + w] = img[src + w]


@jit
def _unpad(geo, dpad, img, bias, has_bias):
    """img (C, D, H, W) = the inner part of dpad (+ bias per channel), overwritten."""
    C, D, H, W = geo[CI], geo[ID], geo[IH], geo[IW]
    xd, xh, xw = geo[XD], geo[XH], geo[XW]
    pd, ph, pw = geo[PD], geo[PH], geo[PW]
    for c in range(C):
        b = bias[c] if has_bias else img.dtype.type(0.0)
        for d in range(D):
            for h in range(H):
                dst = ((c * D + d) * H + h) * W
                src = ((c * xd + d + pd) * xh + h + ph) * xw + pw
                for w in range(W):
                    img[dst + w] = dpad[src + w] + b


@jit
def _from_wide(geo, zw, z, bias, has_bias):
    """z (C', OD, OH, OW) flat = the valid entries of the wide zw (C', JW) (+ bias)."""
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    xh, xw = geo[XH], geo[XW]
    for o in range(geo[CO]):
        b = bias[o] if has_bias else z.dtype.type(0.0)
        src = zw[o]
        for d in range(oD):
            for h in range(oH):
                dst = ((o * oD + d) * oH + h) * oW
                at = (d * xh + h) * xw
                for w in range(oW):
                    z[dst + w] = src[at + w] + b


@jit
def _to_wide(geo, z, zw):
    """zw (C', JW) = z (C', OD, OH, OW) at its wide positions, 0 elsewhere."""
    oD, oH, oW = geo[OD], geo[OH], geo[OW]
    xh, xw = geo[XH], geo[XW]
    for o in range(geo[CO]):
        dst = zw[o]
        for j in range(dst.shape[0]):
            dst[j] = 0.0
        for d in range(oD):
            for h in range(oH):
                src = ((o * oD + d) * oH + h) * oW
                at = (d * xh + h) * xw
                for w in range(oW):
                    dst[at + w] = z[src + w]


@jit
def _add_rows(dcol, dpad, offs, base):
    """dpad[base + offs[k] + j] += dcol[k, j]: the taps' cotangents back onto the image."""
    J = dcol.shape[1]
    for k in range(dcol.shape[0]):
        dst = dpad[base + offs[k]:base + offs[k] + J]
        src = dcol[k]
        for j in range(J):
            dst[j] += src[j]


@jit
def _wide_forward(geo, offs, transposed, X, p, has_bias, Y, buf):
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    Cg, Og = cimg // G, ccol // G
    rows = Cg * geo[KD] * geo[KH] * geo[KW]
    J = geo[JW]
    SP = geo[XD] * geo[XH] * geo[XW]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    bias = p[ccol * rows:]
    ipad = buf[:cimg * SP]
    zw = buf[cimg * SP:cimg * SP + ccol * J].reshape((ccol, J))
    dcol = buf[cimg * SP + 2 * ccol * J:cimg * SP + (2 * ccol + rows) * J].reshape((rows, J))
    dpad = buf[cimg * SP + (2 * ccol + rows) * J:2 * cimg * SP + (2 * ccol + rows) * J]
    for n in range(X.shape[0]):
        if not transposed:
            _pad(geo, X[n], ipad)
            for g in range(G):
                gemm_nn_rows(zw[g * Og:(g + 1) * Og], W2[g * Og:(g + 1) * Og], ipad, offs,
                             g * Cg * SP, False)
            _from_wide(geo, zw, Y[n], bias, has_bias)
        else:
            _to_wide(geo, X[n], zw)
            for i in range(cimg * SP):
                dpad[i] = 0.0
            for g in range(G):
                gemm_nn(dcol, W2[g * Og:(g + 1) * Og].T, zw[g * Og:(g + 1) * Og], False)
                _add_rows(dcol, dpad, offs, g * Cg * SP)
            _unpad(geo, dpad, Y[n], bias, has_bias)


@jit
def _wide_pullback(geo, offs, transposed, X, p, has_bias, V, Xbar, want_x, gp, buf):
    G = geo[GR]
    cimg, ccol = geo[CI], geo[CO]
    Cg, Og = cimg // G, ccol // G
    rows = Cg * geo[KD] * geo[KH] * geo[KW]
    J = geo[JW]
    SP = geo[XD] * geo[XH] * geo[XW]
    S = geo[ID] * geo[IH] * geo[IW]
    P = geo[OD] * geo[OH] * geo[OW]
    W2 = p[:ccol * rows].reshape((ccol, rows))
    gW = gp[:ccol * rows].reshape((ccol, rows))
    ipad = buf[:cimg * SP]
    zw = buf[cimg * SP:cimg * SP + ccol * J].reshape((ccol, J))
    zw2 = buf[cimg * SP + ccol * J:cimg * SP + 2 * ccol * J].reshape((ccol, J))
    dcol = buf[cimg * SP + 2 * ccol * J:cimg * SP + (2 * ccol + rows) * J].reshape((rows, J))
    dpad = buf[cimg * SP + (2 * ccol + rows) * J:2 * cimg * SP + (2 * ccol + rows) * J]
    zero = p.dtype.type(0.0)
    for n in range(X.shape[0]):
        if not transposed:
            img, cols = X[n], V[n]
        else:
            img, cols = V[n], X[n]
        if has_bias:
            if not transposed:
                for o in range(ccol):
                    s = zero
                    for j in range(o * P, (o + 1) * P):
                        s += cols[j]
                    gp[ccol * rows + o] += s
            else:
                for c in range(cimg):
                    s = zero
                    for j in range(c * S, (c + 1) * S):
                        s += img[j]
                    gp[ccol * rows + c] += s
        _pad(geo, img, ipad)
        _to_wide(geo, cols, zw)
        for g in range(G):
            gemm_nt_rows(gW[g * Og:(g + 1) * Og], zw[g * Og:(g + 1) * Og], ipad, offs,
                         g * Cg * SP)
        if not want_x:
            continue
        if not transposed:
            for i in range(cimg * SP):
                dpad[i] = 0.0
            for g in range(G):
                gemm_nn(dcol, W2[g * Og:(g + 1) * Og].T, zw[g * Og:(g + 1) * Og], False)
                _add_rows(dcol, dpad, offs, g * Cg * SP)
            _unpad(geo, dpad, Xbar[n], p, False)
        else:
            for g in range(G):
                gemm_nn_rows(zw2[g * Og:(g + 1) * Og], W2[g * Og:(g + 1) * Og], ipad, offs,
                             g * Cg * SP, False)
            _from_wide(geo, zw2, Xbar[n], p, False)


@jit
def conv_forward(geo, offs, transposed, X, p, has_bias, Y, scratch):
    """Y = conv(X) (or its transpose) for every row: X (N, in), Y (N, out), flat per
    sample; Y overwritten, `scratch` (`scratch_size`) used for the columns."""
    if geo[SD] == 1 and geo[SH] == 1 and geo[SW] == 1:
        _wide_forward(geo, offs, transposed, X, p, has_bias, Y, scratch)
    else:
        _forward_block(geo, transposed, X, p, has_bias, Y, scratch, 0, X.shape[0])


@jit
def conv_pullback(geo, offs, transposed, X, p, has_bias, V, Xbar, want_x, pbar, scratch):
    """pbar += V^T dY/dp over the rows; Xbar = V^T dY/dX if `want_x` (overwritten).
    V is read only; `scratch` holds the columns and their cotangent."""
    if geo[SD] == 1 and geo[SH] == 1 and geo[SW] == 1:
        _wide_pullback(geo, offs, transposed, X, p, has_bias, V, Xbar, want_x, pbar, scratch)
    else:
        _pullback_block(geo, transposed, X, p, has_bias, V, Xbar, want_x, pbar, scratch, 0,
                        X.shape[0])


__all__ = ["Conv", "ConvTranspose", "conv_forward", "conv_pullback", "scratch_size"]
