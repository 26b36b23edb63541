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
from .registry import is_builtin

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
    the kernels' derivatives at kinks (relu'(0) = 0, elu'(0) = 1)."""
    jax, jnp = _jax()
    fn = _act.BY_NAME[name].jax
    return lambda z: fn(z, jnp, jax.nn)


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
    """Per-layer ``(W, b)`` pairs sliced from the flat vector `p`.

    Parameters
    ----------
    chain : nets.Chain
    p : array, (n_params,)
        numpy or JAX array (also a tracer inside ``jax.grad`` / ``jax.jit``).

    Returns
    -------
    list of tuple
        One ``(W, b)`` per layer: ``W`` of shape ``(out, in)``, ``b`` of
        shape ``(out,)`` or None for a layer without bias. JAX arrays in the
        dtype of `p`.
    """
    _check_chain(chain, "params_to_pytree")
    _check_p(chain, p, "params_to_pytree")
    _, jnp = _jax()
    p = jnp.asarray(p)
    out = []
    for nin, nout, _, woff, boff in chain.meta.tolist():
        W = p[woff:woff + nin * nout].reshape(nout, nin)
        b = p[boff:boff + nout] if boff >= 0 else None
        out.append((W, b))
    return out


def pytree_to_params(chain, tree):
    """The inverse of `params_to_pytree`: one flat JAX vector of length ``n_params``.

    Parameters
    ----------
    chain : nets.Chain
    tree : list of (W, b)
        As returned by `params_to_pytree` (``b`` None where the layer has no bias).

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
    for l, ((W, b), (nin, nout, _, _, boff)) in enumerate(zip(tree, chain.meta.tolist())):
        if tuple(W.shape) != (nout, nin):
            raise ValueError(f"nets.jax.pytree_to_params: layer {l} weight must have shape "
                             f"{(nout, nin)}, got {tuple(W.shape)}")
        parts.append(jnp.ravel(W))
        if (boff >= 0) != (b is not None):
            raise ValueError(f"nets.jax.pytree_to_params: layer {l} "
                             + ("needs a bias" if boff >= 0 else "has no bias, got one"))
        if b is not None:
            if tuple(b.shape) != (nout,):
                raise ValueError(f"nets.jax.pytree_to_params: layer {l} bias must have "
                                 f"shape ({nout},), got {tuple(b.shape)}")
            parts.append(b)
    return jnp.concatenate(parts)


def _resolve(chain, activations):
    """One JAX function per layer; custom activations only from `activations`."""
    extra = {} if activations is None else dict(activations)
    fns = []
    for l, layer in enumerate(chain.layers):
        name = layer.activation
        if name in extra:
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


def apply(chain, p, x, *, activations=None):
    """Evaluate `chain` at `x` in JAX: the same function as ``chain(x, p)``.

    Parameters
    ----------
    chain : nets.Chain
        Its builtin activations are supported; a custom one (registered with
        `nets.register_activation`) raises unless given in `activations`.
    p : array, (n_params,)
        Flat parameters, numpy or JAX (float32 or float64).
    x : array, (n_in,) or (N, n_in)
        One sample or a batch (batch first). Cast to the dtype of `p`, like
        ``chain(x, p)`` does.
    activations : dict, optional
        ``{name: fn}``, JAX functions for custom activations (elementwise,
        applied to the pre-activation); also overrides builtin names.

    Returns
    -------
    jax.Array
        ``(n_out,)`` or ``(N, n_out)``, dtype of `p`.

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
    dtype = layers[0][0].dtype
    h = jnp.asarray(x, dtype=dtype)
    if h.ndim not in (1, 2) or h.shape[-1] != chain.n_in:
        raise ValueError(f"nets.jax.apply: `x` must have shape ({chain.n_in},) or "
                         f"(N, {chain.n_in}), got {tuple(np.shape(x))}")
    for (W, b), act in zip(layers, fns):
        z = h @ W.T
        if b is not None:
            z = z + b
        h = act(z)
    return h
