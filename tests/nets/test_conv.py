"""Conv and ConvTranspose: numpy references (forward), finite differences (input and
parameter gradients), PyTorch's layout where torch is installed.

One float64 chain per case; all cases reuse one compiled kernel pair (shapes are data).
"""

import itertools

import numpy as np
import pytest

from nets import Chain, Conv, ConvTranspose, Flatten

from .layer_checks import check_gradients


def ref_conv(x, W, b, stride, pad, dil, groups):
    """Cross-correlation of x (N, C, *sp) with W (O, C/groups, *k), plain numpy."""
    nd = W.ndim - 2
    N, C = x.shape[:2]
    O = W.shape[0]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    out_sp = [(xp.shape[2 + i] - dil[i] * (W.shape[2 + i] - 1) - 1) // stride[i] + 1
              for i in range(nd)]
    y = np.zeros((N, O, *out_sp))
    Cg, Og = C // groups, O // groups
    for kk in itertools.product(*[range(k) for k in W.shape[2:]]):
        sl = tuple(slice(kk[i] * dil[i], kk[i] * dil[i] + stride[i] * (out_sp[i] - 1) + 1,
                         stride[i]) for i in range(nd))
        xs = xp[(slice(None), slice(None)) + sl]
        for g in range(groups):
            w = W[(slice(g * Og, (g + 1) * Og), slice(None)) + kk]  # (Og, Cg)
            y[:, g * Og:(g + 1) * Og] += np.einsum("oc,nc...->no...", w,
                                                   xs[:, g * Cg:(g + 1) * Cg])
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y


def ref_conv_transpose(x, W, b, stride, pad, dil, groups, out_pad):
    """Transposed convolution by scattering: y[o, i*s - p + k*d] += x[c, i] * W[c, o, k]."""
    nd = W.ndim - 2
    N, C = x.shape[:2]
    Og = W.shape[1]
    O = Og * groups
    Cg = C // groups
    sp = x.shape[2:]
    full = [(sp[i] - 1) * stride[i] + dil[i] * (W.shape[2 + i] - 1) + 1 + out_pad[i]
            for i in range(nd)]
    y = np.zeros((N, O, *full))
    for kk in itertools.product(*[range(k) for k in W.shape[2:]]):
        sl = tuple(slice(kk[i] * dil[i], kk[i] * dil[i] + stride[i] * (sp[i] - 1) + 1,
                         stride[i]) for i in range(nd))
        for g in range(groups):
            w = W[(slice(g * Cg, (g + 1) * Cg), slice(None)) + kk]  # (Cg, Og)
            y[(slice(None), slice(g * Og, (g + 1) * Og)) + sl] += np.einsum(
                "co,nc...->no...", w, x[:, g * Cg:(g + 1) * Cg])
    crop = tuple(slice(pad[i], full[i] - pad[i]) for i in range(nd))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y


# (input shape, layer): 1-D/2-D/3-D, stride, padding, dilation, groups, no bias
CONVS = [
    ((2, 7, 6), Conv(3, (3, 2))),
    ((2, 6, 7), Conv(4, (3, 3), stride=2, padding=1)),
    ((4, 7, 7), Conv(2, (2, 3), dilation=(2, 1), groups=2, bias=False)),
    ((3, 9), Conv(2, (3,), padding=2, stride=(2,))),
    ((2, 4, 5, 4), Conv(2, (2, 3, 2), padding=(1, 0, 1))),
    ((2, 5, 5), Conv(2, (3, 3), padding="same")),
    ((2, 5, 7), Conv(2, (2, 3), padding=(1, 2), dilation=(1, 2))),
]
TRANSPOSED = [
    ((2, 3, 4), ConvTranspose(3, (3, 2))),
    ((2, 3, 3), ConvTranspose(2, (3, 3), stride=2, padding=1, output_padding=1)),
    ((4, 3, 4), ConvTranspose(2, (2, 2), dilation=2, groups=2, bias=False)),
    ((2, 5), ConvTranspose(3, (3,), stride=(2,))),
]


