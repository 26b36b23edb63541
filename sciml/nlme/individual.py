"""The individual-parameter function, traced once: model parameters from theta, eta, covariates.

``individual(theta, eta, cov)`` is plain Python, like a model function:
``{"ka": np.exp(theta.tka + eta.ka), "CL": np.exp(theta.tcl + eta.cl) * (cov.WT / 70)
** 0.75}``. It is called once with symbols (the model tracer's `Sym`), and
its expressions and their exact derivatives over theta and eta become one
numpy function (sympy ``lambdify``). Model parameters it does not return
keep the subject's values.

``individual(theta, eta, cov, nets)`` may also call networks of its own:
``nets.F([cov.WT / 70, eta.cl])`` returns the chain's outputs as expressions,
the chain written out layer by layer (``act(W x + b)``) with one symbol per
weight. The weights are thetas to the rest of the package (they follow the
named thetas in the theta vector), so their derivatives, the exact gradients
and the fit need nothing of their own. Meant for the small networks such
functions hold: the expressions grow with the weights.
"""

import numpy as np
import sympy
from scipy.special import expit as _expit

from sciml.model.netcode import Act
from sciml.model.trace import ModelError, Sym

__all__ = ["Individual"]


class _Names:
    """``theta.NAME`` / ``eta.NAME`` / ``cov.NAME`` inside the traced function."""

    def __init__(self, kind, symbols, known, why):
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_symbols", symbols)
        object.__setattr__(self, "_known", known)
        object.__setattr__(self, "_why", why)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        symbols = self.__dict__["_symbols"]
        if name not in symbols:
            known = self.__dict__["_known"]
            if known is not None and name not in known:
                raise ValueError(f"NLME: `individual` uses {self._kind} {name!r}, "
                                 f"{self._why}; known: {', '.join(known) or '(none)'}")
            symbols[name] = sympy.Symbol(f"{self._kind}_{name}", real=True)
        return Sym(symbols[name])

    __getitem__ = __getattr__

    def __setattr__(self, name, value):
        raise ValueError(f"NLME: `individual` cannot set {self._kind}.{name}")


class _Nets:
    """``nets.NAME(inputs)`` inside the traced function: the chain's outputs as expressions of
    its inputs and of one symbol per weight (``weights[NAME]``)."""

    def __init__(self, chains):
        self._chains = chains
        self.weights = {n: [sympy.Symbol(f"w_{n}_{i}", real=True) for i in range(c.n_params)]
                        for n, c in chains.items()}

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._chains:
            raise ValueError(f"NLME: `individual` calls network {name!r}, which is not in "
                             f"`nets`; its networks: {', '.join(self._chains) or '(none)'}")
        chain, w = self._chains[name], self.weights[name]

        def call(inputs):
            x = [_expr(v, f"an input of network {name!r}") for v in _inputs(inputs, name)]
            if len(x) != chain.n_in:
                raise ValueError(f"NLME: network {name!r} takes {chain.n_in} inputs, "
                                 f"`individual` gave {len(x)}")
            for (nin, nout, name_, woff, boff) in chain.dense_layers:
                act = Act(name_)
                if not act.builtin:
                    raise ModelError(f"NLME: network {name!r} uses the registered activation "
                                     f"{act.name!r}; networks in `individual` need a builtin "
                                     "activation")
                x = [act.value(sum((w[woff + o * nin + i] * x[i] for i in range(nin)),
                                   w[boff + o] if boff >= 0 else sympy.Integer(0)))
                     for o in range(nout)]
            return [Sym(v) for v in x]

        return call


def _inputs(inputs, name):
    if isinstance(inputs, (Sym, int, float)):
        return [inputs]
    try:
        return list(inputs)
    except TypeError:
        raise TypeError(f"NLME: network {name!r} takes a list of inputs, got "
                        f"{type(inputs).__name__}") from None


def _diff(e, s):
    """de/ds, with the Dirac deltas of kinks (abs, max in activations) taken as zero."""
    d = sympy.diff(e, s)
    return d.replace(sympy.DiracDelta, lambda *a: sympy.Integer(0)) if d.has(sympy.DiracDelta) \
        else d


def _expr(value, where):
    if isinstance(value, Sym):
        return value.expr
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return sympy.Float(float(value))
    raise ModelError(f"NLME: `individual` returned {type(value).__name__} for {where}; "
                     "expected a number or an expression of theta, eta and cov")


