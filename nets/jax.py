"""The same networks in JAX, on the same flat parameter vector.

``nets.jax.apply(chain, p, x)`` computes exactly what ``chain(x, p)``
computes, as a JAX function of ``p`` and ``x``: it can be differentiated,
jitted (with `chain` static) and vmapped. Parameters use the layout of
`nets.Chain`: per layer the weight ``(out, in)`` row-major, then the bias
``(out,)`` if the layer has one.

JAX is imported on first use, here only: ``import nets`` never imports it.
Enable float64 with ``jax.config.update("jax_enable_x64", True)`` to compare
with float64 numba results; without it JAX computes in float32.

Examples
--------
>>> import jax
>>> import numpy as np
>>> import nets.jax
>>> from nets import Chain, Dense
>>> chain = Chain(2, Dense(8, "tanh"), Dense(1))
>>> p = chain.init_params(seed=0, dtype=np.float32)
>>> x = np.zeros((5, 2), np.float32)
>>> nets.jax.apply(chain, p, x).shape
(5, 1)
>>> g = jax.grad(lambda q: nets.jax.apply(chain, q, x).sum())(p)
>>> g.shape == p.shape
True
"""


import numpy as np

from . import activations as _act
from .chain import Chain
from .layers import Context, Layer
from .registry import is_builtin, parse
from .rng import layer_key

__all__ = ["apply", "params_to_pytree", "pytree_to_params", "ACTIVATIONS"]


# The builtin activations (each row of `nets.activations.TABLE` has its JAX function).
ACTIVATIONS = _act.BUILTIN


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nets.jax needs JAX: pip install 'sciml-nets[jax]'") from e
    return jax, jnp


def _activation(name):
    """The JAX function of a builtin activation (its row of `nets.activations.TABLE`), with
    the kernels' derivatives at kinks (relu'(0) = 0, elu'(0) = alpha), its constants bound
    (``"elu(alpha=2.0)"``)."""
    jax, jnp = _jax()
    act, consts = parse(name)
    return lambda z: act.jax(z, jnp, jax.nn, *consts)


def _check_chain(chain, fname):
    if not isinstance(chain, Chain):
        raise TypeError(f"nets.jax.{fname}: `chain` must be a nets.Chain, "
                        f"got {type(chain).__name__}")


def _check_p(chain, p, fname):
    shape = getattr(p, "shape", None)
    if shape is None or tuple(shape) != (chain.n_params,):
        raise ValueError(f"nets.jax.{fname}: `p` must have shape ({chain.n_params},) "
                         f"(the chain's n_params), got {shape}")


def params_to_pytree(chain, p):
    """Per layer a dict name -> array sliced from the flat vector `p`: the names and shapes
    of `nets.Chain.views` (a Dense layer ``{"weight": (out, in), "bias": (out,)}``, no
    ``"bias"`` without bias; a layer without parameters ``{}``), for every chain.

    Parameters
    ----------
    chain : nets.Chain
    p : array, (n_params,)
        numpy or JAX array (also a tracer inside ``jax.grad`` / ``jax.jit``).

    Returns
    -------
    list of dict
        JAX arrays in the dtype of `p`, one dict per layer.
    """
    _check_chain(chain, "params_to_pytree")
    _check_p(chain, p, "params_to_pytree")
    _, jnp = _jax()
    p = jnp.asarray(p)
    return [Layer.unpack(L.layer.param_shapes(L.in_shape), p[L.poff:L.poff + L.n_params])
            for L in chain._plan]


