"""The kernels allocate nothing per call.

Counted with numba's runtime statistics (NRT allocations). Calling a jitted
function from Python allocates one NRT MemInfo per ndarray argument while
unboxing it (freed on return), so per-call counts are measured two ways:

* kernels called from a jitted loop (`tests.alloc.repeat`), where arguments are unboxed
  once: the count for 21 calls must equal the count for 1 call;
* the chain methods called from Python: the count per call must be exactly
  the unboxing of the ndarrays the method passes to its kernel.

The arguments are those the public functions pass, recorded by wrapping the
chain's kernel table, so these tests follow the kernels' signatures.
"""

import tracemalloc

import numba
import numpy as np
import pytest

import nets
from nets import Chain, Dense
from nets import kernels as K

from ..alloc import allocations_in, allocs, n_arrays, needs_jit
from . import reference as ref

pytestmark = [needs_jit, pytest.mark.usefixtures("nrt_stats")]

CALLS = 20


def allocations_per_call(kernel, args):
    """Allocations inside `kernel(*args)` per call (unboxing excluded)."""
    return allocations_in(kernel, args, CALLS)[1]


class Recorder:
    """Wraps entries of `chain._kernels` to keep the arguments of their last call."""

    def __init__(self, chain, *names):
        self.args = {}
        table = dict(chain._kernels)
        for name in names:
            table[name] = self._wrap(name, chain._kernels[name])
        chain._kernels = table

    def _wrap(self, name, kernel):
        def spy(*args):
            self.args[name] = args
            return kernel(*args)
        return spy




@pytest.fixture
def setup(rng):
    chain = Chain(5, Dense(13, "tanh"), Dense(6, "gelu"), Dense(3))
    p = ref.random_params(chain, rng)
    X = rng.normal(size=(300, 5))
    return chain, p, X


def test_measurement_sees_allocations():
    # Positive control: a kernel that allocates is caught.
    @numba.njit
    def allocating(n):
        return np.empty(n).sum()

    assert allocations_per_call(allocating, (10,)) == 1


@pytest.mark.parametrize("n", [None, 1, 300])
def test_chain_kernels(n, setup):
    chain, p, X = setup
    ws = chain.workspace()
    x = X[0] if n is None else np.ascontiguousarray(X[:n])
    y = np.empty(x.shape[:-1] + (3,))
    v = np.ones_like(y)
    xbar, pbar = np.empty_like(x), np.zeros(chain.n_params)
    J = np.empty(x.shape[:-1] + (3, 5))
    # One sample (1-D x) runs the matrix-vector kernels, a batch the chunked ones.
    suffix = "1" if n is None else ""
    rec = Recorder(chain, *(k + suffix for k in ("forward", "vjp", "jacobian")))
    calls = {"forward" + suffix: lambda: chain.forward_into(y, x, p, ws),
             "vjp" + suffix: lambda: chain.vjp_into(xbar, pbar, v, x, p, ws),
             "jacobian" + suffix: lambda: chain.jacobian_into(J, x, p, ws)}
    for name, call in calls.items():
        call()  # warm-up: compiles or loads the kernel
        a0 = allocs()
        for _ in range(CALLS):
            call()
        per_call = (allocs() - a0) / CALLS
        args = rec.args[name]
        assert per_call == n_arrays(args), name  # unboxing only
        assert allocations_per_call(K.__dict__[name], args) == 0, name


def test_chain_methods_do_not_copy_arrays(setup):
    # Python side: the wrappers make views, never copies of the data.
    chain, p, _ = setup
    X = np.random.default_rng(0).normal(size=(4096, 5))
    Y = np.empty((4096, 3))
    ws = chain.workspace()
    chain.forward_into(Y, X, p, ws)
    tracemalloc.start()
    try:
        for _ in range(3):
            chain.forward_into(Y, X, p, ws)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < X.nbytes // 8


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("loss", [nets.SquaredLoss(l1=0.1), nets.LogitCrossEntropyLoss()],
                         ids=lambda l: type(l).__name__)
def test_loss_grad(threads, loss, setup):
    chain, p, X = setup
    Y = np.arange(len(X)) % 3 if isinstance(loss, nets.LogitCrossEntropyLoss) \
        else np.zeros((len(X), 3))
    rec = Recorder(chain, "loss_grad", "penalty")
    nets.loss_and_grad(chain, p, X, Y, loss=loss, threads=threads)
    assert allocations_per_call(K.loss_grad, rec.args["loss_grad"]) == 0
    assert allocations_per_call(K.penalty, rec.args["penalty"]) == 0


@pytest.mark.parametrize("mode", ["iters", "epochs"])
def test_train_steps(mode, setup):
    chain, p, X = setup
    Y = np.zeros((len(X), 3))
    rec = Recorder(chain, "train_steps")
    kw = dict(iters=2) if mode == "iters" else dict(epochs=1, batch_size=64)
    nets.train(chain, p, X, Y, loss=nets.MeanSquaredLoss(l2=1e-3),
               optimizer=nets.AdamW(1e-3), threads=2, **kw)
    assert allocations_per_call(K.train_steps, rec.args["train_steps"]) == 0


def test_optimizer_step(rng):
    p, g = rng.normal(size=50), rng.normal(size=50)
    for opt in (nets.Adam(), nets.AdamW(), nets.SGD(momentum=0.9, nesterov=True)):
        opt.init(p)
        args = (opt.code, opt.hyper(), p, g, opt.m, opt.v, 1)
        assert allocations_per_call(K.optimizer_step, args) == 0
