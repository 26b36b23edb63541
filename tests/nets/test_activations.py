"""The activation table (`nets.activations`) row by row: kernels, numpy references,
formulas, JAX and PyTorch, at kinks too; constants (``"elu(alpha=2.0)"``) in the registry.

Chains with each activation, in float64 and float32, are tested in test_forward /
test_backward / test_jax (parametrised over every builtin); here
the scalar forms are compared with each other and with PyTorch on a grid that holds every
kink, so the derivative conventions at kinks are checked, not only between them.
"""

import math

import numpy as np
import pytest

from nets import Chain, Dense, loss_and_grad
from nets import activations as A
from nets import registry as R

KINKS = [-6.0, -3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0]
GRID = np.concatenate([np.linspace(-8, 8, 1601), KINKS, [-1e-3, 1e-3, -30.0, 30.0]])
# constants other than the defaults, for the rows that have them
OTHER = {"elu": (2.0,), "celu": (0.5,), "leaky_relu": (0.2,), "hardtanh": (-0.5, 2.0)}
NEW = ("relu6", "hardtanh", "hardswish", "hardsigmoid", "selu", "leaky_relu", "logsigmoid",
       "tanhshrink", "softsign", "mish", "celu", "gelu_erf")


def kernel(name, z, consts=None, dtype=np.float64):
    """(value, derivative) by the compiled row kernel, with `consts` if given."""
    z = np.asarray(z, dtype=dtype)
    buf = np.concatenate([z, np.zeros_like(z)])
    n = z.size
    if consts is None:
        A.activate_row(A.CODES[name], buf, 0, n, n, True)
    else:
        c = (tuple(consts) + (0.0, 0.0))[:2]
        A.activate_row_c(A.CODES[name], c[0], c[1], buf, 0, n, n, True)
    value_only = z.copy()
    if consts is None:
        A.activate_row(A.CODES[name], value_only, 0, 0, n, False)
        # (fastmath may contract the two passes differently: gelu's z (1 + t) near 0)
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(value_only, buf[:n], rtol=8 * eps, atol=8 * eps,
                                   err_msg=f"{name}: value-only pass")
    return buf[:n], buf[n:]


def cases():
    for a in A.TABLE:
        yield pytest.param(a.name, None, id=a.name)
        if a.name in OTHER:
            yield pytest.param(a.name, OTHER[a.name], id=f"{a.name}-{OTHER[a.name]}")


@pytest.mark.parametrize("name, consts", list(cases()))
def test_kernel_matches_reference_and_reference_matches_differences(name, consts):
    c = () if consts is None else consts
    v, d = kernel(name, GRID, consts)
    rv, rd = A.reference(name, GRID, *c)
    # (gelu's tanh form cancels in 1 + t at z << 0: errors of a few 1e-15 absolute)
    np.testing.assert_allclose(v, rv, rtol=4e-15, atol=1e-14)
    np.testing.assert_allclose(d, rd, rtol=4e-15, atol=1e-14)
    # the reference derivative against central differences of the reference value, off kinks
    h = 1e-6
    off = np.min(np.abs(GRID[:, None] - np.array(KINKS + list(c))[None, :]), axis=1) > 1e-3
    fd = (A.reference(name, GRID + h, *c)[0] - A.reference(name, GRID - h, *c)[0]) / (2 * h)
    np.testing.assert_allclose(rd[off], fd[off], rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["relu", "leaky_relu"])
def test_relus_keep_nan_and_infinities(name, dtype):
    """relu's row is LLVM's `maximum` (`activations._maximum`, not a select that LLVM
    turned into masked stores): NaN stays NaN, -inf goes to 0 (leaky: -inf), as numpy's."""
    z = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.5, 2.5] * 5, dtype)  # past a vector
    v, d = kernel(name, z, dtype=dtype)
    rv, rd = A.reference(name, z.astype(np.float64))
    np.testing.assert_array_equal(v, rv.astype(dtype))
    np.testing.assert_array_equal(d, rd.astype(dtype))


def test_tanhshrink_has_no_cancellation_near_zero():
    z = np.array([1e-8, -3e-4, 2e-2, 0.3, 0.6])
    series = A._TANHSHRINK_SERIES  # of z - tanh z
    exact = np.array([x - math.tanh(x) if abs(x) > 0.1 else
                      sum(c * x ** (2 * k + 3) for k, c in enumerate(series[:5])) for x in z])
    # (float32 runs the same float64 code: tests/nets/test_forward.py's extremes check it)
    v, _ = kernel("tanhshrink", z)
    np.testing.assert_allclose(v, exact, rtol=1e-13)


def test_a_chain_makes_the_row_kernels_of_its_activations_only(monkeypatch):
    # Kernels apply an activation through the address of its row kernel, made on first use
    # for one activation and one dtype: a chain compiles (or loads from the disk cache) the
    # row kernels of its own activations, in the dtype it runs in, and no others.
    monkeypatch.setattr(A, "_rows", {})
    chain = Chain(3, Dense(5, "softsign"), Dense(2))
    p = chain.init_params(seed=0, dtype=np.float32)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    chain(x, p)
    loss_and_grad(chain, p, x, np.zeros((4, 2)))
    f32 = np.dtype(np.float32)
    assert set(A._rows) == {(A.CODES["softsign"], f32), (A.CODES["identity"], f32)}


