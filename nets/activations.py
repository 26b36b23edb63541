"""Activation functions: one table, every form of each activation in one row.

`TABLE` holds one `Activation` per builtin: its name and code (part of the
compiled kernels: append, never reorder), its numba scalar value and
value-and-derivative (what the kernels run), its formula over a math
namespace (what sciml prints into a model's code and differentiates for
second derivatives), its plain numpy reference (value and derivative, for
tests) and its JAX function (`nets.jax`). Kernels apply an activation to a
contiguous row of a buffer, overwriting `z` with the value and writing the
derivative beside it, so the backward pass is a plain multiply whatever the
activation. They do so through the activation's *row kernel* (`row_address`,
`call_row`), compiled for one activation when first used: a kernel holds no
activation code of its own.

The rows follow PyTorch's definitions and names (relu6, hardtanh, hardswish,
hardsigmoid, selu, leaky_relu, logsigmoid, tanhshrink, softsign, mish, celu, elu,
and gelu_erf: PyTorch's default, exact gelu; "gelu" is the tanh form), derivatives
at kinks included. Four take constants (`Activation.constants`: leaky_relu's
negative_slope, elu's and celu's alpha, hardtanh's min_val and max_val): the
row kernels get them as data (``c0, c1``), so every value shares the one
disk-cached row kernel; `nets.registry` names them ``"elu(alpha=2.0)"``.

libm `tanh` is a scalar call that blocks vectorisation (50 of them were most of
a 2-50-2 network's forward pass), so `tanh` is computed
inline by branch-free formulas that vectorise: float32 by a rational
approximation (max error a few ulp in float32); float64 by Cephes' odd
rational for |x| < 0.625 and ``1 - 2 / (exp(2|x|) + 1)`` beyond, with an
inline exp (Cody-Waite reduction, a Taylor polynomial, 2**n from the bits of
n) and one division for both branches: within 2 ulp of numpy's tanh (tested
on a dense grid), ~5x faster than libm over a row of 50.
"""

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ._bits import bits_to_float, float_to_bits
from ._config import FASTMATH, jit
from .tiles import TARGET_CPU

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


# float32's division: with `arcp` LLVM turns it into a reciprocal estimate and a Newton
# step, three more multiply-adds a vector. AMD's Zen cores divide beside their FMA pipes
# fast enough that the division itself costs less: a tanh row 0.29 -> 0.26 ns an element
# (AVX-512) and 0.33 -> 0.29 (AVX2 code) on a Zen 4. Intel's AVX-512 division is the
# slower there (about one 512-bit division every ten cycles), so it keeps the estimate.
_TANH_FASTMATH = ({"nnan", "ninf", "nsz", "contract", "afn", "reassoc"}
                  if TARGET_CPU.startswith("znver") else True)


@overload(_tanh_stub, jit_options=dict(fastmath=_TANH_FASTMATH, error_model="numpy"))
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