def _params(chain, p):
    v = chain.views(p)[0]
    return v["weight"], v.get("bias")


@pytest.mark.parametrize("shape,layer", CONVS + TRANSPOSED, ids=repr)
def test_forward_matches_numpy(shape, layer, rng):
    chain = Chain(shape, layer)
    p = chain.init_params(seed=1)
    x = rng.normal(size=(3, *shape))
    W, b = _params(chain, p)
    if isinstance(layer, ConvTranspose):
        ref = ref_conv_transpose(x, W, b, layer.stride, layer.padding, layer.dilation,
                                 layer.groups, layer.output_padding)
    else:
        ref = ref_conv(x, W, b, layer.stride, layer.padding, layer.dilation, layer.groups)
    y = chain(x, p)
    assert y.shape == ref.shape == (3, *chain.out_shape)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,layer", [CONVS[1], CONVS[2], CONVS[4], CONVS[6],
                                         TRANSPOSED[1], TRANSPOSED[2]], ids=repr)
def test_gradients(shape, layer, rng):
    check_gradients(Chain(shape, layer), rng)


@pytest.mark.parametrize("shape,layer", [
    ((3, 30, 30), Conv(8, (3, 3), padding=1)),     # direct path, blocks of 9
    ((3, 30, 30), Conv(8, (3, 3), stride=2)),      # columns path, blocks of 16
    ((8, 14, 14), ConvTranspose(3, (3, 3))),       # columns path, transposed, 16
], ids=repr)
def test_blocks_of_samples(shape, layer, rng):
    # The kernels take a batch in blocks of samples (the last one partial here): each
    # sample gets what it gets alone, and the parameter cotangent is their sum.
    chain = Chain(shape, layer)
    p = chain.init_params(seed=3)
    N = 37
    x = rng.normal(size=(N, *shape))
    v = rng.normal(size=(N, *chain.out_shape))

    def run(xs, vs):
        scratch = np.zeros(layer.scratch_size(shape, len(xs)))
        y = np.empty((len(xs), *chain.out_shape))
        layer.forward(None, xs, y, p, p[:0], scratch)
        xbar, pbar = np.empty_like(xs), np.zeros_like(p)
        layer.pullback(None, vs, xs, y, p, p[:0], pbar, xbar, scratch)
        return y, xbar, pbar

    y, xbar, pbar = run(x, v)
    if isinstance(layer, Conv):
        W, b = _params(chain, p)
        np.testing.assert_allclose(y, ref_conv(x, W, b, layer.stride, layer.padding,
                                               layer.dilation, layer.groups), rtol=1e-12,
                                   atol=1e-12)
    total = np.zeros_like(p)
    for n in range(N):
        y1, xbar1, pbar1 = run(x[n:n + 1], v[n:n + 1])
        np.testing.assert_allclose(y[n], y1[0], rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(xbar[n], xbar1[0], rtol=1e-13, atol=1e-13)
        total += pbar1
    np.testing.assert_allclose(pbar, total, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,layer", [
    ((2, 7, 6), Conv(3, (3, 2))),
    ((4, 7, 7), Conv(2, (2, 3), dilation=(2, 1), groups=2, bias=False)),  # kernel rows 2 apart
    ((2, 5, 7), Conv(2, (2, 3), padding=(1, 2), dilation=(1, 2))),
    ((2, 3, 6, 5), Conv(3, (1, 3, 2), stride=(2, 1, 1), padding=(1, 1, 0))),  # KD = 1, OD = 3
    ((2, 6, 7), Conv(4, (3, 3), stride=(2, 1), padding=1)),
    ((2, 4, 5, 4), Conv(2, (2, 3, 2), padding=(1, 0, 1))),
], ids=repr)
def test_input_gradient_is_the_forward_maps_transpose(shape, layer, rng):
    """The direct path's input gradient (`gemm_tn_rows`: added into the windows output
    row by output row) against the transpose of the forward map, built column by column
    from the numpy reference."""
    chain = Chain(shape, layer)
    p = chain.init_params(seed=2)
    N = 5
    x = rng.normal(size=(N, *shape))
    v = rng.normal(size=(N, *chain.out_shape))
    scratch = np.zeros(layer.scratch_size(shape, N))
    y = np.empty((N, *chain.out_shape))
    layer.forward(None, x, y, p, p[:0], scratch)
    xbar, pbar = np.empty_like(x), np.zeros_like(p)
    layer.pullback(None, v, x, y, p, p[:0], pbar, xbar, scratch)
    W, _ = _params(chain, p)
    n_in = int(np.prod(shape))
    basis = np.eye(n_in).reshape((n_in, *shape))
    J = ref_conv(basis, W, None, layer.stride, layer.padding, layer.dilation,
                 layer.groups).reshape(n_in, -1)  # row i: the outputs of input unit i
    np.testing.assert_allclose(xbar.reshape(N, -1), v.reshape(N, -1) @ J.T, rtol=1e-12,
                               atol=1e-12)


