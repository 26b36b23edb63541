"""The JAX/diffrax backend: the same `sciml.Model` and flat parameter vector on diffrax.

``import sciml`` never imports JAX; ``import sciml.jax`` does, and switches
JAX to float64 (``jax.config.update("jax_enable_x64", True)``, a process-wide
setting) so that results match the numba path. Set it back yourself if other
code in the process needs JAX's float32 default.

What it builds from a model
---------------------------
The model's traced sympy expressions (`sciml.model.trace.Trace`: the
right-hand side, ``model._trace``, and the observables, ``model._obs_trace``)
are printed to ``jax.numpy`` by sympy's ``lambdify``; each network call is
``nets.jax.apply`` on its slice of the flat vector, so the translated
function is the model function itself, not an approximation.

- `vector_field` (model) -> ``f(t, u, theta)``, du/dt as a JAX array;
- `term` (model) -> ``diffrax.ODETerm`` whose ``args`` is ``theta``;
- `observables` (model) -> ``g(t, u, theta)``, the observables as a (n_obs,) array
  (observables may call the networks, like the right-hand side).

Initial values given as a function of the parameters (``ODEProblem(model,
u0=lambda p, nets: [p.A0, 0.0], ...)``) are translated the same way, from
the traced function (``prob._u0_trace``): the initial state is computed from
``theta`` inside the solve, so gradients flow through it. Problems with the
same traced initial values share their compiled functions.

Models made with `Model.from_kernels` (numba kernels, nothing traced) cannot
be translated: they raise a `TypeError`.

Solving and gradients
---------------------
`solve` integrates one `ODEProblem` or a list, `loss_and_grad` returns a loss
on `sciml.Data` and its gradient over the flat parameter vector, with the
losses of `sciml.losses` (`SSE`, `GaussianNLL`) computed in JAX (any other
`sciml.losses.ObservationLoss` is evaluated in numpy on the predictions and pulled back
through JAX's vjp). Doses are handled as in the numba path:

- the integration is split at every dose boundary (the same schedule as
  `sciml.solve`), one ``diffeqsolve`` per segment inside a ``lax.scan``
  (a single ``diffeqsolve`` without doses);
- a bolus is a jump of the state between two segments; states are
  right-continuous (a save time equal to a bolus time gives the post-dose
  state, a bolus at ``t0`` is in the initial state);
- an infusion is a rate added to du/dt on the segments it covers.

A list of problems whose shapes agree (same model, same number of segments,
same number of save/observation times, same observed columns) is run as one
``jax.vmap`` batch; different shapes form separate batches, run in turn. The
compiled function is built once per (model, settings) and cached; JAX's jit
then compiles it once per batch shape.

``max_steps`` bounds the steps of each segment (diffrax's convention, one
``diffeqsolve`` per segment), not of the whole span as in `sciml.solve`.
Reverse mode with ``adjoint="recursive_checkpoint"`` stores about
``sqrt(2 * max_steps)`` checkpoints of the solver state per trajectory, so a
smaller ``max_steps`` saves memory in big batches.

Moving a fit to JAX (and to a GPU)
----------------------------------
``sciml.fit(probs, data, ..., backend="jax")`` computes every loss and
gradient with ``sciml.jax.loss_and_grad(probs, data, loss=loss,
solver=solver, rtol=rtol, atol=atol, params=theta)`` instead of the numba
adjoints; the optimizers, the flat parameter vector and the result are the
same. JAX runs on its default device: with a CUDA build of JAX installed
(``pip install -U "jax[cuda12]"``) that is the GPU, with no other change.
On a CPU the numba path is as fast or faster up to 10,000 trajectories and
compiles once instead of once per batch size (``benchmarks/README.md``,
``batch_crossover``); the JAX path is for GPUs, and an independent check.
The same works by hand::

    import sciml.jax
    value, grad = sciml.jax.loss_and_grad(probs, datas, loss=sciml.SSE(),
                                          solver="Tsit5", params=theta)

Solvers: ``"Tsit5"`` (default), ``"Dopri5"``, ``"Kvaerno5"`` (stiff, implicit),
also ``"Bosh3"``, ``"Dopri8"``; a sciml solver or its name (``Tsit5()``,
``DP5()`` -> Dopri5, ``BS3()`` -> Bosh3, ``Vern7()`` -> Dopri8,
``Rodas5()`` -> Kvaerno5; what ``sciml.fit`` passes); or any diffrax solver
instance. Vern7 and Rodas5 have no diffrax twin: the nearest method of the
same kind solves the same problem to the same tolerance, with other steps.

Known difference: JAX differentiates both branches of ``np.where`` (a
Piecewise); a branch that is NaN where it is not taken (``np.sqrt`` of a
negative number) makes the gradient NaN, where the numba kernels are fine.
Guard such branches (``np.sqrt(np.maximum(x, 0))``).
"""