@intrinsic
def _maximum(typingctx, a, b):
    """max(a, b) of two floats of one type, NaN if either is (LLVM's `maximum`). Python's
    max is a compare and a select; an activation stores its value back where it read z,
    and LLVM makes a store of a select of the value just read into a store where it
    changed only: masked stores, microcoded on AMD's cores (relu's row 1.1 -> 0.2 ns an
    element on a Zen 3)."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty]),
                                            f"llvm.maximum.{ty.intrinsic_name}")
        return builder.call(fn, args)

    return a(a, b), codegen


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
    return _maximum(z, _one(z) - _one(z))


@jit(inline="always")
def _relu_d(z):
    one = _one(z)
    zero = one - one
    return _maximum(z, zero), one if z > zero else zero


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
def _rbf(z):
    return math.exp(-z * z)


@jit(inline="always")
def _rbf_d(z):
    v = math.exp(-z * z)
    return v, -2 * z * v


# The activations below follow PyTorch's definitions, derivatives at kinks included
# (e.g. relu6'(6) = 0, hardswish'(-3) = 0, elu'(0) = alpha). Those with constants
# (leaky_relu, elu, celu, hardtanh) take them as arguments ``c0, c1`` in the
# parameters' dtype (see `Activation.constants`).


@jit(inline="always")
def _clamp(z, lo, hi):
    return min(max(z, lo), hi)


@jit(inline="always")
def _relu6(z):
    one = _one(z)
    return _clamp(z, one - one, 6 * one)


@jit(inline="always")
def _relu6_d(z):
    one = _one(z)
    zero = one - one
    return _clamp(z, zero, 6 * one), one if zero < z < 6 * one else zero


@jit(inline="always")
def _hardtanh(z, lo, hi):
    return _clamp(z, lo, hi)


@jit(inline="always")
def _hardtanh_d(z, lo, hi):
    one = _one(z)
    return _clamp(z, lo, hi), one if lo < z < hi else one - one


@jit(inline="always")
def _hardswish(z):
    one = _one(z)
    return z * _clamp(z + 3 * one, one - one, 6 * one) / 6


@jit(inline="always")
def _hardswish_d(z):
    one = _one(z)
    zero = one - one
    d = zero if z <= -3 * one else (z / 3 + one / 2 if z < 3 * one else one)
    return z * _clamp(z + 3 * one, zero, 6 * one) / 6, d


@jit(inline="always")
def _hardsigmoid(z):
    one = _one(z)
    return _clamp(z + 3 * one, one - one, 6 * one) / 6


@jit(inline="always")
def _hardsigmoid_d(z):
    one = _one(z)
    zero = one - one
    return _clamp(z + 3 * one, zero, 6 * one) / 6, one / 6 if -3 * one < z < 3 * one else zero


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_SELU_SA = _SELU_ALPHA * _SELU_SCALE


@jit(inline="always")
def _selu(z):
    one = _one(z)
    return _SELU_SCALE * one * z if z > 0 else _SELU_SA * one * math.expm1(z)


@jit(inline="always")
def _selu_d(z):
    one = _one(z)
    if z > 0:
        return _SELU_SCALE * one * z, _SELU_SCALE * one
    e = math.exp(z)
    return _SELU_SA * one * math.expm1(z), _SELU_SA * one * e


@jit(inline="always")
def _leaky_relu(z, slope, unused):
    return z * (_one(z) if z > 0 else slope)  # a product, not a select of z (`_maximum`)


@jit(inline="always")
def _leaky_relu_d(z, slope, unused):
    d = _one(z) if z > 0 else slope
    return z * d, d


@jit(inline="always")
def _elu_c(z, alpha, unused):
    return z if z > 0 else alpha * math.expm1(z)


@jit(inline="always")
def _elu_c_d(z, alpha, unused):
    if z > 0:
        return z, _one(z)
    v = alpha * math.expm1(z)
    return v, v + alpha


@jit(inline="always")
def _celu(z, alpha, unused):
    return z if z > 0 else alpha * math.expm1(z / alpha)


@jit(inline="always")
def _celu_d(z, alpha, unused):
    if z > 0:
        return z, _one(z)
    return alpha * math.expm1(z / alpha), math.exp(z / alpha)


@jit(inline="always")
def _logsigmoid(z):
    one = _one(z)
    return min(z, one - one) - math.log1p(math.exp(-abs(z)))


@jit(inline="always")
def _logsigmoid_d(z):
    return _logsigmoid(z), sigmoid(-z)


@jit(inline="always")
def _tanhshrink64(x):
    # z - tanh(z) without the cancellation at small |z|: Cephes' rational there is
    # tanh(x) = x + x z P(z) / Q(z) (z = x^2), so x - tanh(x) = -x z P / Q. Beyond, libm's
    # tanh (a rare activation: the inline, vectorisable tanh costs seconds of compile).
    p0, p1, p2 = _TP
    q0, q1, q2 = _TQ
    z = x * x
    if abs(x) < 0.625:
        return -x * z * ((p0 * z + p1) * z + p2) / (((z + q0) * z + q1) * z + q2)
    return x - math.tanh(x)


@jit(inline="always")
def _tanhshrink(z):
    # in float64 whatever the dtype (float32's tanh approximation cancels near 0)
    return _tanhshrink64(np.float64(z))


@jit(inline="always")
def _tanhshrink_d(z):
    x = np.float64(z)
    v = _tanhshrink64(x)
    t = x - v
    return v, t * t


@jit(inline="always")
def _softsign(z):
    return z / (_one(z) + abs(z))


@jit(inline="always")
def _softsign_d(z):
    q = _one(z) / (_one(z) + abs(z))
    return z * q, q * q


@jit(inline="always")
def _mish_parts(z):
    # t = tanh(softplus(z)) = n / (n + 2) with n = e (e + 2), e = exp(z), and 1 - t from
    # the same quotient: no tanh, whose float32 approximation leaves 1 - t^2 ~ 1e-7 at
    # large z (times z in the slope); u = exp(-|z|) <= 1, so nothing overflows.
    one = _one(z)
    u = math.exp(-abs(z))
    if z > 0:  # n / e^2 = 1 + 2u
        num = one + 2 * u
        den = num + 2 * u * u
        return num / den, 2 * u * u / den
    num = u * (u + 2)
    den = num + 2
    return num / den, 2 / den


@jit(inline="always")
def _mish(z):
    return z * _mish_parts(z)[0]


@jit(inline="always")
def _mish_d(z):
    t, om = _mish_parts(z)
    return z * t, t + z * om * (_one(z) + t) * sigmoid(z)


_SQRT1_2 = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jit(inline="always")
def _gelu_erf(z):
    # erfc(-z / sqrt 2) = 1 + erf(z / sqrt 2), accurate also where that sum cancels (z << 0)
    return z * math.erfc(-_SQRT1_2 * z) / 2


@jit(inline="always")
def _gelu_erf_d(z):
    c = math.erfc(-_SQRT1_2 * z) / 2
    return z * c, c + z * _INV_SQRT_2PI * math.exp(-z * z / 2)


# ---------------------------------------------------------------- the table


class Formula(NamedTuple):
    """An activation as a formula over a math namespace ``m`` (``m.tanh``, ``m.sigmoid``,
    ``m.exp``, ``m.log1p``, ``m.expm1``, ``m.erfc``, ``m.abs``, ``m.maximum``,
    ``m.where(c, a, b)``): ``value(z, m)`` and its derivative ``slope(z, a, m)``, which may
    use the value ``a``. An activation with constants takes them after ``m``, with their
    defaults: ``value(z, m, c0, c1)``, ``slope(z, a, m, c0, c1)``."""

    value: Callable
    slope: Callable


@dataclass(frozen=True)
class Activation:
    """One activation in all its forms (see the module text).

    value, value_slope : numba scalar functions ``z -> a`` and ``z -> (a, da/dz)``
    (``(z, c0, c1)`` for an activation with constants);
    formula : `Formula`; reference : numpy ``z -> (a, da/dz)`` (``(z, *constants)``);
    jax : ``(z, jnp, nn) -> a`` (``nn`` is ``jax.nn``; ``(z, jnp, nn, *constants)``),
    differentiable by JAX with the kernels' derivative at kinks (relu'(0) = 0, elu'(0) =
    alpha, PyTorch's conventions);
    constants : ``((name, default), ...)``, at most two, named as PyTorch's keyword
    arguments (``negative_slope``, ``alpha``, ``min_val``, ``max_val``).
    """

    name: str
    code: int
    value: Callable
    value_slope: Callable
    formula: Formula
    reference: Callable
    jax: Callable
    constants: tuple = ()

    @property
    def defaults(self):
        return tuple(v for _, v in self.constants)


def _np_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _np_gelu(z):
    t = np.tanh(_GELU_C * (z + 0.044715 * z**3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * _GELU_C * (
        1 + 3 * 0.044715 * z**2)


def _np_elu(z, alpha=1.0):
    v = np.where(z > 0, z, alpha * np.expm1(np.minimum(z, 0)))
    return v, np.where(z > 0, 1.0, v + alpha)


def _np_celu(z, alpha=1.0):
    e = np.minimum(z, 0) / alpha
    return np.where(z > 0, z, alpha * np.expm1(e)), np.where(z > 0, 1.0, np.exp(e))


def _np_selu(z):
    e = np.minimum(z, 0)
    return (np.where(z > 0, _SELU_SCALE * z, _SELU_SA * np.expm1(e)),
            np.where(z > 0, _SELU_SCALE, _SELU_SA * np.exp(e)))


def _np_hardswish(z):
    return (z * np.clip(z + 3, 0, 6) / 6,
            np.where(z <= -3, 0.0, np.where(z < 3, z / 3 + 0.5, 1.0)))


# z - tanh(z) = sum_k c_k z^(2k+3) (Taylor series; the terms fall by ~0.004 at |z| = 0.1)
_TANHSHRINK_SERIES = (1 / 3, -2 / 15, 17 / 315, -62 / 2835, 1382 / 155925, -21844 / 6081075,
                      929569 / 638512875, -6404582 / 10854718875)


def _np_tanhshrink(z):
    t = np.tanh(z)
    series = sum(c * z ** (2 * k + 3) for k, c in enumerate(_TANHSHRINK_SERIES))
    return np.where(np.abs(z) < 0.1, series, z - t), t * t


def _np_mish(z):
    t = np.tanh(np.logaddexp(0, z))
    return z * t, t + z * (1 - t * t) * _np_sigmoid(z)


def _np_gelu_erf(z):
    from math import erfc

    c = 0.5 * np.vectorize(erfc, otypes=[float])(-_SQRT1_2 * z)
    return z * c, c + z * _INV_SQRT_2PI * np.exp(-z * z / 2)


def _gelu_inner(z, m):
    return m.tanh(_GELU_C * (z + 0.044715 * z * z * z))


def _unit(z, lo, hi, m):
    """1 on lo < z < hi, else 0 (the slope of a clamp)."""
    return m.where(z > lo, m.where(z < hi, 1.0, 0.0), 0.0)


def _clamp_f(z, lo, hi, m):
    return m.where(z < lo, lo, m.where(z > hi, hi, z))


def _jclamp(z, lo, hi, jnp):
    # slope 0 at the ends (PyTorch's hardtanh), unlike jnp.clip's
    return jnp.where(z <= lo, lo + 0 * z, jnp.where(z >= hi, hi + 0 * z, z))


def _jneg(z, jnp):
    """min(z, 0) without a NaN gradient from exp/expm1 of large z in the untaken branch."""
    return jnp.where(z > 0, jnp.zeros_like(z), z)


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
    Activation("elu", 7, _elu_c, _elu_c_d,
               Formula(lambda z, m, alpha=1.0: m.where(z > 0, z, alpha * m.expm1(z)),
                       lambda z, a, m, alpha=1.0: m.where(z > 0, 1.0, a + alpha)),
               _np_elu,
               lambda z, jnp, nn, alpha=1.0: jnp.where(z > 0, z, alpha * jnp.expm1(
                   _jneg(z, jnp))),
               (("alpha", 1.0),)),
    Activation("rbf", 8, _rbf, _rbf_d,
               Formula(lambda z, m: m.exp(-z * z), lambda z, a, m: -2.0 * z * a),
               lambda z: (np.exp(-z**2), -2 * z * np.exp(-z**2)),
               lambda z, jnp, nn: jnp.exp(-z * z)),
    Activation("relu6", 9, _relu6, _relu6_d,
               Formula(lambda z, m: _clamp_f(z, 0.0, 6.0, m),
                       lambda z, a, m: _unit(z, 0.0, 6.0, m)),
               lambda z: (np.clip(z, 0, 6), ((z > 0) & (z < 6)).astype(float)),
               lambda z, jnp, nn: _jclamp(z, 0.0, 6.0, jnp)),
    Activation("hardtanh", 10, _hardtanh, _hardtanh_d,
               Formula(lambda z, m, lo=-1.0, hi=1.0: _clamp_f(z, lo, hi, m),
                       lambda z, a, m, lo=-1.0, hi=1.0: _unit(z, lo, hi, m)),
               lambda z, lo=-1.0, hi=1.0: (np.clip(z, lo, hi),
                                           ((z > lo) & (z < hi)).astype(float)),
               lambda z, jnp, nn, lo=-1.0, hi=1.0: _jclamp(z, lo, hi, jnp),
               (("min_val", -1.0), ("max_val", 1.0))),
    Activation("hardswish", 11, _hardswish, _hardswish_d,
               Formula(lambda z, m: z * _clamp_f(z + 3.0, 0.0, 6.0, m) / 6.0,
                       lambda z, a, m: m.where(z > -3.0, m.where(z < 3.0, z / 3.0 + 0.5, 1.0),
                                               0.0)),
               _np_hardswish,
               lambda z, jnp, nn: jnp.where(z <= -3, jnp.zeros_like(z), jnp.where(
                   z < 3, z * (z + 3) / 6, z))),
    Activation("hardsigmoid", 12, _hardsigmoid, _hardsigmoid_d,
               Formula(lambda z, m: _clamp_f(z + 3.0, 0.0, 6.0, m) / 6.0,
                       lambda z, a, m: _unit(z, -3.0, 3.0, m) / 6.0),
               lambda z: (np.clip(z + 3, 0, 6) / 6, ((z > -3) & (z < 3)) / 6.0),
               lambda z, jnp, nn: _jclamp(z + 3, 0.0, 6.0, jnp) / 6),
    Activation("selu", 13, _selu, _selu_d,
               Formula(lambda z, m: m.where(z > 0, _SELU_SCALE * z, _SELU_SA * m.expm1(z)),
                       lambda z, a, m: m.where(z > 0, _SELU_SCALE, _SELU_SA * m.exp(z))),
               _np_selu,
               lambda z, jnp, nn: jnp.where(z > 0, _SELU_SCALE * z, _SELU_SA * jnp.expm1(
                   _jneg(z, jnp)))),
    Activation("leaky_relu", 14, _leaky_relu, _leaky_relu_d,
               Formula(lambda z, m, s=0.01: m.where(z > 0, z, s * z),
                       lambda z, a, m, s=0.01: m.where(z > 0, 1.0, s)),
               lambda z, s=0.01: (np.where(z > 0, z, s * z), np.where(z > 0, 1.0, s)),
               lambda z, jnp, nn, s=0.01: jnp.where(z > 0, z, s * z),
               (("negative_slope", 0.01),)),
    Activation("logsigmoid", 15, _logsigmoid, _logsigmoid_d,
               Formula(lambda z, m: m.where(z < 0, z, 0.0) - m.log1p(m.exp(-m.abs(z))),
                       lambda z, a, m: m.sigmoid(-z)),
               lambda z: (-np.logaddexp(0, -z), _np_sigmoid(-z)),
               lambda z, jnp, nn: nn.log_sigmoid(z)),
    Activation("tanhshrink", 16, _tanhshrink, _tanhshrink_d,
               Formula(lambda z, m: z - m.tanh(z), lambda z, a, m: (z - a) ** 2),
               _np_tanhshrink,
               lambda z, jnp, nn: z - jnp.tanh(z)),
    Activation("softsign", 17, _softsign, _softsign_d,
               Formula(lambda z, m: z / (1.0 + m.abs(z)), lambda z, a, m: 1.0 / (
                   1.0 + m.abs(z)) ** 2),
               lambda z: (z / (1 + np.abs(z)), 1 / (1 + np.abs(z)) ** 2),
               lambda z, jnp, nn: z / (1 + jnp.abs(z))),
    Activation("mish", 18, _mish, _mish_d,
               Formula(lambda z, m: z * m.tanh(m.log1p(m.exp(-m.abs(z))) + m.maximum(z, 0.0)),
                       lambda z, a, m: _mish_slope(z, m)),
               _np_mish,
               lambda z, jnp, nn: z * jnp.tanh(jnp.logaddexp(z, jnp.zeros_like(z)))),
    Activation("celu", 19, _celu, _celu_d,
               Formula(lambda z, m, alpha=1.0: m.where(z > 0, z, alpha * m.expm1(z / alpha)),
                       lambda z, a, m, alpha=1.0: m.where(z > 0, 1.0, m.exp(z / alpha))),
               _np_celu,
               lambda z, jnp, nn, alpha=1.0: jnp.where(z > 0, z, alpha * jnp.expm1(
                   _jneg(z, jnp) / alpha)),
               (("alpha", 1.0),)),
    Activation("gelu_erf", 20, _gelu_erf, _gelu_erf_d,  # PyTorch's default gelu
               Formula(lambda z, m: 0.5 * z * m.erfc(-_SQRT1_2 * z),
                       lambda z, a, m: 0.5 * m.erfc(-_SQRT1_2 * z) + z * _INV_SQRT_2PI * m.exp(
                           -0.5 * z * z)),
               _np_gelu_erf,
               lambda z, jnp, nn: nn.gelu(z, approximate=False)),
)
assert all(a.code == i for i, a in enumerate(TABLE))


def _mish_slope(z, m):
    t = m.tanh(m.log1p(m.exp(-m.abs(z))) + m.maximum(z, 0.0))
    return t + z * (1.0 - t * t) * m.sigmoid(z)


BUILTIN = tuple(a.name for a in TABLE)
CODES = {a.name: a.code for a in TABLE}
BY_NAME = {a.name: a for a in TABLE}
FORMULAS = {a.name: a.formula for a in TABLE}


def _takes_constants(fn):
    return fn.py_func.__code__.co_argcount == 3


# The row kernels below read the table's numba columns, with the constants' defaults
# (zeros for an activation without constants).
_KERNELS = tuple((a.code, a.value, a.value_slope, *(a.defaults + (0.0, 0.0))[:2])
                 for a in TABLE)
# Each constant's default per code (zeros where an activation has none).
_DEFAULT0 = tuple(float(e[3]) for e in _KERNELS)
_DEFAULT1 = tuple(float(e[4]) for e in _KERNELS)


# ---------------------------------------------------------------- row kernels
#
# Compiled code applies an activation through the address of its *row kernel*: a C
# function for one activation and one float type that applies it to a row in place,
# compiled (or loaded from the disk cache) when first asked for (`row_address`). The
# kernels that call one (`call_row`) hold no activation code: they are compiled once
# whatever the activations, and a chain compiles only the activations it uses. (A table
# of every activation compiled into every kernel was most of a cold first call.)

_FLOATS = {np.dtype(np.float32): types.float32, np.dtype(np.float64): types.float64}


def row_signature(dtype):
    """The C signature of a row kernel on `dtype` (float32 or float64): ``row(z, d, n, c0,
    c1, need_d)`` writes the activation of z[:n] into z and, if `need_d` (int64, 0 or 1),
    its derivative into d[:n]; ``c0, c1`` (float64) are the constants of an activation
    that takes them (`Activation.constants`), ignored by the others."""
    ptr = types.CPointer(_FLOATS[np.dtype(dtype)])
    return types.void(ptr, ptr, types.int64, types.float64, types.float64, types.int64)


def compile_row(row, dtype, cache=True):
    """`row` (a Python function of `row_signature`'s arguments) compiled as a C function
    with the kernels' options."""
    return cfunc(row_signature(dtype), cache=cache, fastmath=FASTMATH,
                 error_model="numpy")(row)


def _apply(value, value_slope, c0, c1, z, d, n, need_d):
    """z[:n] through one activation, derivative into d (compiled only: see its overload)."""


@overload(_apply, inline="always", jit_options=dict(fastmath=FASTMATH, error_model="numpy"))
def _apply_overload(value, value_slope, c0, c1, z, d, n, need_d):
    # The functions from their numba types, as free variables of the loop: numba inlines a
    # free variable's function (a table entry's it would call), so the loop vectorises.
    f, fd = value.dispatcher, value_slope.dispatcher

    if _takes_constants(f):
        def apply(value, value_slope, c0, c1, z, d, n, need_d):
            k0, k1 = z.dtype.type(c0), z.dtype.type(c1)
            if need_d:
                for j in range(n):
                    z[j], d[j] = fd(z[j], k0, k1)
            else:
                for j in range(n):
                    z[j] = f(z[j], k0, k1)

        return apply

    def apply(value, value_slope, c0, c1, z, d, n, need_d):
        if need_d:
            for j in range(n):
                z[j], d[j] = fd(z[j])
        else:
            for j in range(n):
                z[j] = f(z[j])

    return apply


def _builtin_row(code):
    # A closure over the code alone (an int): numba's disk cache tells closures apart by
    # their cells' pickles, which for a compiled function would differ in every process.
    def row(zp, dp, n, c0, c1, need_d):
        entry = _KERNELS[code]  # a constant index: this activation's functions alone
        _apply(entry[1], entry[2], c0, c1, carray(zp, n), carray(dp, n), n, need_d != 0)

    return row


_rows = {}  # (code, dtype) -> row kernel (a numba cfunc, kept alive with its address)
_rows_lock = threading.Lock()


def row_address(code, dtype):
    """The address of builtin activation `code`'s row kernel on `dtype` (see
    `row_signature`), compiled or loaded from the disk cache on first use; valid for the
    life of the process."""
    key = (int(code), np.dtype(dtype))
    with _rows_lock:  # one compile, whichever thread asks first
        if key not in _rows:
            if not 0 <= key[0] < len(TABLE) or key[1] not in _FLOATS:
                raise ValueError(f"no row kernel for activation code {code} on {dtype}")
            _rows[key] = compile_row(_builtin_row(key[0]), key[1])
        return _rows[key].address


@intrinsic
def call_row(typingctx, addr, buf, zo, do, n, c0, c1, need_d):
    """Inside compiled code: the row kernel at `addr` (`row_address`) on buf[zo:zo+n],
    derivative to buf[do:do+n] if `need_d`; `buf` a C-contiguous float32 or float64
    vector of the kernel's type, ``c0, c1`` its activation's constants."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1 and buf.layout == "C"
            and buf.dtype in _FLOATS.values()):
        return None
    real = ir.FloatType() if buf.dtype == types.float32 else ir.DoubleType()
    i64, f64 = ir.IntType(64), ir.DoubleType()
    fnty = ir.FunctionType(ir.VoidType(), [real.as_pointer(), real.as_pointer(), i64, f64,
                                           f64, i64])
    sig = types.void(addr, buf, zo, do, n, c0, c1, need_d)

    def codegen(context, builder, sig, args):
        def as_(k, ty):
            return context.cast(builder, args[k], sig.args[k], ty)

        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        fp = builder.inttoptr(as_(0, types.int64), fnty.as_pointer())
        builder.call(fp, [builder.gep(data, [as_(2, types.int64)]),
                          builder.gep(data, [as_(3, types.int64)]), as_(4, types.int64),
                          as_(5, types.float64), as_(6, types.float64), as_(7, types.int64)])
        return context.get_dummy_value()

    return sig, codegen


@jit
def _run_row(addr, buf, zo, do, n, c0, c1, need_d):
    call_row(addr, buf, zo, do, n, c0, c1, need_d)


def run_row(addr, buf, zo, do, n, c0, c1, need_d):
    """From Python: the row kernel at `addr` on buf[zo:zo+n] in place, derivative to
    buf[do:do+n] if `need_d` (`call_row`); `buf` a C-contiguous vector of the kernel's
    float type. Raises ValueError where a row would leave `buf`."""
    if not (isinstance(buf, np.ndarray) and buf.ndim == 1 and buf.dtype in _FLOATS
            and buf.flags.c_contiguous and buf.flags.writeable):
        raise ValueError("`buf` must be a writeable C-contiguous float32 or float64 vector")
    if n < 0 or zo < 0 or zo + n > buf.size or (need_d and (do < 0 or do + n > buf.size)):
        raise ValueError(f"rows [{zo}, {zo + n}) and [{do}, {do + n}) do not fit `buf` "
                         f"(size {buf.size})")
    # one set of argument types: one compiled copy per float type
    _run_row(int(addr), buf, int(zo), int(do), int(n), float(c0), float(c1), bool(need_d))


def activate_row_c(code, c0, c1, buf, zo, do, n, need_d):
    """Apply builtin activation `code` with the constants ``c0, c1`` (see
    `Activation.constants`; ignored by an activation without them) to buf[zo:zo+n] in
    place; derivative to buf[do:do+n] if `need_d` (from Python: `run_row`)."""
    run_row(row_address(code, buf.dtype), buf, zo, do, n, c0, c1, need_d)


def activate_row(code, buf, zo, do, n, need_d):
    """`activate_row_c` with each constant at its default."""
    activate_row_c(code, _DEFAULT0[code], _DEFAULT1[code], buf, zo, do, n, need_d)


def reference(name, z, *constants):
    """Plain numpy value and derivative of a builtin activation (for tests)."""
    return BY_NAME[name].reference(np.asarray(z, dtype=np.float64), *constants)
