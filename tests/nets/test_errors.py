"""Bad input is refused with a message that names the argument."""

import numpy as np
import pytest

import nets
from nets import Chain, Dense
from nets.activations import BUILTIN


@pytest.fixture
def chain():
    return Chain(3, Dense(4, "tanh"), Dense(2))


@pytest.fixture
def data(rng):
    return rng.normal(size=(20, 3)), rng.normal(size=(20, 2))


def test_unknown_activation_lists_known_names():
    with pytest.raises(ValueError, match="unknown activation 'swish'") as err:
        Dense(3, "swish")
    for name in BUILTIN:
        assert name in str(err.value)


@pytest.mark.parametrize("make, arg", [
    (lambda: Chain(0, Dense(1)), "input_size"),
    (lambda: Chain(2), "layer"),
    (lambda: Dense(0), "out"),
    (lambda: Dense(2, activation=np.tanh), "activation"),
])
def test_bad_construction(make, arg):
    with pytest.raises((ValueError, TypeError), match=arg):
        make()


def test_call_wrong_x_shape(chain):
    p = chain.init_params()
    for x in (np.zeros(4), np.zeros((5, 2)), np.zeros((2, 2, 3))):
        with pytest.raises(ValueError, match="`x`"):
            chain(x, p)


def test_wrong_p(chain):
    p = chain.init_params()
    with pytest.raises(ValueError, match=f"`p` has length {chain.n_params - 1}"):
        chain(np.zeros(3), p[:-1])
    with pytest.raises(TypeError, match="`p`"):
        chain(np.zeros(3), list(p))
    with pytest.raises(TypeError, match="`p`"):
        chain(np.zeros(3), p.astype(np.int64))


def test_forward_into_buffers(chain):
    p = chain.init_params()
    ws = chain.workspace()
    x = np.zeros((5, 3))
    with pytest.raises(TypeError, match="`y` must have dtype float64"):
        chain.forward_into(np.empty((5, 2), np.float32), x, p, ws)
    with pytest.raises(ValueError, match="`y`"):
        chain.forward_into(np.empty((5, 3)), x, p, ws)
    with pytest.raises(ValueError, match="`y` has 4 samples"):
        chain.forward_into(np.empty((4, 2)), x, p, ws)
    with pytest.raises(ValueError, match="`x`"):
        chain.forward_into(np.empty((5, 2)), np.zeros((5, 4)), p, ws)
    with pytest.raises(TypeError, match="`x` must have dtype float64"):
        chain.forward_into(np.empty((5, 2)), x.astype(np.float32), p, ws)
    with pytest.raises(ValueError, match="`y`.*C-contiguous"):
        chain.forward_into(np.empty((2, 5)).T, x, p, ws)
    with pytest.raises(TypeError, match="`p` has dtype float32"):
        chain.forward_into(np.empty((5, 2)), x, p.astype(np.float32), ws)


def test_vjp_into_buffers(chain):
    p = chain.init_params()
    ws = chain.workspace()
    x, v = np.zeros((5, 3)), np.zeros((5, 2))
    with pytest.raises(TypeError, match="`pbar` must have dtype float64"):
        chain.vjp_into(np.empty((5, 3)), np.zeros(chain.n_params, np.float32), v, x, p, ws)
    with pytest.raises(ValueError, match="`pbar` must have shape"):
        chain.vjp_into(np.empty((5, 3)), np.zeros(chain.n_params + 1), v, x, p, ws)
    with pytest.raises(TypeError, match="`xbar` must have dtype float64"):
        chain.vjp_into(np.empty((5, 3), np.float32), np.zeros(chain.n_params), v, x, p, ws)
    with pytest.raises(ValueError, match="`v`"):
        chain.vjp_into(np.empty((5, 3)), np.zeros(chain.n_params), np.zeros((5, 3)), x, p, ws)
    with pytest.raises(ValueError, match="same number of samples"):
        chain.vjp_into(np.empty((4, 3)), np.zeros(chain.n_params), v, x, p, ws)


def test_jacobian_into_buffers(chain):
    p = chain.init_params()
    ws = chain.workspace()
    with pytest.raises(ValueError, match=r"`J` must have shape \(2, 3\)"):
        chain.jacobian_into(np.empty((3, 2)), np.zeros(3), p, ws)
    with pytest.raises(ValueError, match=r"`J` must have shape \(5, 2, 3\)"):
        chain.jacobian_into(np.empty((2, 3)), np.zeros((5, 3)), p, ws)
    with pytest.raises(TypeError, match="`J` must have dtype float64"):
        chain.jacobian_into(np.empty((2, 3), np.float32), np.zeros(3), p, ws)


def test_workspace_from_another_chain(chain):
    other = Chain(3, Dense(4, "tanh"), Dense(2))  # same shape, different chain
    p = chain.init_params()
    with pytest.raises(TypeError, match="`ws`"):
        chain.forward_into(np.empty(2), np.zeros(3), p, other.workspace())
    with pytest.raises(TypeError, match="`ws`"):
        chain.forward_into(np.empty(2), np.zeros(3), p, np.zeros(100))


