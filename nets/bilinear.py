"""`Bilinear`: ``y_o = x1^T W_o x2 + b_o`` (PyTorch's ``Bilinear``), on the concatenation
``[x1, x2]`` of its two inputs so that it fits a chain of one-input layers."""

import math
from dataclasses import dataclass

from ._config import jit
from .layers import Layer, _shape, check_activation, check_positive_int


@jit
def bilinear_forward(X, p, n1, nout, has_bias, Y):
    """Y[r, o] = X[r, :n1] @ W[o] @ X[r, n1:] + b[o]; W (out, n1, n2) row-major in p."""
    R, n = X.shape
    n2 = n - n1
    for r in range(R):
        x = X[r]
        for o in range(nout):
            acc = p[nout * n1 * n2 + o] if has_bias else 0.0
            for i in range(n1):
                w = p[(o * n1 + i) * n2:(o * n1 + i + 1) * n2]
                s = 0.0
                for j in range(n2):
                    s += w[j] * x[n1 + j]
                acc += x[i] * s
            Y[r, o] = acc


@jit
def bilinear_pullback(X, p, n1, nout, has_bias, V, Xbar, want_x, pbar):
    """pbar += the gradients of sum(V * Y) (weight, then bias); Xbar = V^T dY/dX
    (overwritten) if `want_x`."""
    R, n = X.shape
    n2 = n - n1
    for r in range(R):
        x, v, xb = X[r], V[r], Xbar[r]
        if want_x:
            for k in range(n):
                xb[k] = 0.0
        for o in range(nout):
            vo = v[o]
            if has_bias:
                pbar[nout * n1 * n2 + o] += vo
            for i in range(n1):
                base = (o * n1 + i) * n2
                a = vo * x[i]
                s = 0.0
                for j in range(n2):
                    pbar[base + j] += a * x[n1 + j]
                    if want_x:
                        s += p[base + j] * x[n1 + j]
                        xb[n1 + j] += a * p[base + j]
                if want_x:
                    xb[i] += vo * s


@dataclass(frozen=True)
class Bilinear(Layer):
    """``y = act(x1^T W x2 + b)`` on a sample ``[x1, x2]`` (the two inputs concatenated).

    Parameters
    ----------
    in1 : int
        Length of x1 (PyTorch's ``in1_features``); x2 is the rest of the sample.
    out : int
        Outputs (``out_features``).
    activation : str, default "identity"
    bias : bool

    Parameters in the flat vector: ``weight`` (out, in1, in2), then ``bias`` (out,), as
    PyTorch stores them, initialised uniform in +-1/sqrt(in1) as PyTorch does. The
    kernels overwrite ``y`` / ``xbar`` and add into ``pbar``; no scratch.
    """

    in1: int
    out: int
    activation: str = "identity"
    bias: bool = True

    def __post_init__(self):
        check_positive_int("Bilinear", "in1", self.in1)
        check_positive_int("Bilinear", "out", self.out)
        object.__setattr__(self, "activation", check_activation("Bilinear", self.activation))

    def _in2(self, in_shape):
        in_shape = _shape(in_shape)
        if len(in_shape) != 1 or in_shape[0] <= self.in1:
            raise ValueError(f"Bilinear: takes vectors [x1 ({self.in1}), x2 (at least 1)], "
                             f"got input shape {in_shape}")
        return in_shape[0] - self.in1

    def out_shape(self, in_shape):
        self._in2(in_shape)
        return (self.out,)

    def param_shapes(self, in_shape):
        shapes = (("weight", (self.out, self.in1, self._in2(in_shape))),)
        return shapes + ((("bias", (self.out,)),) if self.bias else ())

    def init_params(self, in_shape, arrays, rng):
        bound = 1.0 / math.sqrt(self.in1)
        for a in arrays.values():
            a[...] = rng.uniform(-bound, bound, size=a.shape)

    def forward(self, ctx, x, y, p, s, scratch):
        bilinear_forward(x, p, self.in1, self.out, self.bias, y)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        want = xbar is not None
        bilinear_pullback(x, p, self.in1, self.out, self.bias, ybar, xbar if want else x,
                          want, pbar)

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        x1, x2 = x[:, :self.in1], x[:, self.in1:]
        y = jnp.einsum("ni,oij,nj->no", x1, params["weight"], x2)
        return y + params["bias"] if self.bias else y