import math
import warnings
import weakref

import numpy as np
import sympy

try:
    import diffrax
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("sciml.jax needs JAX and diffrax: pip install 'sciml-nets[jax]'") from e

import nets.jax as _nets_jax

from . import losses as _losses
from ._validate import check_max_steps, is_number, number, saveat_times
from .data import Data
from .model import Model
from .model.trace import T as _T
from .problem import problem_list
from .solution import SolveWarning
from .solvers.common import schedule

jax.config.update("jax_enable_x64", True)

__all__ = ["vector_field", "term", "observables", "solve", "loss_and_grad", "JaxSolution",
           "SOLVERS", "ADJOINTS"]

SOLVERS = {"Tsit5": "Tsit5", "Dopri5": "Dopri5", "Kvaerno5": "Kvaerno5", "Bosh3": "Bosh3",
           "Dopri8": "Dopri8"}
# sciml's solver classes -> the nearest diffrax method (same tableau where one exists).
_FROM_SCIML = {"Tsit5": "Tsit5", "DP5": "Dopri5", "BS3": "Bosh3", "Vern7": "Dopri8",
               "Rodas5": "Kvaerno5"}
ADJOINTS = ("recursive_checkpoint", "backsolve")


# ------------------------------------------------------------------ translation


def _jax_function(trace, model):
    """A traced function (`sciml.model.trace.Trace`) as ``fn(t, u, theta)`` in JAX: its
    symbolic parts by sympy's JAX printer, its network calls by `nets.jax`."""
    n_mech = len(model.params)
    slices = model.param_slices
    u, p = list(trace.u), list(trace.p)
    calls, z = [], []
    for call in trace.calls:
        fn = sympy.lambdify([_T, u, p, list(z)], list(call.inputs), modules="jax", cse=True)
        calls.append((fn, model.nets[call.net], slices[call.net]))
        z += call.outputs
    out = sympy.lambdify([_T, u, p, z], list(trace.exprs), modules="jax", cse=True)

    def fn(t, y, theta):
        pm = theta[:n_mech]
        zs = []
        for f_in, chain, sl in calls:
            x = _stack(f_in(t, y, pm, zs))
            zs.extend(_nets_jax.apply(chain, theta[sl], x))
        return _stack(out(t, y, pm, zs))

    return fn


class _Translated:
    """A model printed to JAX: ``rhs(t, u, theta)`` and ``observe(t, u, theta)``.

    Holds the compiled (jitted) functions built on it, keyed by their static
    settings, so each is built once per model.
    """

    def __init__(self, model):
        trace = model._trace
        if trace is None:
            raise TypeError(f"sciml.jax: {model!r} was made with Model.from_kernels (numba "
                            "kernels): it has no traced expressions to translate to JAX; "
                            "define it with sciml.Model(f, ...) to use the JAX backend")
        # No reference to `model` here: this object is the value of a weak-keyed cache.
        self.rhs = _jax_function(trace, model)
        obs = _jax_function(model._obs_trace, model) if model._obs_trace is not None else None

        def observe(t, y, theta):
            if obs is None:
                return jnp.zeros(0, dtype=jnp.float64)
            return obs(t, y, theta)

        self.observe = observe
        self.fns = {}
        self._model_ref = weakref.ref(model)  # weak: this object is a weak-keyed cache's value

    def initial(self, trace):
        """Initial values traced from ``u0(p, nets)`` (`ODEProblem._u0_trace`) as a JAX
        function ``u0(theta) -> (n_states,)``, built once per traced function."""
        key = ("initial", trace)
        fn = self.fns.get(key)
        if fn is None:
            f = _jax_function(trace, self._model_ref())
            none = jnp.zeros(0, dtype=jnp.float64)  # no states: the trace is over p alone

            def fn(theta):
                return f(0.0, none, theta)

            self.fns[key] = fn
        return fn


def _stack(values):
    # lambdify returns plain numbers for constant expressions: lift them to float64.
    return jnp.stack([jnp.asarray(v, dtype=jnp.float64) for v in values])


_MODELS = weakref.WeakKeyDictionary()


def _translated(model):
    if not isinstance(model, Model):
        raise TypeError(f"sciml.jax: `model` must be a sciml.Model, got {type(model).__name__}")
    tr = _MODELS.get(model)
    if tr is None:
        tr = _MODELS[model] = _Translated(model)
    return tr


