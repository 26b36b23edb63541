"""Pooling and Flatten: numpy references with PyTorch's window and divisor rules, finite
differences, the first-maximum rule of max pooling."""

import itertools
import math

import numpy as np
import pytest

from nets import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, Chain, Flatten, LPPool, MaxPool

from .layer_checks import check_gradients


def _out(n, k, s, p, d, ceil):
    num = n + 2 * p - d * (k - 1) - 1
    m = (-(-num // s) if ceil else num // s) + 1
    if ceil and (m - 1) * s >= n + p:
        m -= 1
    return m


def ref_pool(x, kind, k, s, p, d=None, ceil=False, include_pad=True, norm=2.0):
    """Max / average / power-average pooling by looping over output positions."""
    nd = len(k)
    d = d or (1,) * nd
    sp = x.shape[2:]
    osp = [_out(sp[i], k[i], s[i], p[i], d[i], ceil) for i in range(nd)]
    y = np.zeros(x.shape[:2] + tuple(osp))
    for o in itertools.product(*[range(m) for m in osp]):
        idx, size = [], 1
        for i in range(nd):
            a = o[i] * s[i] - p[i]
            taps = [a + t * d[i] for t in range(k[i])]
            idx.append([t for t in taps if 0 <= t < sp[i]])
            size *= (min(a + k[i], sp[i] + p[i]) - a) if include_pad else len(idx[-1])
        win = x[(slice(None), slice(None)) + np.ix_(*idx)].reshape(x.shape[:2] + (-1,))
        if kind == "max":
            y[(slice(None), slice(None)) + o] = win.max(-1)
        elif kind == "avg":
            y[(slice(None), slice(None)) + o] = win.sum(-1) / size
        else:
            y[(slice(None), slice(None)) + o] = (win ** norm).sum(-1) ** (1 / norm)
    return y


def ref_adaptive(x, kind, osp):
    sp = x.shape[2:]
    y = np.zeros(x.shape[:2] + tuple(osp))
    for o in itertools.product(*[range(m) for m in osp]):
        idx = tuple(slice((o[i] * sp[i]) // osp[i], -(-((o[i] + 1) * sp[i]) // osp[i]))
                    for i in range(len(osp)))
        win = x[(slice(None), slice(None)) + idx].reshape(x.shape[:2] + (-1,))
        y[(slice(None), slice(None)) + o] = win.max(-1) if kind == "max" else win.mean(-1)
    return y


POOLS = [
    ((2, 6, 6), MaxPool((2, 2)), dict(kind="max", k=(2, 2), s=(2, 2), p=(0, 0))),
    ((2, 7, 8), MaxPool((3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2)),
     dict(kind="max", k=(3, 2), s=(2, 1), p=(1, 1), d=(1, 2))),
    ((1, 7, 7), MaxPool((2, 2), ceil_mode=True),
     dict(kind="max", k=(2, 2), s=(2, 2), p=(0, 0), ceil=True)),
    ((2, 9), MaxPool(3, stride=2, padding=1), dict(kind="max", k=(3,), s=(2,), p=(1,))),
    ((2, 4, 5, 4), MaxPool((2, 2, 2), stride=1),
     dict(kind="max", k=(2, 2, 2), s=(1, 1, 1), p=(0, 0, 0))),
    ((2, 7, 6), AvgPool((3, 2), stride=2, padding=1),
     dict(kind="avg", k=(3, 2), s=(2, 2), p=(1, 1))),
    ((2, 7, 6), AvgPool((3, 3), stride=2, padding=1, ceil_mode=True, count_include_pad=False),
     dict(kind="avg", k=(3, 3), s=(2, 2), p=(1, 1), ceil=True, include_pad=False)),
    ((2, 6, 6), LPPool(2, (2, 3)), dict(kind="lp", k=(2, 3), s=(2, 3), p=(0, 0), norm=2.0)),
    ((2, 8), LPPool(3, 3, stride=2), dict(kind="lp", k=(3,), s=(2,), p=(0,), norm=3.0)),
]
ADAPTIVE = [
    ((2, 7, 5), AdaptiveMaxPool((3, 2)), "max"),
    ((2, 7, 5), AdaptiveAvgPool((4, 3)), "avg"),
    ((3, 10), AdaptiveAvgPool(4), "avg"),
]


def _positive(x, layer):
    # LPPool with an odd power is NaN for negative sums, as in PyTorch: test on x > 0
    return np.abs(x) + 0.1 if isinstance(layer, LPPool) else x


@pytest.mark.parametrize("shape,layer,ref", POOLS, ids=lambda v: repr(v)[:40])
def test_pool_forward(shape, layer, ref, rng):
    chain = Chain(shape, layer)
    x = _positive(rng.normal(size=(3, *shape)), layer)
    y = chain(x, np.zeros(0))
    r = ref_pool(x, **ref)
    assert y.shape == r.shape == (3, *chain.out_shape)
    np.testing.assert_allclose(y, r, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape,layer,kind", ADAPTIVE, ids=lambda v: repr(v)[:40])
def test_adaptive_forward(shape, layer, kind, rng):
    chain = Chain(shape, layer)
    x = rng.normal(size=(2, *shape))
    np.testing.assert_allclose(chain(x, np.zeros(0)), ref_adaptive(x, kind, layer.output_size),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape,layer", [POOLS[0][:2], POOLS[1][:2], POOLS[3][:2], POOLS[6][:2],
                                         POOLS[7][:2], POOLS[8][:2], ADAPTIVE[0][:2],
                                         ADAPTIVE[1][:2]], ids=lambda v: repr(v)[:40])
def test_pool_gradients(shape, layer, rng):
    chain = Chain(shape, layer)
    x = _positive(rng.normal(size=(2, *shape)), layer)
    check_gradients(chain, rng, x=x)


def test_max_pool_gradient_goes_to_the_first_maximum():
    chain = Chain((1, 2, 4), MaxPool((2, 2)))
    x = np.array([[[[1.0, 3.0, 0.0, 0.0], [3.0, 2.0, 0.0, 0.0]]]])
    xbar = np.empty_like(x)
    chain.vjp_into(xbar, np.zeros(0), np.array([[[[10.0, 20.0]]]]), x, np.zeros(0),
                   chain.workspace(1))
    np.testing.assert_array_equal(xbar, [[[[0, 10, 20, 0], [0, 0, 0, 0]]]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_2x2_ties_go_to_the_first_maximum(dtype, rng):
    # LeNet's pooling (2x2 windows tiling the input: its own kernel) on inputs full of
    # ties, as after a relu: the cotangent goes to the first maximum in scan order
    shape = (3, 6, 8)
    chain = Chain(shape, MaxPool((2, 2)))
    x = rng.integers(0, 3, size=(4, *shape)).astype(dtype)
    v = rng.normal(size=(4, *chain.out_shape)).astype(dtype)
    ws = chain.workspace(4, dtype=dtype)
    xbar = np.full_like(x, np.nan)
    chain.vjp_into(xbar, np.zeros(0, dtype), v, x, np.zeros(0, dtype), ws)
    windows = x.reshape(4, 3, 3, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(4, 3, 3, 4, 4)
    first = windows.argmax(axis=-1)  # numpy's argmax: the first maximum
    ref = np.zeros_like(windows)
    np.put_along_axis(ref, first[..., None], v[..., None], axis=-1)
    ref = ref.reshape(4, 3, 3, 4, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(x.shape)
    np.testing.assert_array_equal(xbar, ref)
    np.testing.assert_array_equal(chain(x, np.zeros(0, dtype)), windows.max(axis=-1))


def test_flatten_is_c_order(rng):
    chain = Chain((2, 3, 4), Flatten())
    x = rng.normal(size=(5, 2, 3, 4))
    np.testing.assert_array_equal(chain(x, np.zeros(0)), x.reshape(5, 24))
    assert chain.out_shape == (24,)
    check_gradients(chain, rng)


def test_bad_settings():
    with pytest.raises(ValueError, match="at most half the kernel"):
        MaxPool((2, 2), padding=2)
    with pytest.raises(ValueError, match="dilation"):
        AvgPool((2, 2), dilation=2)
    with pytest.raises(ValueError, match="norm_type"):
        LPPool(0, (2, 2))
    with pytest.raises(ValueError, match="output_size"):
        AdaptiveAvgPool((0, 2))
    with pytest.raises(ValueError, match=r"layer 0 \(MaxPool.*window spans 5"):
        Chain((1, 4, 4), MaxPool((5, 5)))
    assert math.prod(Chain((1, 5, 5), MaxPool((2, 2), ceil_mode=True)).out_shape) == 9
