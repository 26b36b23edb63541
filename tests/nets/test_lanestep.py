"""The compiled lane step (`nets.lanestep`) against the per-layer path it replaces: the
same loss and gradient for every layer kind it covers, to rounding: the kernels are the
same code, but compiled into one call LLVM may vectorise a reduction (a bias's sum) in
another order (seen in a cold CI run: 1 ulp in the biases of two convolutions)."""

import numpy as np
import pytest

import nets
from nets import (
    AdaptiveAvgPool,
    AdaptiveMaxPool,
    AvgPool,
    Chain,
    Conv,
    ConvTranspose,
    Dense,
    Dropout,
    Flatten,
    LPPool,
    MaxPool,
    lanestep,
    layerwise,
)

CHAINS = {
    "lenet-like": lambda: Chain((1, 12, 12), Conv(3, (3, 3), "relu"), MaxPool((2, 2)),
                                Conv(4, (3, 3), "tanh", padding=1), AvgPool((2, 2)), Flatten(),
                                Dense(7, "elu(alpha=2.0)"), Dense(3)),
    # feature-major to the end: groups, dilation, overlapping windows, stride along H
    "feature-major throughout": lambda: Chain(
        (2, 9, 9), Conv(4, (3, 3), "relu", dilation=(1, 2), groups=2),
        MaxPool((3, 3), stride=2), Conv(3, (2, 2), "sigmoid", stride=(2, 1), padding=1),
        MaxPool((2, 2))),
    "1-d, bias-free": lambda: Chain((2, 16), Conv(3, (3,), "relu", bias=False), MaxPool((2,)),
                                    Conv(2, (2,), padding=1), Flatten(), Dense(3)),
    "3-d": lambda: Chain((1, 4, 5, 5), Conv(2, (2, 2, 2), "tanh", padding=(0, 1, 1)),
                         MaxPool((1, 2, 2)), Flatten(), Dense(3)),
    "transposed, strided, LP, adaptive": lambda: Chain(
        (2, 5, 5), ConvTranspose(3, (2, 2), "softplus", stride=2), Conv(2, (3, 3), stride=(2, 1)),
        LPPool(2, (2, 2)), AdaptiveMaxPool((2, 2)), AdaptiveAvgPool((1, 1)), Flatten(),
        Dense(3, "leaky_relu(negative_slope=0.2)")),
}


def _both(chain, loss, targets, rng, n=9):
    p = chain.init_params(seed=0)
    X2 = rng.normal(size=(n, chain.n_in))
    T = targets(n)
    rows = rng.permutation(n).astype(np.int64)
    ws = layerwise.LayerWorkspace(chain, n, np.float64, T.shape[1], 1)
    lane = ws.lanes[0]
    out = []
    for program in (False, None):  # compiled, then the per-layer path
        lane._program = program
        g = np.zeros_like(p)
        val = layerwise._step(chain, ws, X2, T, rows, 1, n, loss, 0.5, p, np.zeros(0), True, 0,
                              g, 1)
        out.append((val, g))
    return out


@pytest.mark.heavy
@pytest.mark.parametrize("name", CHAINS)
def test_compiled_step_is_the_per_layer_step(name, rng):
    chain = CHAINS[name]()
    program = chain.workspace(2).lanes[0].program(chain)
    # every chain here but the transposed one starts with a feature-major run
    assert program.table[0, lanestep.FM] == (not name.startswith("transposed"))
    # a relu before a max pooling folded into it (tiled 2 x 2 windows, overlapping ones)
    folded = name in ("lenet-like", "feature-major throughout", "1-d, bias-free")
    assert program.table[1, lanestep.CLAMP] == folded
    assert (program.table[0, lanestep.ACT] < 0) == folded
    if chain.n_out == 3:
        loss, targets = nets.LogitCrossEntropyLoss(), lambda n: rng.integers(0, 3, (n, 1)) * 1.0
    else:
        loss, targets = nets.SquaredLoss(), lambda n: rng.normal(size=(n, chain.n_out))
    (v1, g1), (v2, g2) = _both(chain, loss, targets, rng)
    np.testing.assert_allclose(v1, v2, rtol=1e-14)
    np.testing.assert_allclose(g1, g2, rtol=1e-13, atol=1e-15 * np.abs(g2).max())
    assert np.abs(g1).max() > 0


def test_chains_without_a_compiled_form_keep_the_per_layer_path():
    chain = Chain((1, 6, 6), Conv(2, (3, 3)), Dropout(0.5), Flatten(), Dense(2))
    assert chain.workspace(2).lanes[0].program(chain) is None


@pytest.mark.heavy
@pytest.mark.parametrize("optimizer, l1, l2", [
    (lambda: nets.Adam(1e-2), 0.0, 0.0),
    (lambda: nets.AdamW(1e-2, weight_decay=0.1), 1e-3, 0.0),
    (lambda: nets.SGD(1e-2, momentum=0.9), 1e-3, 1e-2),
], ids=["adam", "adamw-l1", "sgd-l1-l2"])
def test_compiled_epoch_is_the_stepwise_epoch(monkeypatch, rng, optimizer, l1, l2):
    # `train_epoch` (one call, lanes in a parallel loop, the update on blocks of the
    # parameters in parallel) against the same steps from Python: the same sums in the
    # same order, so the same parameters bit for bit (the penalty's value, summed by
    # blocks, may differ in its last bits)
    chain = CHAINS["lenet-like"]()
    X = rng.normal(size=(37, *chain.in_shape))
    y = rng.integers(0, 3, 37)
    out = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(layerwise.Lanes, "of", classmethod(lambda cls, c, ws: None))
        p = chain.init_params(seed=0)
        hist = nets.train(chain, p, X, y, loss=nets.LogitCrossEntropyLoss(l1=l1, l2=l2),
                          optimizer=optimizer(), epochs=2, batch_size=8, threads=2, seed=1)
        out.append((hist, p))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-13)
    np.testing.assert_array_equal(out[0][1], out[1][1])
    assert not np.array_equal(out[0][1], chain.init_params(seed=0))