def pytree_to_params(chain, tree):
    """The inverse of `params_to_pytree`: one flat JAX vector of length ``n_params``.

    Parameters
    ----------
    chain : nets.Chain
    tree : list of dict
        As returned by `params_to_pytree`: per layer exactly its arrays by name.

    Returns
    -------
    jax.Array, (n_params,)
    """
    _check_chain(chain, "pytree_to_params")
    _, jnp = _jax()
    if len(tree) != len(chain.layers):
        raise ValueError(f"nets.jax.pytree_to_params: `tree` has {len(tree)} layers, "
                         f"the chain has {len(chain.layers)}")
    parts = []
    for l, (arrays, L) in enumerate(zip(tree, chain._plan)):
        shapes = L.layer.param_shapes(L.in_shape)
        if not isinstance(arrays, dict):
            raise TypeError(f"nets.jax.pytree_to_params: layer {l} must be a dict name -> "
                            f"array, got {type(arrays).__name__}")
        extra = set(arrays) - {name for name, _ in shapes}
        if extra:
            raise ValueError(f"nets.jax.pytree_to_params: layer {l} has no array "
                             f"{', '.join(map(repr, sorted(extra)))}; its arrays are "
                             f"{[name for name, _ in shapes]}")
        for name, shape in shapes:
            a = arrays.get(name)
            if a is None or tuple(a.shape) != tuple(shape):
                raise ValueError(f"nets.jax.pytree_to_params: layer {l} needs {name!r} of "
                                 f"shape {tuple(shape)}, got "
                                 f"{None if a is None else tuple(a.shape)}")
            parts.append(jnp.ravel(a))
    return jnp.concatenate(parts) if parts else jnp.zeros(0)


def _resolve(chain, activations):
    """One JAX function per layer (None: no activation); custom activations only from
    `activations`."""
    extra = {} if activations is None else dict(activations)
    fns = []
    for l, layer in enumerate(chain.layers):
        name = getattr(layer, "activation", None)
        if name is None or (name == "identity" and name not in extra):
            fns.append(None)
        elif name in extra:
            fns.append(extra[name])
        elif is_builtin(name):
            fns.append(_activation(name))
        else:
            raise NotImplementedError(
                f"nets.jax.apply: layer {l} uses the custom activation {name!r}, which has "
                f"no JAX version (numba functions cannot run in JAX); builtin activations "
                f"are {', '.join(ACTIVATIONS)}. Pass a JAX function for it with "
                f"`activations={{{name!r}: fn}}`.")
    return fns


def apply(chain, p, x, *, activations=None, state=None, training=False, seed=0):
    """Evaluate `chain` at `x` in JAX: the same function as ``chain(x, p)``.

    Parameters
    ----------
    chain : nets.Chain
        Its builtin activations are supported; a custom one (registered with
        `nets.register_activation`) raises unless given in `activations`.
    p : array, (n_params,)
        Flat parameters, numpy or JAX (float32 or float64).
    x : array, ``chain.in_shape`` or (N, *in_shape)
        One sample or a batch (batch first; a chain on vectors: (n_in,) or (N, n_in)).
        Cast to the dtype of `p`, like ``chain(x, p)`` does.
    activations : dict, optional
        ``{name: fn}``, JAX functions for custom activations (elementwise,
        applied to the pre-activation); also overrides builtin names.

    state, training, seed
        As in ``chain(x, p, ...)`` for chains with running statistics or random
        masks (state default: ``chain.default_state(dtype)``; read, never updated).

    Returns
    -------
    jax.Array
        ``out_shape`` or ``(N, *out_shape)``, dtype of `p`.

    Raises
    ------
    NotImplementedError
        A layer uses a custom activation not given in `activations`.
    ValueError
        `p` or `x` has the wrong shape.

    Notes
    -----
    Under ``jax.jit`` pass `chain` as a static argument, e.g.
    ``jax.jit(nets.jax.apply, static_argnums=0)``.
    """
    _check_chain(chain, "apply")
    fns = _resolve(chain, activations)
    layers = params_to_pytree(chain, p)
    _, jnp = _jax()
    dtype = jnp.asarray(p).dtype
    h = jnp.asarray(x, dtype=dtype)
    one = tuple(h.shape) == chain.in_shape
    if one:
        h = h[None]
    if tuple(h.shape[1:]) != chain.in_shape or h.ndim != len(chain.in_shape) + 1:
        raise ValueError(f"nets.jax.apply: `x` must have shape {chain.in_shape} or "
                         f"(N, {', '.join(map(str, chain.in_shape))}), got "
                         f"{tuple(np.shape(x))}")
    s = chain.default_state(np.dtype(dtype)) if state is None else state
    s = jnp.asarray(s, dtype=dtype)
    for l, (L, params, act) in enumerate(zip(chain._plan, layers, fns)):
        st = Layer.unpack(L.layer.state_shapes(L.in_shape), s[L.soff:L.soff + L.n_state])
        ctx = Context(training, layer_key(seed, 0, l), 1, l)
        h = L.layer.jax_apply(params, st, h, ctx)
        if act is not None:
            h = act(h)
    return h[0] if one else h