class Individual:
    """A traced individual-parameter function.

    Attributes
    ----------
    params : tuple of str
        The model parameters it sets, in the order of its dict.
    index : ndarray of int
        Their positions in the model's flat parameter vector.
    covariates : tuple of str
        The covariates it reads (``cov.NAME``).
    """

    def __init__(self, fn, model, theta_names, eta_names, nets=None):
        if not callable(fn):
            raise TypeError(f"NLME: `individual` must be a function individual(theta, eta, "
                            f"cov) returning {{model parameter: expression}}, got {fn!r}")
        th = {n: sympy.Symbol(f"theta_{n}", real=True) for n in theta_names}
        et = {n: sympy.Symbol(f"eta_{n}", real=True) for n in eta_names}
        cv = {}
        proxies = (_Names("theta", th, tuple(theta_names), "which is not in `theta`"),
                   _Names("eta", et, tuple(eta_names), "which has no entry in `omega`"),
                   _Names("covariate", cv, None, ""))
        net_proxy = _Nets(dict(nets or {}))
        if nets:
            out = fn(*proxies, net_proxy)
        else:
            out = fn(*proxies)
        if not isinstance(out, dict) or not out:
            raise TypeError("NLME: `individual` must return a non-empty dict {model parameter: "
                            f"expression}}, got {type(out).__name__}")
        unknown = [k for k in out if k not in model.params]
        if unknown:
            raise ValueError(f"NLME: `individual` sets {', '.join(map(repr, unknown))}, not "
                             f"parameters of the model; its parameters: "
                             f"{', '.join(model.params)}")
        self.params = tuple(out)
        self.index = np.array([model.param_slices[k].start for k in out], dtype=np.int64)
        self.covariates = tuple(cv)
        exprs = [_expr(v, f"parameter {k!r}") for k, v in out.items()]
        ths = list(th.values()) + [w for ws in net_proxy.weights.values() for w in ws]
        self._exprs, self._theta_syms, self._eta_syms = exprs, ths[:len(th)], list(et.values())
        self._all_theta, self._cov_syms = ths, list(cv.values())
        self._compile()

    def _compile(self):
        """The numpy functions of the expressions and their exact derivatives (sympy)."""
        exprs, ths, ets = self._exprs, self._all_theta, self._eta_syms
        d_eta = [[_diff(e, s) for s in ets] for e in exprs]
        d_theta = [[_diff(e, s) for s in ths] for e in exprs]
        args = [ths, ets, self._cov_syms]
        modules = [{"sigmoid": _expit}, "numpy"]
        self._values = sympy.lambdify(args, exprs, modules=modules, cse=True)
        self._derivs = sympy.lambdify(args, [exprs, d_eta, d_theta], modules=modules, cse=True)
        d2_ee = [[[_diff(d, s) for s in ets] for d in row] for row in d_eta]
        d2_et = [[[_diff(d, s) for s in ths] for d in row] for row in d_eta]
        self._second = sympy.lambdify(args, [d2_ee, d2_et], modules=modules, cse=True)
        self.n_eta, self.n_theta = len(ets), len(ths)

    def __getstate__(self):
        # pickled by its traced expressions (for worker processes and Dask): the numpy
        # functions sympy generated are made again, and the user's function is not needed
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_values", "_derivs", "_second")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._compile()

    # A line search may try an eta whose exp overflows: the solve then fails and the step
    # is shortened; numpy's overflow warning would only be noise.

    def values(self, theta, eta, cov):
        """The parameters it sets, (k,)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return np.array(self._values(theta, eta, cov), dtype=float).ravel()

    def values_many(self, theta, etas, covs):
        """The parameters it sets for many subjects at once, (n, k): ``etas`` (n, n_eta),
        ``covs`` (n, n_cov), one numpy evaluation (the sampler's proposals of every
        subject)."""
        n = etas.shape[0]
        with np.errstate(over="ignore", invalid="ignore"):
            out = self._values(theta, etas.T, covs.T)
        return np.column_stack([np.broadcast_to(np.asarray(v, dtype=float), (n,))
                                for v in out])

    def mu_references(self):
        """``{eta index: theta index}`` of the random effects that enter only as
        ``theta_j + eta_a`` (mu-referencing: ``psi_a = theta_j + eta_a`` is then a Gaussian
        individual parameter with mean ``theta_j``, which SAEM updates in closed form).

        Found on the traced expressions: ``eta_a`` is replaced by ``z - theta_j``; if no
        expression holds ``theta_j`` any more, they occur only as that sum. Each theta
        references at most one eta (the first found)."""
        out, taken = {}, set()
        for a, e in enumerate(self._eta_syms):
            if not any(x.has(e) for x in self._exprs):
                continue
            for j, th in enumerate(self._theta_syms):
                if j in taken or not any(x.has(th) for x in self._exprs):
                    continue
                z = sympy.Dummy("z", real=True)
                moved = [x.subs(e, z - th) for x in self._exprs]
                if not any(x.has(th) and sympy.simplify(x).has(th) for x in moved):
                    out[a] = j
                    taken.add(j)
                    break
        return out

    def derivatives(self, theta, eta, cov):
        """``(phi (k,), dphi/deta (k, n_eta), dphi/dtheta (k, n_theta))``."""
        with np.errstate(over="ignore", invalid="ignore"):
            phi, de, dt = self._derivs(theta, eta, cov)
        k = len(self.params)
        return (np.array(phi, dtype=float).ravel(),
                np.array(de, dtype=float).reshape(k, -1),
                np.array(dt, dtype=float).reshape(k, -1))

    def second_derivatives(self, theta, eta, cov):
        """``(d2phi/deta2 (k, n_eta, n_eta), d2phi/deta dtheta (k, n_eta, n_theta))``."""
        with np.errstate(over="ignore", invalid="ignore"):
            ee, et = self._second(theta, eta, cov)
        k = len(self.params)
        return (np.array(ee, dtype=float).reshape(k, self.n_eta, self.n_eta),
                np.array(et, dtype=float).reshape(k, self.n_eta, self.n_theta))

    def covariate_vector(self, subject, t):
        """The covariates it reads, of ``subject`` at time ``t`` (a time-varying covariate
        at its value there: `sciml.data.Subject.covariates_at`), with a clear error for
        one that is missing or not a number."""
        cov = getattr(subject, "covariates", None) or {}
        series = getattr(subject, "covariate_series", None) or {}
        sid = getattr(subject, "id", "?")
        now = subject.covariates_at(t) if series else cov
        out = []
        for name in self.covariates:
            if name not in now:
                raise ValueError(f"NLME: subject {sid!r} has no covariate {name!r} (used by "
                                 f"`individual`); its covariates: {', '.join(cov) or '(none)'}")
            try:
                out.append(float(now[name]))
            except (TypeError, ValueError):
                raise ValueError(f"NLME: covariate {name!r} of subject {sid!r} is "
                                 f"{now[name]!r} at t = {t:g}, not a number") from None
            if not np.isfinite(out[-1]):
                raise ValueError(f"NLME: covariate {name!r} of subject {sid!r} is "
                                 f"{now[name]!r} at t = {t:g}; a finite number is needed")
        return np.array(out)


class SubjectIndividual:
    """The individual function as one subject sees it: its parameters in each of the
    subject's pieces (`predict`), stacked, ``Phi = (phi_1, ..., phi_J)``.

    Piece j has its covariates ``covs[j]`` and sees the random effects ``E_j b`` of the
    subject's vector ``b`` (`Effects.maps`: its between-subject etas and its occasion's
    etas added in; the identity without occasions, ``maps`` None). The derivatives in b
    follow by the chain rule through the constant ``E_j``.
    """

    def __init__(self, ind, covs, maps=None):
        self.ind, self.covs, self.maps = ind, covs, maps
        self.index = ind.index
        self.J = covs.shape[0]
        self.simple = self.J == 1 and maps is None

    def _seen(self, b, j):
        return b if self.maps is None else self.maps[j] @ b

    def values(self, theta, b):
        """``Phi`` (J k,)."""
        if self.simple:
            return self.ind.values(theta, b, self.covs[0])
        return np.concatenate([self.ind.values(theta, self._seen(b, j), self.covs[j])
                               for j in range(self.J)])

    def values_many(self, theta, B):
        """``Phi`` of many random-effect vectors ``B`` (n, n_b): (n, J k)."""
        n = B.shape[0]
        return np.concatenate([
            self.ind.values_many(theta, B if self.maps is None else B @ self.maps[j].T,
                                 np.tile(self.covs[j], (n, 1)))
            for j in range(self.J)], axis=1)

    def derivatives(self, theta, b):
        """``(Phi (J k,), dPhi/db (J k, n_b), dPhi/dtheta (J k, n_theta))``."""
        if self.simple:
            return self.ind.derivatives(theta, b, self.covs[0])
        parts = []
        for j in range(self.J):
            phi, de, dt = self.ind.derivatives(theta, self._seen(b, j), self.covs[j])
            parts.append((phi, de if self.maps is None else de @ self.maps[j], dt))
        return tuple(np.concatenate(a) for a in zip(*parts))

    def second_derivatives(self, theta, b):
        """``(d2Phi/db2 (J k, n_b, n_b), d2Phi/db dtheta (J k, n_b, n_theta))``."""
        if self.simple:
            return self.ind.second_derivatives(theta, b, self.covs[0])
        parts = []
        for j in range(self.J):
            ee, et = self.ind.second_derivatives(theta, self._seen(b, j), self.covs[j])
            if self.maps is not None:
                E = self.maps[j]
                ee = np.einsum("kac,ax,cy->kxy", ee, E, E)
                et = np.einsum("kab,ax->kxb", et, E)
            parts.append((ee, et))
        return tuple(np.concatenate(a) for a in zip(*parts))


class Effects:
    """The random effects of subjects with occasions: between-subject etas ``bsv`` (their
    variances in Omega) and per occasion the etas ``iov`` (variances in the IOV matrix,
    Pi), read from the ``column`` of each subject (`sciml.data.Subject.covariate_series`
    or its constant covariate). A subject's vector is ``b = (eta, kappa_1, ...,
    kappa_O)``, its prior ``N(0, blockdiag(Omega, Pi, ..., Pi))``; the individual
    function's ``eta.NAME`` (traced names ``names``) is the subject's eta NAME plus, in
    occasion o, its kappa_o NAME (either may be absent)."""

    def __init__(self, names, bsv, iov, column):
        self.names, self.bsv, self.iov, self.column = tuple(names), tuple(bsv), tuple(iov), \
            column

    def size(self, n_occ):
        return len(self.bsv) + n_occ * len(self.iov)

    def maps(self, occasions, n_occ):
        """``E_j`` (n_names, n_b) of each piece's occasion."""
        nb, ni = len(self.bsv), len(self.iov)
        out = []
        for o in occasions:
            E = np.zeros((len(self.names), self.size(n_occ)))
            for a, name in enumerate(self.names):
                if name in self.bsv:
                    E[a, self.bsv.index(name)] = 1.0
                if name in self.iov:
                    E[a, nb + o * ni + self.iov.index(name)] = 1.0
            out.append(E)
        return out

    def occasions(self, subject):
        """``(times the occasion changes, t -> occasion index)`` of ``subject``: its
        occasions numbered 0, 1, ... in the order they start."""
        sid = getattr(subject, "id", "?")
        series = (getattr(subject, "covariate_series", None) or {}).get(self.column)
        if series is None:
            cov = getattr(subject, "covariates", None) or {}
            if self.column not in cov:
                raise ValueError(f"NLME: subject {sid!r} has no occasion column "
                                 f"{self.column!r} (`occasion`); its columns: "
                                 f"{', '.join(cov) or '(none)'}")
            return set(), lambda t: 0
        times, vals = (np.asarray(series[0], dtype=float), list(series[1]))
        t0, tf = subject.problem.tspan
        keep = [j for j in range(len(times)) if j == 0 or t0 < times[j] < tf]
        order = []
        for j in keep:
            if vals[j] not in order:
                order.append(vals[j])
            elif order[-1] != vals[j]:
                raise ValueError(f"NLME: subject {sid!r} returns to occasion {vals[j]!r} at "
                                 f"t = {times[j]:g} after another one; an occasion is one "
                                 "stretch of time (number the occasions in order)")

        def at(t):
            j = int(np.searchsorted(times, t, side="right")) - 1
            return order.index(vals[max(j, 0)])

        return {float(times[j]) for j in keep if t0 < times[j] < tf}, at
