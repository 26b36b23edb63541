"""`Model`: an ODE right-hand side traced once and compiled into derivative kernels.

A model holds its traced functions and compiles their kernels on first need
(`sciml.model.assembly`): ``f`` and its derivatives (Jacobian, parameter
Jacobian, vector-Jacobian product, second-order ``hvp``), the observables
and their vjp, and the initial-value functions of its problems. The solvers
and sensitivity loops are not part of a model: they are compiled once for all
models (`sciml.solvers.kernels`) and call the kernels through the model's
kernel table.
"""

import threading
import warnings

import numpy as np

from nets import Chain
from nets import registry as _registry

from .assembly import Assembly, KernelSet, call
from .derivatives import NetSpec
from .trace import ModelError, check_names, trace_initial, trace_model, trace_observables

__all__ = ["Model", "NeuralODE", "ModelError", "ParamViews", "CacheWarning"]


class CacheWarning(UserWarning):
    """A part of a model that is compiled in every process (a custom activation)."""


_WARNED = set()


class ParamViews:
    """Named views of a flat parameter vector (from `Model.unpack`).

    Mechanistic parameters read as floats and can be assigned
    (``v.alpha = 1.5`` writes the vector); each network's parameters are a
    1-D view (``v.U``). ``v.theta`` is the whole vector.
    """

    def __init__(self, theta, slices, mech):
        object.__setattr__(self, "theta", theta)
        object.__setattr__(self, "_slices", slices)
        object.__setattr__(self, "_mech", mech)

    def __getattr__(self, name):
        slices = self.__dict__["_slices"]
        if name not in slices:
            raise AttributeError(f"no parameter or net named {name!r}; known: "
                                 f"{', '.join(slices)}")
        s = slices[name]
        return float(self.theta[s.start]) if name in self._mech else self.theta[s]

    __getitem__ = __getattr__

    def __setattr__(self, name, value):
        if name not in self._slices:
            raise AttributeError(f"no parameter or net named {name!r}; known: "
                                 f"{', '.join(self._slices)}")
        self.theta[self._slices[name]] = value

    __setitem__ = __setattr__

    def __dir__(self):
        return list(self._slices)

    def __repr__(self):
        parts = [f"{k}={self.theta[s.start]:.6g}" if k in self._mech
                 else f"{k}=<{s.stop - s.start} params>" for k, s in self._slices.items()]
        return f"ParamViews({', '.join(parts)})"


def _check_nets(nets):
    if nets is None:
        return {}
    if not isinstance(nets, dict):
        raise TypeError(f"`nets` must be a dict of name -> nets.Chain, got {type(nets).__name__}")
    check_names("nets", list(nets))
    for name, chain in nets.items():
        if not isinstance(chain, Chain):
            raise TypeError(f"`nets[{name!r}]` must be a nets.Chain, got {type(chain).__name__}")
        if chain.dense_layers is None:
            raise ValueError(f"`nets[{name!r}]` must be a chain of Dense layers on vectors "
                             f"inside a model, got {chain!r}")
        for act in {l.activation for l in chain.layers} - set(_WARNED):
            if not _registry.is_builtin(act):
                _WARNED.add(act)
                warnings.warn(f"`nets[{name!r}]` uses the custom activation {act!r}: its numba "
                              "functions are compiled once in each process that uses them "
                              "(not cached on disk)", CacheWarning, stacklevel=4)
    return dict(nets)


def _check_observables(observables):
    if observables is None:
        return {}
    if not isinstance(observables, dict):
        raise TypeError("`observables` must be a dict of name -> function g(u, p) (or "
                        f"g(u, p, t) or g(u, p, t, nets)), got {type(observables).__name__}")
    check_names("observables", list(observables))
    return dict(observables)


def _distinct(**groups):
    seen = {}
    for kind, names in groups.items():
        for n in names:
            if n in seen:
                raise ValueError(f"{n!r} is both in `{seen[n]}` and in `{kind}`; names must "
                                 "be distinct")
            seen[n] = kind


def _vector(name, x, n):
    a = np.ascontiguousarray(x, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"`{name}` must have shape ({n},), got {a.shape}")
    return a


