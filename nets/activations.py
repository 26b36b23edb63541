"""Activation functions: one table, every form of each activation in one row.

`TABLE` holds one `Activation` per builtin: its name and code (part of the
compiled kernels: append, never reorder), its numba scalar value and
value-and-derivative (what the kernels run), its formula over a math
namespace (what sciml prints into a model's code and differentiates for
second derivatives), its plain numpy reference (value and derivative, for
tests) and its JAX function (`nets.jax`). Kernels apply an activation to a
contiguous row of a buffer (`activate_row`), overwriting `z` with the value
and writing the derivative beside it, so the backward pass is a plain
multiply whatever the activation.

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
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import literal_unroll, types
from numba.extending import overload

from ._bits import bits_to_float, float_to_bits
from ._config import FASTMATH, jit

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



# ---------------------------------------------------------------- the scalar kernels
# Written for float32 and float64 alike: constants come from `_one(z)` (the type of z),
# since a Python number would promote a float32 expression to float64.


def _one(z):
    return 1.0


@overload(_one, jit_options=dict(fastmath=True, error_model="numpy"))
def _one_overload(z):
    if isinstance(z, types.Float) and z.bitwidth == 32:
        one = np.float32(1.0)
        return lambda z: one
    return lambda z: 1.0


@jit(inline="always")
def _identity(z):
    return z


@jit(inline="always")
def _identity_d(z):
    return z, _one(z)


@jit(inline="always")
def _tanh_d(z):
    t = tanh(z)
    return t, _one(z) - t * t


@jit(inline="always")
def _sigmoid_d(z):
    s = sigmoid(z)
    return s, s * (_one(z) - s)


@jit(inline="always")
def _relu(z):
    return max(z, _one(z) - _one(z))


@jit(inline="always")
def _relu_d(z):
    one = _one(z)
    zero = one - one
    return max(z, zero), one if z > zero else zero


@jit(inline="always")
def _softplus(z):
    return math.log1p(math.exp(-abs(z))) + max(z, _one(z) - _one(z))


@jit(inline="always")
def _softplus_d(z):
    return _softplus(z), sigmoid(z)


@jit(inline="always")
def _gelu(z):
    one = _one(z)
    half = one / 2
    t = tanh(_GELU_C * (z + 0.044715 * z * z * z))
    return half * z * (one + t)


@jit(inline="always")
def _gelu_d(z):
    one = _one(z)
    half = one / 2
    t = tanh(_GELU_C * (z + 0.044715 * z * z * z))
    return half * z * (one + t), half * (one + t) + half * z * (one - t * t) * _GELU_C * (
        one + 3 * 0.044715 * z * z)


@jit(inline="always")
def _silu(z):
    return z * sigmoid(z)


@jit(inline="always")
def _silu_d(z):
    s = sigmoid(z)
    one = _one(z)
    return z * s, s * (one + z * (one - s))


@jit(inline="always")
def _elu(z):
    return z if z > 0 else math.expm1(z)


@jit(inline="always")
def _elu_d(z):
    v = z if z > 0 else math.expm1(z)
    one = _one(z)
    return v, one if z > 0 else v + one


@jit(inline="always")
def _rbf(z):
    return math.exp(-z * z)


@jit(inline="always")
def _rbf_d(z):
    v = math.exp(-z * z)
    return v, -2 * z * v


# ---------------------------------------------------------------- the table


class Formula(NamedTuple):
    """An activation as a formula over a math namespace ``m`` (``m.tanh``, ``m.sigmoid``,
    ``m.exp``, ``m.log1p``, ``m.expm1``, ``m.abs``, ``m.maximum``, ``m.where(c, a, b)``):
    ``value(z, m)`` and its derivative ``slope(z, a, m)``, which may use the value ``a``."""

    value: Callable
    slope: Callable


@dataclass(frozen=True)
class Activation:
    """One activation in all its forms (see the module text).

    value, value_slope : numba scalar functions ``z -> a`` and ``z -> (a, da/dz)``;
    formula : `Formula`; reference : numpy ``z -> (a, da/dz)``;
    jax : ``(z, jnp, nn) -> a`` (``nn`` is ``jax.nn``), differentiable by JAX with the
    kernels' derivative at kinks (relu'(0) = 0, elu'(0) = 1).
    """

    name: str
    code: int
    value: Callable
    value_slope: Callable
    formula: Formula
    reference: Callable
    jax: Callable


def _np_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _np_gelu(z):
    t = np.tanh(_GELU_C * (z + 0.044715 * z**3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * _GELU_C * (
        1 + 3 * 0.044715 * z**2)


def _np_elu(z):
    v = np.where(z > 0, z, np.expm1(np.minimum(z, 0)))
    return v, np.where(z > 0, 1.0, v + 1)


def _gelu_inner(z, m):
    return m.tanh(_GELU_C * (z + 0.044715 * z * z * z))


TABLE = (
    Activation("identity", 0, _identity, _identity_d,
               Formula(lambda z, m: z, lambda z, a, m: 1.0),
               lambda z: (z.copy(), np.ones_like(z)),
               lambda z, jnp, nn: z),
    Activation("tanh", 1, tanh, _tanh_d,
               Formula(lambda z, m: m.tanh(z), lambda z, a, m: 1.0 - a * a),
               lambda z: (np.tanh(z), 1 - np.tanh(z) ** 2),
               lambda z, jnp, nn: jnp.tanh(z)),
    Activation("sigmoid", 2, sigmoid, _sigmoid_d,
               Formula(lambda z, m: m.sigmoid(z), lambda z, a, m: a * (1.0 - a)),
               lambda z: (_np_sigmoid(z), _np_sigmoid(z) * (1 - _np_sigmoid(z))),
               lambda z, jnp, nn: nn.sigmoid(z)),
    Activation("relu", 3, _relu, _relu_d,
               Formula(lambda z, m: m.maximum(z, 0.0), lambda z, a, m: m.where(z > 0, 1.0, 0.0)),
               lambda z: (np.maximum(z, 0), (z > 0).astype(float)),
               lambda z, jnp, nn: jnp.where(z > 0, z, jnp.zeros_like(z))),
    Activation("softplus", 4, _softplus, _softplus_d,
               Formula(lambda z, m: m.log1p(m.exp(-m.abs(z))) + m.maximum(z, 0.0),
                       lambda z, a, m: m.sigmoid(z)),
               lambda z: (np.logaddexp(0, z), _np_sigmoid(z)),
               lambda z, jnp, nn: jnp.logaddexp(z, jnp.zeros_like(z))),
    Activation("gelu", 5, _gelu, _gelu_d,  # the tanh form (the default in JAX and Flux)
               Formula(lambda z, m: 0.5 * z * (1.0 + _gelu_inner(z, m)),
                       lambda z, a, m: 0.5 * (1.0 + _gelu_inner(z, m)) + 0.5 * z * (
                           1.0 - _gelu_inner(z, m) ** 2) * _GELU_C * (
                               1.0 + 3 * 0.044715 * z * z)),
               _np_gelu,
               lambda z, jnp, nn: 0.5 * z * (1 + jnp.tanh(_GELU_C * (z + 0.044715 * z**3)))),
    Activation("silu", 6, _silu, _silu_d,
               Formula(lambda z, m: z * m.sigmoid(z),
                       lambda z, a, m: m.sigmoid(z) * (1.0 + z * (1.0 - m.sigmoid(z)))),
               lambda z: (z * _np_sigmoid(z), _np_sigmoid(z) * (1 + z * (1 - _np_sigmoid(z)))),
               lambda z, jnp, nn: z * nn.sigmoid(z)),
    Activation("elu", 7, _elu, _elu_d,  # alpha = 1
               Formula(lambda z, m: m.where(z > 0, z, m.expm1(z)),
                       lambda z, a, m: m.where(z > 0, 1.0, a + 1.0)),
               _np_elu,
               # expm1 only sees z <= 0 (no overflow, no NaN gradient)
               lambda z, jnp, nn: jnp.where(z > 0, z, jnp.expm1(
                   jnp.where(z > 0, jnp.zeros_like(z), z)))),
    Activation("rbf", 8, _rbf, _rbf_d,
               Formula(lambda z, m: m.exp(-z * z), lambda z, a, m: -2.0 * z * a),
               lambda z: (np.exp(-z**2), -2 * z * np.exp(-z**2)),
               lambda z, jnp, nn: jnp.exp(-z * z)),
)
assert all(a.code == i for i, a in enumerate(TABLE))

BUILTIN = tuple(a.name for a in TABLE)
CODES = {a.name: a.code for a in TABLE}
BY_NAME = {a.name: a for a in TABLE}
FORMULAS = {a.name: a.formula for a in TABLE}

# The compiled dispatch below reads the table's numba columns.
_KERNELS = tuple((a.code, a.value, a.value_slope) for a in TABLE)


def _apply(value, value_slope, buf, zo, do, n, need_d):
    """One row through one activation (compiled only: see its overload)."""


@overload(_apply, inline="always", jit_options=dict(fastmath=FASTMATH, error_model="numpy"))
def _apply_overload(value, value_slope, buf, zo, do, n, need_d):
    # The functions from their numba types, as free variables of the loop: numba inlines a
    # free variable's function (a table entry's it would call), so the loop vectorises.
    f, fd = value.dispatcher, value_slope.dispatcher

    def apply(value, value_slope, buf, zo, do, n, need_d):
        z = buf[zo:zo + n]
        if need_d:
            d = buf[do:do + n]
            for j in range(n):
                z[j], d[j] = fd(z[j])
        else:
            for j in range(n):
                z[j] = f(z[j])

    return apply


@jit
def activate_row(code, buf, zo, do, n, need_d):
    """Apply activation `code` to buf[zo:zo+n] in place; derivative to buf[do:do+n].

    The branch on `code` sits outside the element loops (one loop per table
    row, unrolled at compile time), so each loop is a straight vectorisable body.
    """
    for entry in literal_unroll(_KERNELS):
        if code == entry[0] and (need_d or code != 0):  # identity's value: nothing to do
            _apply(entry[1], entry[2], buf, zo, do, n, need_d)


def reference(name, z):
    """Plain numpy value and derivative of a builtin activation (for tests)."""
    return BY_NAME[name].reference(np.asarray(z, dtype=np.float64))
