"""Activation functions: names, numba scalar kernels and a row-wise dispatcher.

Each activation is a pair of scalar functions of the pre-activation `z`:
its value and its derivative. Kernels apply them to a contiguous row of a
buffer, overwriting `z` with the value and writing the derivative beside it,
so the backward pass is a plain multiply whatever the activation.

libm `tanh` is a scalar call that blocks vectorisation (~9 ns each: 50 of
them were most of a 2-50-2 network's forward pass), so `tanh` is computed
inline by branch-free formulas that vectorise: float32 by a rational
approximation (max error a few ulp in float32); float64 by Cephes' odd
rational for |x| < 0.625 and ``1 - 2 / (exp(2|x|) + 1)`` beyond, with an
inline exp (Cody-Waite reduction, a Taylor polynomial, 2**n from the bits of
n) and one division for both branches: within 2 ulp of numpy's tanh (tested
on a dense grid), ~5x faster than libm over a row of 50.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import types
from numba.extending import overload

from ._bits import bits_to_float, float_to_bits
from ._config import jit

# Codes are part of the compiled kernels: append, never reorder.
BUILTIN = ("identity", "tanh", "sigmoid", "relu", "softplus", "gelu", "silu", "elu", "rbf")
CODES = {name: i for i, name in enumerate(BUILTIN)}

_GELU_C = math.sqrt(2.0 / math.pi)


def _tanh_stub(x):
    return math.tanh(x)


# Coefficients of the odd/even minimax rational approximation of tanh on
# [-7.905, 7.905] used by Eigen's float path (Eigen: ptanh_float); outside
# that interval tanh rounds to +-1 in float32.
_A = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
      5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
      -2.76076847742355e-16)
_B = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
      1.19825839466702e-06)


# float64: Cephes' odd rational for tanh on |x| < 0.625 (S. L. Moshier, Cephes Math
# Library, tanh.c); beyond, 1 - 2 / (exp(2|x|) + 1) with exp by Cody-Waite reduction
# and its Taylor polynomial to degree 13 (|r| <= ln2/2: truncation < 4e-18).
_TP = (-9.64399179425052238628E-1, -9.92877231001918586564E1, -1.61468768441708447952E3)
_TQ = (1.12811678491632931402E2, 2.23548839060100448583E3, 4.84406305325125486048E3)
_LOG2E = 1.4426950408889634073599
_LN2_HI, _LN2_LO = 6.93145751953125E-1, 1.42860682030941723212E-6
_EXP_TAYLOR = tuple(1.0 / math.factorial(i) for i in range(14))
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52
_SHIFTER_BITS = 0x4338000000000000


@jit(inline="always")
def _tanh64(x):
    # Both branches are computed and the result selected, with one division for both
    # (a + b / c): branch-free, so a loop over a row vectorises.
    p0, p1, p2 = _TP
    q0, q1, q2 = _TQ
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13 = _EXP_TAYLOR
    a = abs(x)
    z = x * x
    # Not clamped at 40 (where tanh rounds to 1): callers' `1 + tanh(x)` may be
    # reassociated (fastmath) into 2 / (s + 1) and must stay accurate down to ~1e-308.
    # From 710 on, 2**n overflows to inf and the result is exactly +-1.
    y = min(2.0 * a, 710.0)
    n = math.floor(y * _LOG2E + 0.5)
    r = y - n * _LN2_HI
    r = r - n * _LN2_LO
    e = c0 + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * (c7 + r * (
        c8 + r * (c9 + r * (c10 + r * (c11 + r * (c12 + r * c13))))))))))))
    # 2**n from the bits of n: adding 1.5 * 2**52 puts the integer n in the low bits
    # (no float-to-int conversion, which AVX2 cannot vectorise)
    k = float_to_bits(n + _SHIFTER) - _SHIFTER_BITS
    s = e * bits_to_float((k + 1023) << 52)  # exp(y); 0 <= n <= 1024 (inf)
    sg = math.copysign(1.0, x)
    small = a < 0.625
    # every operand computed first: the selects then stay selects (no branches)
    num_s = x * z * ((p0 * z + p1) * z + p2)
    den_s = ((z + q0) * z + q1) * z + q2
    num_b = -2.0 * sg
    den_b = s + 1.0
    num0 = x if small else sg
    num1 = num_s if small else num_b
    den = den_s if small else den_b
    return num0 + num1 / den


@overload(_tanh_stub, jit_options=dict(fastmath=True, error_model="numpy"))
def _tanh_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:
        a0, a1, a2, a3, a4, a5, a6 = (np.float32(c) for c in _A)
        b0, b1, b2, b3 = (np.float32(c) for c in _B)
        lim = np.float32(7.90531110763549805)

        def impl(x):
            x = min(max(x, -lim), lim)
            x2 = x * x
            num = x * (a0 + x2 * (a1 + x2 * (a2 + x2 * (a3 + x2 * (a4 + x2 * (a5 + x2 * a6))))))
            den = b0 + x2 * (b1 + x2 * (b2 + x2 * b3))
            return num / den

        return impl
    if isinstance(x, types.Float) and x.bitwidth == 64:
        return lambda x: _tanh64(x)
    return lambda x: math.tanh(x)


@jit(inline="always")
def tanh(x):
    """tanh, vectorisable: rational approximation in float32, Cephes formulas in float64."""
    return _tanh_stub(x)


@jit(inline="always")
def sigmoid(x):
    # Two branches keep exp's argument non-positive: no overflow.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@jit
def activate_row(code, buf, zo, do, n, need_d):
    """Apply activation `code` to buf[zo:zo+n] in place; derivative to buf[do:do+n].

    The branch on `code` sits outside the element loops so each loop is a
    straight vectorisable body.
    """
    z = buf[zo:zo + n]
    d = buf[do:do + n]
    one = buf.dtype.type(1.0)
    if code == 0:  # identity
        if need_d:
            for j in range(n):
                d[j] = one
    elif code == 1:  # tanh
        for j in range(n):
            z[j] = tanh(z[j])
        if need_d:
            for j in range(n):
                d[j] = one - z[j] * z[j]
    elif code == 2:  # sigmoid
        for j in range(n):
            z[j] = sigmoid(z[j])
        if need_d:
            for j in range(n):
                d[j] = z[j] * (one - z[j])
    elif code == 3:  # relu
        for j in range(n):
            if need_d:
                d[j] = one if z[j] > 0 else 0
            z[j] = max(z[j], 0)
    elif code == 4:  # softplus
        for j in range(n):
            x = z[j]
            if need_d:
                d[j] = sigmoid(x)
            z[j] = math.log1p(math.exp(-abs(x))) + max(x, 0)
    elif code == 5:  # gelu, tanh form (the default in JAX and Flux)
        for j in range(n):
            x = z[j]
            t = tanh(_GELU_C * (x + 0.044715 * x * x * x))
            if need_d:
                d[j] = 0.5 * (one + t) + 0.5 * x * (one - t * t) * _GELU_C * (
                    one + 3 * 0.044715 * x * x)
            z[j] = 0.5 * x * (one + t)
    elif code == 6:  # silu
        for j in range(n):
            x = z[j]
            s = sigmoid(x)
            if need_d:
                d[j] = s * (one + x * (one - s))
            z[j] = x * s
    elif code == 7:  # elu, alpha = 1
        for j in range(n):
            x = z[j]
            v = x if x > 0 else math.expm1(x)
            if need_d:
                d[j] = one if x > 0 else v + one
            z[j] = v
    elif code == 8:  # rbf
        for j in range(n):
            x = z[j]
            v = math.exp(-x * x)
            if need_d:
                d[j] = -2 * x * v
            z[j] = v


def reference(name, z):
    """Plain numpy value and derivative of a builtin activation (for tests)."""
    z = np.asarray(z, dtype=np.float64)
    s = 1.0 / (1.0 + np.exp(-z))
    if name == "identity":
        return z.copy(), np.ones_like(z)
    if name == "tanh":
        t = np.tanh(z)
        return t, 1 - t**2
    if name == "sigmoid":
        return s, s * (1 - s)
    if name == "relu":
        return np.maximum(z, 0), (z > 0).astype(float)
    if name == "softplus":
        return np.logaddexp(0, z), s
    if name == "gelu":
        t = np.tanh(_GELU_C * (z + 0.044715 * z**3))
        return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * _GELU_C * (
            1 + 3 * 0.044715 * z**2)
    if name == "silu":
        return z * s, s * (1 + z * (1 - s))
    if name == "elu":
        v = np.where(z > 0, z, np.expm1(np.minimum(z, 0)))
        return v, np.where(z > 0, 1.0, v + 1)
    if name == "rbf":
        v = np.exp(-z**2)
        return v, -2 * z * v
    raise KeyError(name)


# ---------------------------------------------------------------- formulas
#
# Each builtin activation as a formula over a small math namespace ``m`` (``m.tanh``,
# ``m.sigmoid``, ``m.exp``, ``m.log1p``, ``m.expm1``, ``m.abs``, ``m.maximum``,
# ``m.where(cond, a, b)``): ``value(z, m)`` and its derivative ``slope(z, a, m)``,
# which may use the value ``a``. sciml prints them, with sympy as ``m``, into the
# code of a model's networks (and differentiates ``slope`` for second derivatives);
# they are the same expressions as `activate_row`'s.


class Formula(NamedTuple):
    value: Callable
    slope: Callable


def _gelu_inner(z, m):
    return m.tanh(_GELU_C * (z + 0.044715 * z * z * z))


FORMULAS = {
    "identity": Formula(lambda z, m: z, lambda z, a, m: 1.0),
    "tanh": Formula(lambda z, m: m.tanh(z), lambda z, a, m: 1.0 - a * a),
    "sigmoid": Formula(lambda z, m: m.sigmoid(z), lambda z, a, m: a * (1.0 - a)),
    "relu": Formula(lambda z, m: m.maximum(z, 0.0), lambda z, a, m: m.where(z > 0, 1.0, 0.0)),
    "softplus": Formula(lambda z, m: m.log1p(m.exp(-m.abs(z))) + m.maximum(z, 0.0),
                        lambda z, a, m: m.sigmoid(z)),
    "gelu": Formula(lambda z, m: 0.5 * z * (1.0 + _gelu_inner(z, m)),
                    lambda z, a, m: 0.5 * (1.0 + _gelu_inner(z, m)) + 0.5 * z * (
                        1.0 - _gelu_inner(z, m) ** 2) * _GELU_C * (1.0 + 3 * 0.044715 * z * z)),
    "silu": Formula(lambda z, m: z * m.sigmoid(z),
                    lambda z, a, m: m.sigmoid(z) * (1.0 + z * (1.0 - m.sigmoid(z)))),
    "elu": Formula(lambda z, m: m.where(z > 0, z, m.expm1(z)),
                   lambda z, a, m: m.where(z > 0, 1.0, a + 1.0)),
    "rbf": Formula(lambda z, m: m.exp(-z * z), lambda z, a, m: -2.0 * z * a),
}
assert tuple(FORMULAS) == BUILTIN