def _mass_diagonal(M, n):
    """The diagonal of a mass matrix (float64 (n,)), or None for none (or the identity)."""
    if M is None:
        return None
    a = np.asarray(M, dtype=np.float64)
    if a.ndim == 2:
        if a.shape != (n, n):
            raise ValueError(f"`mass_matrix` must be ({n}, {n}) or its diagonal ({n},), got "
                             f"shape {a.shape}")
        if np.any(a - np.diag(np.diag(a))):
            raise ValueError("`mass_matrix` must be diagonal (semi-explicit DAEs); a full "
                             "mass matrix is not supported yet")
        a = np.diag(a).copy()
    if a.shape != (n,):
        raise ValueError(f"`mass_matrix` must be ({n}, {n}) or its diagonal ({n},), got "
                         f"shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"`mass_matrix` must be finite and >= 0 on its diagonal, got {a}")
    return None if np.all(a == 1.0) else np.ascontiguousarray(a)


class Model:
    """An ODE model ``du/dt = f(u, p, t)`` with embedded networks, compiled to kernels.

    Parameters
    ----------
    f : callable
        ``f(u, p, t, nets)`` (or ``f(u, p, t)`` without networks) returning the
        list of derivatives, one per state. Inside, ``u`` and ``p`` are read by
        name (``u.central``, ``p.ka``), by position (``u[0]``) or by unpacking
        (``x, y = u``); ``nets.U(xs)`` evaluates network ``U`` on a list of
        inputs and returns its outputs. Use arithmetic and numpy functions
        (``np.exp``, ``np.where(cond, a, b)`` for piecewise terms, ...); the
        function runs once, on symbols, so it must not branch on values.
    states : sequence of str
        State names, in the order of ``u``.
    params : sequence of str
        Mechanistic parameter names, first in the flat parameter vector.
    nets : dict of str -> nets.Chain, optional
        Embedded networks; their parameters follow the mechanistic ones in the
        flat vector, in this order. Custom activations (`nets.register_activation`)
        are allowed; their numba functions compile once per process.
    observables : dict of str -> callable, optional
        ``g(u, p)``, ``g(u, p, t)`` or ``g(u, p, t, nets)``, each returning one
        value; they may call the model's networks.
    mass_matrix : array_like, optional
        ``M`` of ``M du/dt = f(u, p, t)``: its diagonal (n,) or the diagonal
        (n, n) matrix. Zeros make their rows algebraic equations ``0 = f_i``
        (a semi-explicit index-1 DAE, e.g. a conservation law or an SBML
        algebraic rule); `sciml.Rodas5` and `sciml.BDF` solve it, starting from
        initial values made consistent (Newton on the algebraic states).

    Raises
    ------
    ModelError
        If the function cannot be traced; the message names the place in it.

    Examples
    --------
    >>> def lotka_volterra(u, p, t, nets):
    ...     x, y = u
    ...     z = nets.U(u)
    ...     return [p.alpha * x + z[0], -p.delta * y + z[1]]
    >>> from nets import Chain, Dense
    >>> U = Chain(2, Dense(5, "rbf"), Dense(2))
    >>> model = Model(lotka_volterra, ["x", "y"], ["alpha", "delta"], nets={"U": U})
    >>> theta = model.init_params(seed=0, alpha=1.3, delta=1.8)
    """

    # The traced expressions (a `sciml.model.trace.Trace` for f and one for the
    # observables); None for a model made with `from_kernels`, which has no traced f.
    _trace = None
    _obs_trace = None
    _mass = None  # the mass matrix's diagonal, for M du/dt = f (None: an ODE)

    def __init__(self, f, states, params, nets=None, observables=None, mass_matrix=None):
        _compile_ahead()
        states, params, nets, observables = self._check(states, params, nets, observables)
        self._mass = _mass_diagonal(mass_matrix, len(states))
        trace = trace_model(f, states, params, nets)
        specs, n_params = self._net_specs(nets, len(params))
        sets = {"f": KernelSet(trace, specs, n_params)}
        obs = None
        if observables:
            obs = trace_observables(observables, states, params, nets)
            sets["g"] = KernelSet(obs, specs, n_params, strong_zero=True)
        name = getattr(f, "__name__", type(f).__name__)
        asm = Assembly(sets, 0, sets["f"].gen.autonomous)
        self._finish(name, states, params, nets, tuple(observables), n_params, asm)
        # Kept for other backends (sciml.jax prints them to jax.numpy).
        self._trace, self._obs_trace = trace, obs

    # ------------------------------------------------------------ building

    @staticmethod
    def _check(states, params, nets, observables):
        states = check_names("states", states)
        if not states:
            raise ValueError("`states` must name at least one state")
        params = check_names("params", params)
        nets = _check_nets(nets)
        observables = _check_observables(observables)
        _distinct(states=states, params=params, nets=list(nets))
        return states, params, nets, observables

    @staticmethod
    def _net_specs(nets, n_mech):
        specs, off = {}, n_mech
        for name, chain in nets.items():
            specs[name] = NetSpec(name, chain.dense_layers, off, chain.n_params, chain.n_in,
                                  chain.n_out)
            off += chain.n_params
        return specs, off

    def _finish(self, name, states, params, nets, obs_names, n_params, asm):
        self._name = name
        self._states, self._params = states, params
        self._nets = nets
        self._obs_names = obs_names
        self._n_params = n_params
        self._asm = asm
        self._ws_size = int(asm.ws_size)
        slices, off = {}, 0
        for p in params:
            slices[p] = slice(off, off + 1)
            off += 1
        for k, chain in nets.items():
            slices[k] = slice(off, off + chain.n_params)
            off += chain.n_params
        self._slices = slices
        self._local = threading.local()  # the Python helpers' workspace, one per thread

    @classmethod
    def from_kernels(cls, rhs_into, vjp_into, states, params, jac_into=None,
                     paramjac_into=None, observables=None, ws_size=0, autonomous=False,
                     name=None):
        """A model from hand-written numba kernels (the escape hatch).

        For right-hand sides tracing cannot express (large discretised PDEs,
        table look-ups). Each kernel is a ``numba.njit`` function with the
        contract's signature: ``rhs_into(du, u, p, t, ws)``,
        ``vjp_into(ubar, pbar, lam, u, p, t, ws)`` (ubar written, pbar added
        to), optionally ``jac_into(J, u, p, t, ws)`` and
        ``paramjac_into(Jp, u, p, t, ws)``; missing ones are computed from
        `vjp_into`, one reverse pass per state. They are wrapped into
        C-callable functions once per process (a second or so; numba cannot
        cache a wrapper around a user's function). Methods that need second
        derivatives (`Rodas5` with the discrete adjoint, forward sensitivities
        or backsolve) are not available for such a model.

        Parameters
        ----------
        states, params : sequence of str
            Names; the flat parameter vector has ``len(params)`` entries.
        observables : dict of str -> callable, optional
            Traced as in `Model` (no networks).
        ws_size : int
            Scratch the kernels need: they get ``ws[:ws_size]``.
        autonomous : bool
            True if f does not depend on t (lets stiff solvers skip df/dt).
        name : str, optional
            For messages.
        """
        from ._hatch import wrap_kernels

        _compile_ahead()
        states, params, _, observables = cls._check(states, params, None, observables)
        if isinstance(ws_size, bool) or not isinstance(ws_size, (int, np.integer)) \
                or ws_size < 0:
            raise ValueError(f"from_kernels: `ws_size` must be an int >= 0, got {ws_size!r}")
        given, keep, total = wrap_kernels(
            {"rhs": rhs_into, "vjp": vjp_into, "jac": jac_into, "paramjac": paramjac_into},
            len(states), len(params), int(ws_size))
        sets = {}
        if observables:
            obs = trace_observables(observables, states, params, {})
            sets["g"] = KernelSet(obs, {}, len(params), strong_zero=True)
        name = name or getattr(rhs_into, "__name__", "kernels")
        self = cls.__new__(cls)
        self._finish(name, states, params, {}, tuple(observables), len(params),
                     Assembly(sets, total, autonomous, given))
        self._hatch = keep  # the compiled wrappers, alive as long as the model
        return self

    # ---------------------------------------------------------- properties

    @property
    def states(self):
        """State names, in the order of ``u`` (tuple of str)."""
        return self._states

    @property
    def params(self):
        """Mechanistic parameter names (tuple of str); networks follow them in the vector."""
        return self._params

    @property
    def nets(self):
        """The embedded networks (dict of name -> nets.Chain)."""
        return dict(self._nets)

    @property
    def n_states(self):
        return len(self._states)

    @property
    def n_params(self):
        """Length of the flat parameter vector: mechanistic + every network's."""
        return self._n_params

    @property
    def n_obs(self):
        return len(self._obs_names)

    @property
    def obs_names(self):
        return self._obs_names

    @property
    def source(self):
        """Every kernel of the model rendered as Python (a numba module; the compiled
        code is the same syntax trees printed as LLVM IR)."""
        return self._asm.source(f"Model `{self._name}`")

    @property
    def ws_size(self):
        return self._ws_size

    @property
    def param_slices(self):
        """Where each mechanistic parameter and each network lives in the flat vector."""
        return dict(self._slices)

    def has_kernel(self, name):
        """Whether the model can provide kernel ``name`` (``"hvp"``, ``"obs"``, ...)."""
        return self._asm.has(name)

    def kernel_table(self, *needs):
        """The int64 kernel table the compiled loops read, with the kernels named in
        ``needs`` (``"rhs"``, ``"jac"``, ``"paramjac"``, ``"vjp"``, ``"hvp"``,
        ``"obs"``, ``"obs_vjp"``) compiled."""
        for n in needs:
            if not self._asm.has(n):
                raise ValueError(self._missing(n))
        return self._asm.kernel_table(needs)

    def _missing(self, n):
        if n in ("obs", "obs_vjp"):
            return f"{self!r} has no observables"
        return (f"{self!r} has no `{n}` kernel (a model from hand-written kernels has no "
                "second derivatives)")

    def initial_table(self, fn):
        """``(kernel table, trace)`` for problems whose initial values are ``fn(p, nets)``
        (traced; problems with the same traced initial values share their kernels)."""
        memo = self.__dict__.setdefault("_initial_memo", {})
        try:
            if fn in memo:  # one function for many problems (a population's subjects)
                return memo[fn]
        except TypeError:  # an unhashable callable: traced each time
            memo = {}
        trace = trace_initial(fn, self._states, self._params, self._nets)
        specs, n_params = self._net_specs(self._nets, len(self._params))
        key = (trace.exprs, tuple((c.net, c.inputs, c.outputs) for c in trace.calls))
        out = self._asm.initial(key, lambda: KernelSet(trace, specs, n_params)), trace
        try:
            memo[fn] = out
        except TypeError:
            pass
        return out

    def linked_code(self):
        """The right-hand side's IR for the lean solve's fused path
        (`sciml.solvers.kernels.linked`), or None where it cannot be shared across
        processes (kernels given as addresses, custom activations)."""
        if not hasattr(self, "_linked"):
            portable = all(_registry.is_builtin(layer.activation)
                           for chain in self._nets.values() for layer in chain.layers)
            self._linked = self._asm.linked_rhs(self.n_states) if portable else None
        return self._linked

    def workspace(self, dtype=np.float64):
        """A zeroed scratch vector for the kernels (one per thread)."""
        return np.zeros(max(self._ws_size, 1), dtype=dtype)

    def __reduce__(self):
        # Pickled by its traced form (sympy expressions), its networks and its names,
        # never by compiled code: the kernel table holds this process's addresses. The
        # copy rebuilds its kernels on first need (LLVM, milliseconds), and the engine's
        # loops load from numba's disk cache; the user's function is not needed.
        if self._trace is None:
            raise TypeError(f"{self!r} was made from hand-written numba kernels "
                            "(Model.from_kernels) and cannot be pickled: build it in each "
                            "process (e.g. in a function the worker imports)")
        return (_rebuild_model, (type(self), self._name, self._states, self._params,
                                 self._nets, self._obs_names, self._trace, self._obs_trace))

    def __repr__(self):
        nets = "".join(f", {k}={c!r}" for k, c in self._nets.items())
        return (f"{type(self).__name__}({self._name!r}, states={list(self._states)}, "
                f"params={list(self._params)}{nets}, n_params={self._n_params})")

    # ---------------------------------------------------------- parameters

    def init_params(self, seed=0, **values):
        """A flat float64 parameter vector: mechanistic values, then initialised networks.

        Every mechanistic parameter must be given by name. Network ``k`` (in
        the order of `nets`) gets ``chain.init_params(seed + k)`` (PyTorch's default:
        weights and biases uniform in +-1/sqrt(fan_in)), unless its vector is given by
        name.

        Returns
        -------
        theta : ndarray, (n_params,)
        """
        known = set(self._params) | set(self._nets)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"init_params: unknown name(s) {', '.join(unknown)}; parameters: "
                             f"{', '.join(self._params) or '(none)'}; nets: "
                             f"{', '.join(self._nets) or '(none)'}")
        missing = [p for p in self._params if p not in values]
        if missing:
            example = ", ".join(f"{p}=..." for p in missing)
            raise ValueError(f"init_params: no value for mechanistic parameter(s) "
                             f"{', '.join(missing)}; pass them, e.g. "
                             f"model.init_params(seed={seed!r}, {example})")
        theta = np.zeros(self._n_params)
        for p in self._params:
            v = values[p]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(v):
                raise ValueError(f"init_params: `{p}` must be a finite number, got {v!r}")
            theta[self._slices[p].start] = v
        for k, (name, chain) in enumerate(self._nets.items()):
            s = self._slices[name]
            if name in values:
                v = np.asarray(values[name], dtype=np.float64)
                if v.shape != (chain.n_params,):
                    raise ValueError(f"init_params: `{name}` must have shape "
                                     f"({chain.n_params},), got {v.shape}")
                theta[s] = v
            else:
                theta[s] = chain.init_params(seed + k, dtype=np.float64)
        return theta

    def unpack(self, theta):
        """Named views of `theta` (see `ParamViews`); writing them writes `theta`."""
        if not isinstance(theta, np.ndarray) or theta.shape != (self._n_params,):
            shape = getattr(theta, "shape", type(theta).__name__)
            raise ValueError(f"unpack: `theta` must be an ndarray of shape ({self._n_params},),"
                             f" got {shape}")
        return ParamViews(theta, self._slices, set(self._params))

    # ------------------------------------------------------ Python helpers
    # Allocating conveniences for users and tests; the compiled loops call the kernels.

    def _args(self, u, p):
        return _vector("u", u, self.n_states), _vector("p", p, self._n_params)

    def _ws(self):
        ws = getattr(self._local, "ws", None)
        if ws is None:
            ws = self._local.ws = self.workspace()
        return ws

    def _call(self, name, arrays, t):
        call(self.kernel_table(name), name, arrays, t, self._ws())

    def rhs(self, u, p, t=0.0):
        """du/dt at (u, p, t), shape (n_states,)."""
        u, p = self._args(u, p)
        du = np.empty(self.n_states)
        self._call("rhs", (du, u, p), t)
        return du

    def jac(self, u, p, t=0.0):
        """df/du, shape (n_states, n_states)."""
        u, p = self._args(u, p)
        J = np.empty((self.n_states, self.n_states))
        self._call("jac", (J, u, p), t)
        return J

    @property
    def mass_matrix(self):
        """The diagonal (n,) of the mass matrix of ``M du/dt = f``, or None (an ODE)."""
        return self._mass

    @property
    def jac_sparsity(self):
        """The structural pattern of df/du from the trace, a ``scipy.sparse.csr_array`` of
        ones (n_states, n_states): entry (i, j) is stored when f_i reads u_j, directly
        or through a network. None for a model from hand-written kernels (no trace)."""
        pat = self._pattern()
        if pat is None:
            return None
        import scipy.sparse as sp

        indptr, indices = pat
        n = self.n_states
        return sp.csr_array((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))

    def _pattern(self):
        """``(indptr, indices)`` of `jac_sparsity` (computed once), or None."""
        fset = self._asm.sets.get("f")
        if fset is None:
            return None
        if fset.pattern is None:
            fset.pattern = fset.gen.sparsity()
        return fset.pattern

    def _sparse_lu(self, ordering="mmd"):
        """The sparse LU's analysis of this model's pattern with ``ordering``
        (`solvers.kernels.sparse.analyse`), computed once."""
        with self._asm._lock:
            done = self.__dict__.setdefault("_lu_analysis", {})
            if ordering not in done:
                from sciml.solvers.kernels.sparse import analyse

                indptr, indices = self._pattern()
                done[ordering] = analyse(indptr, indices, self.n_states, ordering)
        return done[ordering]

    def _sparse_jacobian(self):
        """Whether the model has a kernel for its Jacobian's values on `jac_sparsity` (a
        traced model; not one from hand-written kernels)."""
        return self._asm.sets.get("f") is not None

    def spjac(self, u, p, t=0.0):
        """df/du on its sparsity pattern: a ``scipy.sparse.csr_array`` (n_states, n_states)
        whose stored entries are those of `jac_sparsity`."""
        import scipy.sparse as sp

        u, p = self._args(u, p)
        indptr, indices = self._pattern()
        Jx = np.empty(indices.shape[0])
        self._call("spjac", (Jx, u, p), t)
        n = self.n_states
        return sp.csr_array((Jx, indices, indptr), shape=(n, n))

    def paramjac(self, u, p, t=0.0):
        """df/dp, shape (n_states, n_params)."""
        u, p = self._args(u, p)
        Jp = np.empty((self.n_states, self._n_params))
        self._call("paramjac", (Jp, u, p), t)
        return Jp

    def vjp(self, lam, u, p, t=0.0):
        """(lam^T df/du, lam^T df/dp), shapes (n_states,), (n_params,)."""
        u, p = self._args(u, p)
        lam = _vector("lam", lam, self.n_states)
        ubar, pbar = np.empty(self.n_states), np.zeros(self._n_params)
        self._call("vjp", (ubar, pbar, lam, u, p), t)
        return ubar, pbar

    def hvp(self, lam, v, u, p, t=0.0):
        """The gradient of lam^T (df/du) v over u and over p: shapes (n_states,), (n_params,)."""
        u, p = self._args(u, p)
        lam, v = _vector("lam", lam, self.n_states), _vector("v", v, self.n_states)
        ubar, pbar = np.empty(self.n_states), np.zeros(self._n_params)
        self._call("hvp", (ubar, pbar, lam, v, u, p), t)
        return ubar, pbar

    def observe(self, u, p, t=0.0):
        """The observables at (u, p, t), shape (n_obs,)."""
        u, p = self._args(u, p)
        y = np.empty(self.n_obs)
        self._call("obs", (y, u, p), t)
        return y