def test_conv_transpose_is_the_adjoint_of_conv(rng):
    # <conv(x), y> == <x, conv_transpose(y)> with the same weight and no bias.
    conv = Chain((2, 7, 6), Conv(4, (3, 2), stride=2, padding=1, dilation=(1, 2), bias=False))
    tr = Chain(conv.out_shape, ConvTranspose(2, (3, 2), stride=2, padding=1, dilation=(1, 2),
                                             output_padding=(0, 1), bias=False))
    assert tr.out_shape == (2, 7, 6)
    p = conv.init_params(seed=2)
    x = rng.normal(size=(2, 2, 7, 6))
    y = rng.normal(size=(2, *conv.out_shape))
    assert np.isclose(np.sum(conv(x, p) * y), np.sum(x * tr(y, p)), rtol=1e-12)


def test_torch_layout_and_init():
    torch = pytest.importorskip("torch")
    chain = Chain((3, 8, 8), Conv(4, (3, 3), "relu", stride=2, padding=1, groups=1),
                  ConvTranspose(2, (2, 2), stride=2), Flatten())
    p = chain.init_params(seed=0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.ReLU(),
                            torch.nn.ConvTranspose2d(4, 2, 2, stride=2), torch.nn.Flatten())
    m = m.double()
    off = 0
    for q in m.parameters():
        q.data[:] = torch.from_numpy(p[off:off + q.numel()].reshape(q.shape))
        off += q.numel()
    assert off == chain.n_params
    x = np.random.default_rng(0).normal(size=(2, 3, 8, 8))
    np.testing.assert_allclose(chain(x, p), m(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_init_is_pytorch_default():
    # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, fan_in = in/groups * prod(k)
    chain = Chain((4, 10, 10), Conv(64, (3, 3), groups=2))
    v = chain.views(chain.init_params(seed=0))[0]
    bound = 1 / np.sqrt(2 * 9)
    assert v["weight"].shape == (64, 2, 3, 3)
    assert 0.9 * bound < np.abs(v["weight"]).max() <= bound
    assert np.abs(v["bias"]).max() <= bound


def test_bad_settings_and_shapes():
    with pytest.raises(ValueError, match="kernel"):
        Conv(3, (0, 2))
    with pytest.raises(ValueError, match="stride"):
        Conv(3, (2, 2), stride=(1,))
    with pytest.raises(ValueError, match="divisible by `groups`"):
        Conv(3, (2, 2), groups=2)
    with pytest.raises(ValueError, match="output_padding"):
        ConvTranspose(3, (2, 2), output_padding=1)
    with pytest.raises(ValueError, match=r"layer 1 .*Conv\(4, \(5, 5\)\).*\(2, 4, 4\).*spans 5"):
        Chain((1, 8, 8), Conv(2, (5, 5)), Conv(4, (5, 5)))
    with pytest.raises(ValueError, match=r"layer 0 .*2-D kernel.*\(3, 8\)"):
        Chain((3, 8), Conv(2, (2, 2)))
    with pytest.raises(ValueError, match="channels are not divisible by groups=2"):
        Chain((3, 8, 8), Conv(2, (2, 2), groups=2))