def vector_field(model):
    """The model's right-hand side as a JAX function ``f(t, u, theta) -> du/dt``.

    Parameters
    ----------
    model : sciml.Model
        Not one made with `Model.from_kernels` (nothing traced to translate).

    Returns
    -------
    callable
        ``f(t, u, theta)``: ``u`` (n_states,), ``theta`` the flat parameter
        vector (n_params,); returns (n_states,). Differentiable, jit- and
        vmap-able.
    """
    return _translated(model).rhs


def term(model):
    """A ``diffrax.ODETerm`` of the model; pass the flat parameter vector as ``args``."""
    rhs = _translated(model).rhs
    return diffrax.ODETerm(lambda t, y, theta: rhs(t, y, theta))


def observables(model):
    """The model's observables as a JAX function ``g(t, u, theta) -> (n_obs,)``.

    The order is ``model.obs_names``; a model without observables gives an
    empty array.
    """
    return _translated(model).observe


# ----------------------------------------------------------------- settings


class _Ident:
    """A cache key for a user's diffrax object: equal only to itself, and keeping it alive
    (so that its id cannot be reused by another object while the key exists)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Ident) and other.obj is self.obj


def _solver(solver):
    """(diffrax solver, hashable key) from a name, a sciml solver or a diffrax solver."""
    if solver is None:
        solver = "Tsit5"
    if isinstance(solver, diffrax.AbstractSolver):
        return solver, _Ident(solver)
    from .solvers import Solver

    if isinstance(solver, Solver):
        given = type(solver).__name__
    elif isinstance(solver, str):
        given = solver
    else:
        raise TypeError(f"sciml.jax: `solver` must be a name such as 'Tsit5', a sciml solver "
                        f"or a diffrax solver, got {solver!r}")
    name = SOLVERS.get(given) or _FROM_SCIML.get(given)
    if name is None:
        raise ValueError(f"sciml.jax: `solver` {given!r} has no diffrax counterpart here "
                         f"(fixed-step methods are not supported); use one of "
                         f"{', '.join(SOLVERS)} or a sciml solver {', '.join(_FROM_SCIML)}")
    return getattr(diffrax, name)(), name


def _adjoint(adjoint):
    if isinstance(adjoint, diffrax.AbstractAdjoint):
        return adjoint, _Ident(adjoint)
    if adjoint == "recursive_checkpoint":
        return diffrax.RecursiveCheckpointAdjoint(), adjoint
    if adjoint == "backsolve":
        return diffrax.BacksolveAdjoint(), adjoint
    raise ValueError(f"sciml.jax: `adjoint` must be one of {', '.join(ADJOINTS)} (or a "
                     f"diffrax adjoint instance), got {adjoint!r}")


def _tolerances(rtol, atol, n):
    """(rtol, atol) as diffrax takes them: a number, or a tuple of one per state."""
    rtol = number(rtol, "rtol", "sciml.jax", lo=0.0)
    if is_number(atol):
        return rtol, number(atol, "atol", "sciml.jax", lo=0.0)
    a = np.asarray(atol, dtype=np.float64)
    if a.shape != (n,) or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"sciml.jax: `atol` must be a number > 0 or {n} of them (one per "
                         f"state), got {atol!r}")
    return rtol, tuple(a.tolist())


# ---------------------------------------------------------------- trajectories


def _problem_arrays(prob, ts):
    if prob.events or prob.changes:
        raise ValueError("sciml.jax: problems with events (sciml.Event) or parameter changes "
                         "(sciml.Change) are not supported on the JAX backend yet; use "
                         "sciml.solve / sciml.loss_and_grad")
    """The arrays one trajectory needs: the dose schedule and the save times.

    ``seg[j]`` is the segment that saves ``ts[j]``: the k with
    ``stops[k] <= ts[j] < stops[k+1]``, or m (the number of segments) for
    ``ts[j] == tf``, which takes the state after the last segment and any
    bolus at ``tf``.
    """
    ts = np.asarray(ts, dtype=np.float64)
    n = prob.model.n_states
    # Initial values as a function of the parameters: computed from theta inside the
    # trajectory (`_initial`); zeros hold their place (and give the batch its size).
    u0 = prob.u0 if prob.u0_function is None else np.zeros(n)
    if prob._plain:  # no doses, no tstops: one segment (the common case, made cheap)
        t0, tf = prob.tspan
        return {"u0": u0, "stops": np.array([t0, tf]), "rate": np.zeros((1, n)),
                "bolus": np.zeros((2, n)), "ts": ts, "seg": (ts >= tf).astype(np.int32)}
    sched = schedule(prob)
    m = sched.n_segments
    bolus = np.zeros((m + 1, n))
    np.add.at(bolus, (sched.bolus_k, sched.bolus_i), sched.bolus_a)
    seg = np.searchsorted(sched.stops, ts, side="right") - 1
    seg = np.minimum(seg, m).astype(np.int32)
    return {"u0": u0, "stops": sched.stops, "rate": sched.seg_rate, "bolus": bolus,
            "ts": ts, "seg": seg}


def _initial_key(prob):
    """What a compiled function depends on in a problem's initial values: None for an
    array (data of the batch), the traced function otherwise (compared by value)."""
    if prob.u0_function is not None and prob._u0_trace is None:
        raise ValueError("sciml.jax: a problem starting from sciml.SteadyState is not "
                         "supported on the JAX backend; use sciml.solve / "
                         "sciml.loss_and_grad")
    return None if prob.u0_function is None else prob._u0_trace


def _initial(f, tr, init):
    """``f(theta, a)`` with ``a["u0"]`` replaced by the traced initial values at theta
    (`init`, a key of `_initial_key`), so that gradients flow through them."""
    if init is None:
        return f
    u0 = tr.initial(init)

    def g(theta, a):
        return f(theta, {**a, "u0": u0(theta)})

    return g


def _make_trajectory(tr, dsolver, rtol, atol, adjoint, max_steps, steps=False):
    """``trajectory(theta, a) -> (ys (T, n), ok, num_steps[, step_ts, step_ys])`` for one problem.

    One ``diffeqsolve`` per segment between dose times, inside a ``lax.scan``
    when there are several (one compiled solve whatever the number of
    doses): each segment saves every requested time clipped into it, and
    keeps those that belong to it. Without doses, one plain ``diffeqsolve``
    (cheaper to compile).
    """
    rhs = tr.rhs
    field = diffrax.ODETerm(lambda t, y, args: rhs(t, y, args[0]) + args[1])
    atol_ = jnp.asarray(atol) if isinstance(atol, tuple) else atol
    controller = diffrax.PIDController(rtol=rtol, atol=atol_)

    def segment(theta, u, t0, t1, rate, ts):
        """(states at ts, state at t1, (ok, num_steps[, step ts, step states]))."""
        saves = jnp.concatenate([ts, t1[None]])  # t1 last: the state the next segment starts at
        saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=saves),
                                      diffrax.SubSaveAt(steps=True)]) if steps \
            else diffrax.SaveAt(ts=saves)
        sol = diffrax.diffeqsolve(field, dsolver, t0, t1, None, u, args=(theta, rate),
                                  saveat=saveat, stepsize_controller=controller,
                                  adjoint=adjoint, max_steps=max_steps, throw=False)
        saved = sol.ys[0] if steps else sol.ys
        out = (sol.result == diffrax.RESULTS.successful, sol.stats["num_steps"])
        if steps:
            out += (sol.ts[1], sol.ys[1])
        return saved[:-1], saved[-1], out

    def trajectory(theta, a):
        stops, ts, seg, rate, bolus = a["stops"], a["ts"], a["seg"], a["rate"], a["bolus"]
        m = rate.shape[0]
        u = a["u0"] + bolus[0]
        if m == 1:
            ys, u, out = segment(theta, u, stops[0], stops[1], rate[0], ts)
            u = u + bolus[1]
            out = tuple(x[None] for x in out)
        else:
            def body(carry, k):
                u, ys = carry
                t0, t1 = stops[k], stops[k + 1]
                saved, u, out = segment(theta, u, t0, t1, rate[k], jnp.clip(ts, t0, t1))
                ys = jnp.where((seg == k)[:, None], saved, ys)
                return (u + bolus[k + 1], ys), out

            ys = jnp.zeros(ts.shape + u.shape, dtype=u.dtype)
            (u, ys), out = jax.lax.scan(body, (u, ys), jnp.arange(m))
        # Save times equal to tf (segment m) take the state after any bolus at tf.
        ys = jnp.where((seg == m)[:, None], u, ys)
        return (ys, jnp.all(out[0]), jnp.sum(out[1])) + tuple(out[2:])

    return trajectory


def _over_batch(f, shared):
    """``f(theta, a)`` over a batch of problems: ``jax.vmap``, or a plain call for one.

    A batch of one skips vmap, which costs compile time (batched while loops).
    """
    vf = jax.vmap(f, in_axes=(None if shared else 0, 0))

    def g(theta, batch):
        if batch["u0"].shape[0] != 1:  # shapes are static under jit: decided when tracing
            return vf(theta, batch)
        out = f(theta if shared else theta[0], jax.tree.map(lambda x: x[0], batch))
        return jax.tree.map(lambda x: x[None], out)

    return g


def _theta_spec(probs, params, n_params):
    """(theta, shared): one vector for all problems, or one row per problem."""
    if params is not None:
        theta = np.asarray(params, dtype=np.float64)
        if theta.shape != (n_params,):
            raise ValueError(f"sciml.jax: `params` must have shape ({n_params},) (the model's "
                             f"n_params), got {theta.shape}")
        if not np.all(np.isfinite(theta)):
            raise ValueError("sciml.jax: `params` contains NaN or Inf")
        return theta, True
    first = probs[0].params
    if all(p.params is first or np.array_equal(p.params, first) for p in probs):
        return first, True
    return np.stack([p.params for p in probs]), False


def _stack_arrays(items):
    return {k: np.stack([it[k] for it in items]) for k in items[0]}


def _groups(keys):
    """Indices grouped by equal key, in first-appearance order."""
    out = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return list(out.values())


# ------------------------------------------------------------------------ solve


class JaxSolution:
    """What `sciml.jax.solve` returns for one problem.

    Attributes
    ----------
    t : ndarray, (T,)
    u : ndarray, (T, n_states)
        Right-continuous at boluses, like `sciml.Solution`.
    observables : dict of str -> ndarray (T,)
    success : bool
        False if a segment failed (max_steps reached, non-finite state).
    stats : dict
        ``num_steps``: steps over all segments (accepted and rejected).
    prob : the problem solved.
    """

    def __init__(self, prob, t, u, obs, success, num_steps):
        self.prob, self.t, self.u = prob, t, u
        names = prob.model.obs_names
        self.observables = {k: obs[:, i].copy() for i, k in enumerate(names)}
        self.success = bool(success)
        self.status = "success" if self.success else "failed"
        self.stats = {"num_steps": int(num_steps)}

    def __len__(self):
        return self.t.shape[0]

    def __repr__(self):
        return (f"JaxSolution(status={self.status!r}, {len(self)} times, "
                f"num_steps={self.stats['num_steps']})")


def _solve_fn(tr, solver, rtol, atol, max_steps, shared, steps, init):
    """``fn(theta, batch) -> (ys, ok, num_steps[, step ts, step ys], observables, u0)``."""
    dsolver, skey = solver
    key = ("solve", skey, rtol, atol, max_steps, shared, steps, init)
    fn = tr.fns.get(key)
    if fn is None:
        trajectory = _make_trajectory(tr, dsolver, rtol, atol,
                                      diffrax.RecursiveCheckpointAdjoint(), max_steps, steps)
        obs = jax.vmap(tr.observe, in_axes=(0, 0, None))

        def one(theta, a):
            out = trajectory(theta, a)
            return out + (obs(a["ts"], out[0], theta), a["u0"])

        fn = tr.fns[key] = jax.jit(_over_batch(_initial(one, tr, init), shared))
    return fn


def solve(prob, solver="Tsit5", *, rtol=1e-6, atol=1e-6, saveat=None, max_steps=4096):
    """Integrate an `ODEProblem` (or a list of them) with diffrax.

    Parameters
    ----------
    prob : ODEProblem or list of ODEProblem
        A list of problems of one model with the same numbers of dose
        segments and save times runs as one ``jax.vmap`` batch.
    solver : str, sciml solver or diffrax solver
        ``"Tsit5"`` (default), ``"Dopri5"``, ``"Kvaerno5"`` (stiff), ... (see
        the module's documentation).
    rtol, atol : float (atol: or one per state)
    saveat : None, float or array_like
        As in `sciml.solve`: None saves every step (and every dose time), a
        number is a spacing, an array gives the times (inside tspan, sorted;
        filled by the solver's interpolant).
    max_steps : int
        Steps allowed per segment between dose times.

    Returns
    -------
    JaxSolution or list of JaxSolution
        ``.t``, ``.u`` (T, n), ``.observables``; a solve that fails warns
        (`sciml.SolveWarning`) and has ``success`` False.
    """
    probs, many = problem_list(prob, "sciml.jax: ")
    dsolver = _solver(solver)
    max_steps = check_max_steps(max_steps, "sciml.jax")
    sols = [None] * len(probs)
    steps = saveat is None
    items, keys = [], []
    for p in probs:
        ts = np.zeros(0) if steps else saveat_times(saveat, p.tspan)
        rt = _tolerances(rtol, atol, p.model.n_states)
        a = _problem_arrays(p, ts)
        items.append(a)
        keys.append((id(p.model), rt, a["rate"].shape[0], ts.shape[0], _initial_key(p)))
    for idx in _groups(keys):
        model = probs[idx[0]].model
        tr = _translated(model)
        theta, shared = _theta_spec([probs[i] for i in idx], None, model.n_params)
        _, rt, _, _, init = keys[idx[0]]
        fn = _solve_fn(tr, dsolver, *rt, max_steps, shared, steps, init)
        out = jax.device_get(fn(theta, _stack_arrays([items[i] for i in idx])))
        for b, i in enumerate(idx):
            ys, ok, nst = out[0][b], out[1][b], out[2][b]
            obs = out[-2][b]
            t = items[i]["ts"]
            if steps:
                a = dict(items[i], u0=out[-1][b])  # the initial state integrated
                t, ys = _every_step(a, out[3][b], out[4][b])
                size = out[3][b].size + 1  # the most times a solve can save: one shape
                obs = _observe_padded(tr, t, ys, theta if shared else theta[b], size)
            sols[i] = JaxSolution(probs[i], np.asarray(t), np.asarray(ys), np.asarray(obs),
                                  ok, nst)
            if not ok:
                which = f" (problem {i})" if many else ""
                warnings.warn(f"sciml.jax.solve{which}: a segment failed (maximum number of "
                              f"steps {max_steps} reached or a non-finite state); the values "
                              "after it are not valid", SolveWarning, stacklevel=2)
    return sols if many else sols[0]


def _observe_padded(tr, t, ys, theta, size):
    """The observables at (t, ys), evaluated in one jitted call of a fixed shape."""
    fn = tr.fns.get("observe")
    if fn is None:
        fn = tr.fns["observe"] = jax.jit(jax.vmap(tr.observe, in_axes=(0, 0, None)))
    pad = size - t.shape[0]
    tp = np.concatenate([t, np.full(pad, t[-1])])
    yp = np.concatenate([ys, np.repeat(ys[-1:], pad, axis=0)])
    Y = np.asarray(jax.device_get(fn(tp, yp, theta)))
    return Y[:t.shape[0]].reshape(t.shape[0], -1)


def _every_step(a, step_ts, step_ys):
    """Every accepted step of every segment, post-dose at the stops (saveat=None)."""
    ts, ys = [a["stops"][:1]], [(a["u0"] + a["bolus"][0])[None]]
    for k in range(step_ts.shape[0]):
        keep = np.isfinite(step_ts[k])
        t, y = step_ts[k][keep], step_ys[k][keep].copy()
        if t.size:
            y[-1] += a["bolus"][k + 1]  # the last step ends on the stop
        ts.append(t), ys.append(y)
    return np.concatenate(ts), np.concatenate(ys)


# ----------------------------------------------------------------------- losses


def _loss_spec(loss, model, k, theta):
    """A hashable description of a loss computed in JAX, or None (computed in numpy)."""
    if type(loss) is _losses.SSE:
        return ("sse",)
    if type(loss) is _losses.GaussianNLL:
        loss.bind(model)
        sig, idx = loss._sigmas(k, theta, model)  # numpy's checks and messages
        fixed = tuple(float(s) if i < 0 else None for s, i in zip(sig, idx))
        return ("nll", tuple(int(i) for i in idx), fixed, loss.log)
    return None


def _jax_loss(spec, yhat, a, theta):
    """The value of `SSE` / `GaussianNLL` in JAX (the formulas of `sciml.losses`)."""
    mask = a["mask"]
    r = jnp.where(mask, yhat - a["y"], 0.0)
    if spec[0] == "sse":
        return jnp.sum(r * r) if "w" not in a else jnp.sum(a["w"] * r * r)
    _, idx, fixed, log = spec
    sig = jnp.stack([jnp.asarray(f, dtype=jnp.float64) if i < 0
                     else (jnp.exp(theta[i]) if log else theta[i])
                     for i, f in zip(idx, fixed)])
    r = r / sig
    cnt = jnp.sum(mask, axis=0)
    return (0.5 * jnp.sum(r * r) + jnp.sum(cnt * jnp.log(sig))
            + 0.5 * math.log(2 * math.pi) * jnp.sum(cnt))


def _predict_fn(tr, trajectory, kind, cols):
    """``predict(theta, a) -> (yhat (T, k), ok, num_steps)``: states or observables."""
    cols = jnp.asarray(cols)
    obs = jax.vmap(tr.observe, in_axes=(0, 0, None))

    def predict(theta, a):
        ys, ok, nst = trajectory(theta, a)
        y = ys if kind == "states" else obs(a["ts"], ys, theta)
        return y[:, cols], ok, nst

    return predict


def _grad_fn(tr, settings, kind, cols, spec, shared, reduce=True, init=None):
    """The jitted loss-and-gradient of a batch (spec given) or its forward-with-vjp.

    ``theta`` is one vector (`shared`) or one row per problem; with `reduce`
    the per-row gradients are summed, else returned per problem. `init`: the
    problems' traced initial values (`_initial_key`), None for arrays.
    """
    key = ("grad", settings[0][1], settings[1], settings[2], settings[3][1], settings[4], kind,
           cols, spec, shared, reduce, init)
    fn = tr.fns.get(key)
    if fn is not None:
        return fn
    (dsolver, _), rtol, atol, (adj, _), max_steps = settings
    trajectory = _make_trajectory(tr, dsolver, rtol, atol, adj, max_steps)
    predict = _initial(_predict_fn(tr, trajectory, kind, cols), tr, init)

    def gather(g):
        return jnp.sum(g, axis=0) if reduce and not shared else g

    if spec is not None:
        def one(theta, a):
            yhat, ok, nst = predict(theta, a)
            return _jax_loss(spec, yhat, a, theta), (ok, nst)

        def total(theta, batch):
            vals, aux = _over_batch(one, shared)(theta, batch)
            return jnp.sum(vals), (vals, aux)

        vg = jax.value_and_grad(total, has_aux=True)

        def run(theta, batch):
            (_, (vals, aux)), g = vg(theta, batch)
            return vals, gather(g), aux

        fn = jax.jit(run)
    else:
        batched = _over_batch(predict, shared)

        def forward(theta, batch):
            def pred(th):
                yhat, ok, nst = batched(th, batch)
                return yhat, (ok, nst)

            yhat, vjp, (ok, nst) = jax.vjp(pred, theta, has_aux=True)
            return yhat, ok, nst, vjp

        def backward(vjp, ybar):
            (g,) = vjp(ybar)
            return gather(g)

        fn = (jax.jit(forward), jax.jit(backward))
    tr.fns[key] = fn
    return fn


def _check_data(data, probs, many):
    if many:
        if not isinstance(data, (list, tuple)) or len(data) != len(probs):
            got = f"a list of {len(data)}" if isinstance(data, (list, tuple)) else \
                type(data).__name__
            raise ValueError(f"sciml.jax.loss_and_grad: `data` must be a list of "
                             f"{len(probs)} sciml.Data (one per problem), got {got}")
        datas = list(data)
    else:
        datas = [data]
    for i, d in enumerate(datas):
        if not isinstance(d, Data):
            where = f"`data[{i}]`" if many else "`data`"
            raise TypeError(f"sciml.jax.loss_and_grad: {where} must be a sciml.Data, got "
                            f"{type(d).__name__}")
    return datas


def loss_and_grad(prob, data, loss=None, solver="Tsit5", adjoint="recursive_checkpoint",
                  rtol=1e-6, atol=1e-6, params=None, max_steps=4096, per_problem=False):
    """A loss on observations and its gradient over the flat parameter vector, in JAX.

    Parameters
    ----------
    prob : ODEProblem or list of ODEProblem
    data : sciml.Data or list of sciml.Data
        One per problem; states or named observables, NaN = missing.
    loss : sciml.losses.ObservationLoss, optional
        Default `sciml.SSE()`. `SSE` and `GaussianNLL` run in JAX; another
        The loss is called in numpy on the predictions and pulled back by vjp.
    solver : str, sciml solver or diffrax solver
        Default ``"Tsit5"``; see `solve`.
    adjoint : {"recursive_checkpoint", "backsolve"} or a diffrax adjoint
        How diffrax differentiates each solve: the exact derivative of the
        discrete solve (checkpointed reverse mode), or the continuous adjoint
        ODE solved backwards.
    rtol, atol : float
    params : ndarray (n_params,), optional
        Used instead of every problem's own ``params`` (what a fit varies).
    max_steps : int
        Steps allowed per segment between dose times.
    per_problem : bool
        Return one value and one gradient per problem (arrays (m,) and
        (m, n_params)) instead of their sums, as `sciml.loss_and_grad` does.

    Returns
    -------
    value : float (ndarray (m,) with `per_problem`)
        Summed over the problems.
    grad : ndarray, float64 (n_params,) ((m, n_params) with `per_problem`)
        Summed over the problems.

    Notes
    -----
    Problems of one model whose shapes agree (number of dose segments,
    observation count, observed columns) run as one ``jax.vmap`` batch; the
    compiled function is cached per model and settings. If a solve fails
    (max_steps, non-finite state), a `sciml.SolveWarning` is issued and
    ``(inf, nan...)`` is returned, as `sciml.loss_and_grad` does: optimizers
    treat it as a failed step (with `per_problem`, for the failed problems).
    """
    probs, many = problem_list(prob, "sciml.jax: ")
    datas = _check_data(data, probs, many)
    loss = _losses.SSE() if loss is None else loss
    if not isinstance(loss, _losses.ObservationLoss):
        raise TypeError(f"sciml.jax.loss_and_grad: `loss` must be a sciml loss such as "
                        f"sciml.SSE(), got {loss!r}")
    models = {id(p.model) for p in probs}
    if len(models) > 1 and params is not None:
        raise ValueError("sciml.jax.loss_and_grad: `params` is one vector, but the problems "
                         "use different models")
    if len(models) > 1 and not per_problem \
            and len({p.model.n_params for p in probs}) > 1:
        raise ValueError("sciml.jax.loss_and_grad: the problems' models have different "
                         "numbers of parameters: their gradients cannot be summed")
    dsolver = _solver(solver)
    adj = _adjoint(adjoint)
    max_steps = check_max_steps(max_steps, "sciml.jax")
    items, keys, tols = [], [], {}
    for i, (p, d) in enumerate(zip(probs, datas)):
        d.check_span(p.tspan, where=f"data[{i}]" if many else "data")
        if d.repeated:
            raise ValueError(f"sciml.jax.loss_and_grad: `data`{f'[{i}]' if many else ''} has "
                             "rows sharing a time (replicates); the numba path "
                             "(sciml.loss_and_grad) takes them, or merge them with "
                             "read_events(..., duplicates='mean')")
        cols = tuple(int(c) for c in d.columns(p.model))
        a = _problem_arrays(p, d.t)
        items.append(a)
        n = p.model.n_states
        rt = tols.get(n) or tols.setdefault(n, _tolerances(rtol, atol, n))
        keys.append((id(p.model), rt, a["rate"].shape[0], d.t.shape[0], d.kind, cols,
                     _initial_key(p)))
    values = np.zeros(len(probs))
    grads = [None] * len(probs) if per_problem else None
    ok = np.ones(len(probs), dtype=bool)
    for idx in _groups(keys):
        model = probs[idx[0]].model
        tr = _translated(model)
        theta, shared = _theta_spec([probs[i] for i in idx], params, model.n_params)
        _, rt, _, _, kind, cols, init = keys[idx[0]]
        for row in ([theta] if shared else theta):
            spec = _loss_spec(loss, model, len(cols), row)  # also checks sigma per row
        if per_problem and shared:  # one row per problem: each gets its own gradient
            theta, shared = np.tile(theta, (len(idx), 1)), False
        settings = (dsolver, *rt, adj, max_steps)
        fn = _grad_fn(tr, settings, kind, cols, spec, shared, reduce=not per_problem,
                      init=init)
        batch = _stack_arrays([items[i] for i in idx])
        batch.update(_data_arrays([datas[i] for i in idx]))
        if spec is not None:
            v, g, (good, _) = jax.device_get(fn(theta, batch))
        else:
            v, g, good = _numpy_loss(fn, loss, model, theta, shared, batch,
                                     [datas[i] for i in idx], per_problem)
        values[idx] = v
        ok[idx] = np.asarray(good).reshape(-1)
        g = np.asarray(g, dtype=np.float64)
        if per_problem:
            for b, i in enumerate(idx):
                grads[i] = g[b]
        else:
            grads = g if grads is None else grads + g
    failed = np.flatnonzero(~ok).tolist()
    if failed:
        warnings.warn(f"sciml.jax.loss_and_grad: the solve of problem(s) {failed[:10]} failed "
                      f"(maximum number of steps {max_steps} per segment reached, or a "
                      "non-finite state); returning an infinite loss and a NaN gradient"
                      f"{' for them' if per_problem else ''}", SolveWarning, stacklevel=2)
    if per_problem:
        values[failed] = np.inf
        for i in failed:
            grads[i] = np.full_like(grads[i], np.nan)
        return values, np.stack(grads)
    if failed:
        return math.inf, np.full_like(grads, np.nan)
    return float(np.sum(values)), grads


def _data_arrays(datas):
    """Observations of a batch: y (NaN -> 0), mask, and weights when any Data has them."""
    Y = np.stack([d.y for d in datas])
    mask = np.isfinite(Y)
    out = {"y": np.where(mask, Y, 0.0), "mask": mask}
    if any(d.weights is not None for d in datas):
        out["w"] = np.stack([np.ones_like(d.y) if d.weights is None else d.weights
                             for d in datas])
    return out


def _numpy_loss(fns, loss, model, theta, shared, batch, datas, per_problem):
    """Any `sciml.losses.ObservationLoss`: predictions in JAX, the loss in numpy, vjp back.

    Returns per-problem values, the gradient (summed, or per problem) and the
    per-problem success flags.
    """
    forward, backward = fns
    yhat, ok, nst, vjp = forward(theta, batch)
    Y = np.asarray(jax.device_get(yhat))
    ybar = np.zeros_like(Y)
    pbars = np.zeros((len(datas), model.n_params))
    values = np.zeros(len(datas))
    for b, d in enumerate(datas):
        th = theta if shared else theta[b]
        v, yb, pb = loss(Y[b], d, th, model)
        values[b] = float(v)
        ybar[b] = yb
        if pb is not None:
            pbars[b] = pb
    g = np.asarray(backward(vjp, ybar))
    g = g + (pbars if per_problem else pbars.sum(axis=0))
    return values, g, np.asarray(ok)