def test_rows_outside_the_buffer_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        A.activate_row(A.CODES["tanh"], np.zeros(4), 0, 2, 3, True)
    with pytest.raises(ValueError, match="C-contiguous float32 or float64"):
        A.activate_row(A.CODES["tanh"], np.zeros(8)[::2], 0, 2, 2, True)


class NumpyMath:
    """numpy as the math namespace of a `Formula` (sciml passes sympy)."""

    tanh, exp, log1p, expm1, abs, maximum, where = (np.tanh, np.exp, np.log1p, np.expm1,
                                                    np.abs, np.maximum, np.where)
    sigmoid = staticmethod(lambda z: 1 / (1 + np.exp(-z)))
    erfc = staticmethod(np.vectorize(math.erfc, otypes=[float]))


@pytest.mark.parametrize("name, consts", list(cases()))
def test_formula_matches_kernel(name, consts):
    spec = name if consts is None else R.spec(name, **dict(
        zip((k for k, _ in A.BY_NAME[name].constants), consts)))
    f = R.formula(spec)
    z = GRID[np.abs(GRID) < 20]  # numpy's exp in the formulas overflows where sympy's is fine
    v, d = kernel(name, z, consts)
    with np.errstate(over="ignore"):
        a = np.broadcast_to(f.value(z, NumpyMath), z.shape)
        np.testing.assert_allclose(a, v, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(np.broadcast_to(f.slope(z, a, NumpyMath), z.shape), d,
                                   rtol=1e-13, atol=1e-14)


# PyTorch's functional names and keywords for each row (the PEtab format uses them)
TORCH = {"identity": None, "rbf": None, "gelu": ("gelu", {"approximate": "tanh"}),
         "gelu_erf": ("gelu", {}), "logsigmoid": ("logsigmoid", {}),
         "elu": ("elu", {"alpha": 2.0}), "celu": ("celu", {"alpha": 0.5}),
         "leaky_relu": ("leaky_relu", {"negative_slope": 0.2}),
         "hardtanh": ("hardtanh", {"min_val": -0.5, "max_val": 2.0})}


@pytest.mark.parametrize("name", [n for n in A.BUILTIN if TORCH.get(n, 1) is not None])
def test_pytorch_values_and_gradients_at_kinks(name):
    torch = pytest.importorskip("torch")
    fname, kw = TORCH.get(name, (name, {}))
    fn = getattr(torch.nn.functional, fname, None) or getattr(torch, fname)
    x = torch.tensor(GRID, dtype=torch.float64, requires_grad=True)
    y = fn(x, **kw)
    y.sum().backward()
    consts = tuple(kw.values()) if name in OTHER else None
    v, d = kernel(name, GRID, consts)
    np.testing.assert_allclose(v, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    # PyTorch's hardsigmoid gradient is 1/6 rounded to float32
    np.testing.assert_allclose(d, x.grad.numpy(), rtol=1e-7 if name == "hardsigmoid" else 1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", NEW + ("elu",))
def test_jax_function_values_and_gradients(name):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    act = A.BY_NAME[name]
    consts = OTHER.get(name, ())
    z = jnp.asarray(GRID)
    f = lambda t: act.jax(t, jnp, jax.nn, *consts)  # noqa: E731
    v, d = kernel(name, GRID, consts or None)
    np.testing.assert_allclose(np.asarray(f(z)), v, rtol=1e-13, atol=1e-14)
    g = jax.vmap(jax.grad(f))(z)
    np.testing.assert_allclose(np.asarray(g), d, rtol=1e-12, atol=1e-13)


def test_names_with_constants():
    assert R.spec("elu", alpha=2.0) == "elu(alpha=2.0)"
    assert R.spec("elu", alpha=1.0) == "elu"
    assert R.spec("hardtanh", max_val=6) == "hardtanh(min_val=-1.0, max_val=6.0)"
    assert R.resolve("hardtanh(min_val=-1.0, max_val=6.0)") == (A.CODES["hardtanh"], -1.0, 6.0)
    assert R.resolve("leaky_relu") == (A.CODES["leaky_relu"], 0.01, 0.0)
    assert R.resolve("tanh") == (A.CODES["tanh"], 0.0, 0.0)
    assert R.constants("celu( alpha = 3 )") == {"alpha": 3.0}
    assert R.code("elu(alpha=1.0)") == A.CODES["elu"] and R.is_builtin("elu(alpha=2.0)")
    assert not R.is_builtin("elu(beta=2.0)") and not R.is_builtin("nope")


@pytest.mark.parametrize("name, match", [
    ("elu(beta=2.0)", r"elu takes the constants alpha \(as in 'elu\(alpha=1.0\)'\), got "
                      r"'beta=2.0'"),
    ("tanh(alpha=1.0)", "tanh takes no constants"),
    ("elu(alpha=big)", "`alpha` must be a number, got 'big'"),
    ("celu(alpha=0)", "alpha must not be 0"),
    ("swish(beta=1)", "unknown activation 'swish\\(beta=1\\)'"),
    ("elu(alpha=2.0)", "constants other than the defaults need a kernel"),
])
def test_bad_names_with_constants(name, match):
    with pytest.raises(ValueError, match=match):
        R.code(name)


def test_spec_errors():
    with pytest.raises(ValueError, match="takes the constants negative_slope, got 'alpha'"):
        R.spec("leaky_relu", alpha=1.0)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        R.spec("swish")
    with pytest.raises(ValueError, match="form of one with constants"):
        R.register_activation("elu(alpha=3)", lambda z: z, lambda z: 1.0)