def test_bad_workspace_arguments(chain):
    with pytest.raises(ValueError, match="`batch`"):
        chain.workspace(batch=0)
    with pytest.raises(TypeError, match="`dtype`"):
        chain.workspace(dtype=np.int32)
    with pytest.raises(TypeError, match="`dtype`"):
        chain.init_params(dtype=np.float16)


@pytest.mark.parametrize("where", ["X", "Y"])
def test_nan_in_data(where, chain, data):
    X, Y = data
    (X if where == "X" else Y)[3, 1] = np.nan
    p = chain.init_params()
    with pytest.raises(ValueError, match=rf"`{where}` contains NaN.*\(3, 1\)"):
        nets.loss_and_grad(chain, p, X, Y)
    with pytest.raises(ValueError, match=f"`{where}` contains NaN"):
        nets.train(chain, p, X, Y, iters=1)


def test_nan_in_params(chain, data):
    p = chain.init_params()
    p[0] = np.inf
    with pytest.raises(ValueError, match="`p` contains NaN or Inf"):
        nets.loss_and_grad(chain, p, *data)


def test_data_shapes(chain, data):
    X, Y = data
    p = chain.init_params()
    with pytest.raises(ValueError, match="`X`"):
        nets.loss_and_grad(chain, p, X[:, :2], Y)
    with pytest.raises(ValueError, match="`Y`"):
        nets.loss_and_grad(chain, p, X, Y[:10])
    with pytest.raises(ValueError, match="`X`"):
        nets.loss_and_grad(chain, p, X[:0], Y[:0])
    with pytest.raises(TypeError, match="`loss`"):
        nets.loss_and_grad(chain, p, X, Y, loss="mse")
    with pytest.raises(TypeError, match="`chain`"):
        nets.loss_and_grad(lambda x: x, p, X, Y)


def test_iters_epochs_batch_size(chain, data):
    X, Y = data
    p = chain.init_params()
    with pytest.raises(ValueError, match="exactly one of `iters`.*`epochs`"):
        nets.train(chain, p, X, Y)
    with pytest.raises(ValueError, match="exactly one of `iters`.*`epochs`"):
        nets.train(chain, p, X, Y, iters=5, epochs=5, batch_size=4)
    with pytest.raises(ValueError, match="`iters`"):
        nets.train(chain, p, X, Y, iters=0)
    with pytest.raises(ValueError, match="`batch_size`"):
        nets.train(chain, p, X, Y, epochs=1)
    for bad in (0, 21, 2.5, True):
        with pytest.raises(ValueError, match="`batch_size`"):
            nets.train(chain, p, X, Y, epochs=1, batch_size=bad)
    with pytest.raises(ValueError, match="`batch_size`"):
        nets.train(chain, p, X, Y, iters=1, batch_size=4)
    with pytest.raises(ValueError, match="`epochs`"):
        nets.train(chain, p, X, Y, optimizer=nets.LBFGS(), epochs=1, batch_size=4)
    with pytest.raises(TypeError, match="`optimizer`"):
        nets.train(chain, p, X, Y, optimizer="adam", iters=1)
    with pytest.raises(ValueError, match="`threads`"):
        nets.train(chain, p, X, Y, iters=1, threads=0)


def test_labels_for_cross_entropy(chain, data):
    X, _ = data
    p = chain.init_params()
    loss = nets.LogitCrossEntropyLoss()
    labels = np.arange(20) % 2
    for bad in (labels + 1, labels - 1):  # out of 0..n_out-1
        with pytest.raises(ValueError, match="`Y` labels must be in 0..1"):
            nets.loss_and_grad(chain, p, X, bad, loss=loss)
    with pytest.raises(TypeError, match="`Y`.*integer"):
        nets.loss_and_grad(chain, p, X, labels.astype(float), loss=loss)
    with pytest.raises(ValueError, match="`Y`"):
        nets.loss_and_grad(chain, p, X, labels.reshape(-1, 1), loss=loss)
    with pytest.raises(ValueError, match="`Y` labels"):
        nets.train(chain, p, X, labels + 1, loss=loss, iters=1)


def test_loss_penalties(chain):
    with pytest.raises(ValueError, match="`l1`"):
        nets.SquaredLoss(l1=-1.0)
    with pytest.raises(ValueError, match="`l2`"):
        nets.MeanSquaredLoss(l2=np.nan)


def test_register_activation_errors():
    with pytest.raises(ValueError, match="builtin"):
        nets.register_activation("tanh", lambda z: z, lambda z: 1.0)
    with pytest.raises(TypeError, match="`derivative`"):
        nets.register_activation("mine", lambda z: z, 1.0)
    assert "mine" not in nets.activation_names()