def _compile_ahead():
    """A model is built: its solves follow. With a cold disk cache, the background compiler
    starts now, beside the tracing (`sciml._tier.prepare`)."""
    from sciml import _tier
    from sciml.solvers.kernels.ros import ros_integrate

    _tier.prepare(ros_integrate)


def _rebuild_model(cls, name, states, params, nets, obs_names, trace, obs_trace):
    """A `Model` (or subclass) from what `Model.__reduce__` keeps: no tracing, no compiling."""
    self = cls.__new__(cls)
    specs, n_params = Model._net_specs(nets, len(params))
    sets = {"f": KernelSet(trace, specs, n_params)}
    if obs_trace is not None:
        sets["g"] = KernelSet(obs_trace, specs, n_params, strong_zero=True)
    asm = Assembly(sets, 0, sets["f"].gen.autonomous)
    self._finish(name, states, params, nets, tuple(obs_names), n_params, asm)
    self._trace, self._obs_trace = trace, obs_trace
    return self


def _neural_ode(u, p, t, nets):
    return nets.net(u)


class NeuralODE(Model):
    """A neural ODE ``du/dt = chain(u)`` (states ``u0 .. u{n-1}``, no mechanistic params).

    The chain's parameters are the whole flat vector; it is the network
    ``net`` of the model (``model.unpack(theta).net``).
    """

    def __init__(self, chain, observables=None):
        if not isinstance(chain, Chain):
            raise TypeError(f"NeuralODE: `chain` must be a nets.Chain, got "
                            f"{type(chain).__name__}")
        if chain.n_in != chain.n_out:
            raise ValueError(f"NeuralODE: the chain must map n states to n derivatives; "
                             f"it has {chain.n_in} inputs and {chain.n_out} outputs")
        states = [f"u{i}" for i in range(chain.n_in)]
        super().__init__(_neural_ode, states, [], nets={"net": chain},
                         observables=observables)

