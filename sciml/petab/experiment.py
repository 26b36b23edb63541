"""One simulation of a PEtab problem: its model parameters as expressions of the estimated
parameters and of the pre-initialization networks' outputs (`Outer`), resolved with
PEtab's precedence (`Resolver`), with their Jacobians for the chain rule back."""

import functools
import re

import numpy as np
import sympy

from .errors import PetabError
from .sbml import symbol

__all__ = ["Outer", "PLACEHOLDER", "placeholder_of"]

PLACEHOLDER = re.compile(r"^(observable|noise)Parameter(\d+)_(\w+)$")


class Outer:
    """One simulation's model parameters as functions of the estimated values and of the
    pre-initialization networks' outputs, with their Jacobians (sympy, lambdified)."""

    def __init__(self, pp, eid, cids, changes, placeholders, measured=()):
        self.pp = pp
        z = [symbol(p) for p in pp.scalar_est]
        self.pre = [n for n, nt in pp.nets.items() if nt.pre]
        o_syms = {n: [s for s, (m, _) in sorted(pp._out_sym.items(), key=lambda kv: kv[1][1])
                      if m == n] for n in self.pre}
        self.o_index = {n: [pp._out_sym[s][1] for s in o_syms[n]] for n in self.pre}
        o_all = [s for n in self.pre for s in o_syms[n]]
        # the array inputs of the model's networks, as this simulation's conditions give them
        consts = {name: float(input_array(pp, eid, cids, pid)[j])
                  for name, (pid, j) in pp._array_params.items()}
        res = Resolver(pp, eid, changes, placeholders, set(o_all), measured, consts)
        theta_e = [res(symbol(p), f"model parameter {p!r}") for p in pp._mech]
        self.n_mech = len(theta_e)
        # the model parameters the estimated ones reach (forward sensitivities need no more)
        self.reached = [i for i, e in enumerate(theta_e) if e.free_symbols]
        self.T = lambdified(z + o_all, theta_e)
        self.inputs = {}
        for n in self.pre:
            items = []
            for e in pp._net_in[n]:
                if isinstance(e, tuple):
                    items.append(input_array(pp, eid, cids, e[1]))
                else:
                    items.append(res(e, f"an input of network {n!r}"))
            arrays = [a for a in items if isinstance(a, np.ndarray)]
            if arrays:
                if len(items) != 1:
                    raise PetabError(f"network {n!r}: an array input with other inputs")
                self.inputs[n] = ("array", arrays[0])
            else:
                if any(o in e.free_symbols for e in items for o in o_all):
                    raise PetabError(f"network {n!r}: its input depends on another "
                                     "pre-initialization network's output")
                self.inputs[n] = ("expr", lambdified(z, items))
        self.o_all_count = [len(o_syms[n]) for n in self.pre]
        self.model_nets = [(n, pp.model.param_slices[n]) for n, nt in pp.nets.items()
                           if not nt.pre]

    def theta(self, zv, W):
        """The model's flat parameters (and a tape for `vjp`)."""
        outs, tape = [], {}
        for n in self.pre:
            kind, src = self.inputs[n]
            a = src if kind == "array" else src.value(zv)
            y = np.asarray(self.pp.nets[n].net(*self._args(n, a), W[n]), dtype=np.float64)
            outs.append(y.ravel()[self.o_index[n]])
            tape[n] = (a, y.shape)  # (a batched input gives a batched output)
        ov = np.concatenate(outs) if outs else np.zeros(0)
        args = np.concatenate([zv, ov])
        theta = np.empty(self.pp.model.n_params)
        theta[:self.n_mech] = self.T.value(args)
        for n, s in self.model_nets:
            theta[s] = W[n]
        return theta, (args, tape, W)

    def _args(self, n, a):
        """The network's inputs: ``a`` itself for one, else ``a`` (their concatenation, as
        the mapping table lists them) split by input."""
        nt = self.pp.nets[n]
        k = len(nt.net.inputs)
        if k == 1:
            return (a,)
        sizes = [sum(1 for arg, _ in nt.inputs if arg == i) for i in range(k)]
        return tuple(np.split(np.asarray(a), np.cumsum(sizes)[:-1]))

    def vjp(self, g, tape, gz, gW):
        """Adds ``g^T d theta / d z`` to gz and the networks' part to gW."""
        args, nin, W = tape
        nz = len(gz)
        # only the parameters the estimated ones reach: another's gradient may be NaN where
        # its observable's derivative is (0/0 at a start at zero) and must not leak in
        gm = np.zeros(self.n_mech)
        gm[self.reached] = g[self.reached]
        ga = self.T.jacobian(args).T @ gm
        gz += ga[:nz]
        off = nz
        for n, cnt in zip(self.pre, self.o_all_count):
            go = ga[off:off + cnt]
            off += cnt
            net = self.pp.nets[n].net
            a, shape = nin[n]
            v = np.zeros(shape)
            v.ravel()[self.o_index[n]] = go
            *xbars, pbar = net.vjp(v, *self._args(n, a), W[n])
            gW[n] += pbar
            xbar = np.concatenate([np.ravel(x) for x in xbars])
            kind, src = self.inputs[n]
            if kind == "expr":
                gz += src.jacobian(args[:nz]).T @ np.asarray(xbar).ravel()
        for n, s in self.model_nets:
            gW[n] += g[s]


def input_array(pp, eid, cids, pid):
    """The array of input `pid` for a simulation with conditions `cids`: the one stored
    under one of them, else the one for every condition (``0``)."""
    arrays = pp.input_arrays[pid]
    key = next((c for c in cids if c in arrays), "0")
    if key not in arrays:
        raise PetabError(f"experiment {eid!r}: no input array for {pid!r} "
                         f"(condition {', '.join(cids) or 'none'}) in the array "
                         f"files (have: {', '.join(arrays)})")
    return arrays[key]


class Resolver:
    """Value of a symbol in one simulation, as an expression of the estimated parameters
    and the pre-initialization networks' outputs (PEtab's precedence: condition, then
    hybridization, then parameter table, then the SBML model)."""

    def __init__(self, pp, eid, changes, placeholders, outputs, measured=(), constants=None):
        self.pp, self.eid, self.changes = pp, eid, changes
        self.ph, self.outputs, self.measured = placeholders, outputs, set(measured)
        self.constants = constants or {}  # name -> value fixed for this simulation
        self.cache = {}

    def __call__(self, expr, what):
        return expr.xreplace({s: self.symbol(s, what, ()) for s in expr.free_symbols})

    def symbol(self, s, what, stack):
        if s in self.cache:
            return self.cache[s]
        name = s.name
        if name in stack:
            raise PetabError(f"experiment {self.eid!r}: {name!r} is defined in terms of itself "
                             f"({' -> '.join(stack + (name,))})")
        stack = stack + (name,)
        pp = self.pp

        def deep(e):
            return e.xreplace({q: self.symbol(q, what, stack) for q in e.free_symbols})

        if s in self.outputs:
            v = s
        elif name in self.constants:
            v = sympy.Float(self.constants[name])
        elif name in self.ph:
            v = self.ph[name]
            v = sympy.Float(float(v)) if _is_number(v) else deep(symbol(v))
        elif placeholder_of(pp, name) is not None:
            oid = placeholder_of(pp, name)
            if oid in self.measured:
                raise PetabError(f"experiment {self.eid!r}: the measurements of {oid!r} give "
                                 f"no value for its placeholder {name!r} (columns "
                                 "observableParameters / noiseParameters)")
            # the placeholder of an observable this simulation does not measure: its
            # value is never read, but it must be a number for the solve
            v = sympy.Float(1.0)
        elif name.startswith("u0_") and name[3:] in pp.states:
            st = name[3:]
            if st in self.changes:
                v = deep(self.changes[st])
            elif st in pp._assign_outer:
                v = deep(pp._assign_outer[st])
            else:
                v = deep(pp.sbml.expand(pp.sbml.initial[st]))
        elif name in pp._switches.synthetic:  # a time switch's flag or switching time
            v = deep(pp._switches.synthetic[name])
        elif name in self.changes:
            v = deep(self.changes[name])
        elif name in pp._assign_outer:
            v = deep(pp._assign_outer[name])
        elif name in pp.params:
            p = pp.params[name]
            v = s if p["estimate"] else sympy.Float(p["nominal"])
        elif name in pp.sbml.initial:
            v = deep(pp.sbml.expand(pp.sbml.initial[name]))
        else:
            raise PetabError(f"experiment {self.eid!r}: {what} needs {name!r}, which has no "
                             "value (not in the parameter table, the conditions or the model)")
        self.cache[s] = v
        return v


def placeholder_of(pp, name):
    """The observable whose placeholder `name` is (``noiseParameter1_obs`` -> ``obs``), or
    None: a name of that form is a placeholder only where its suffix is an observable and
    the parameter table does not list it (Lang_PLOSComputBiol2024 estimates parameters
    named ``noiseParameter2_cycA_nuc``, ``cycA_nuc`` being no observable)."""
    m = PLACEHOLDER.match(name)
    if m is None or name in pp.params or m.group(3) not in pp._obs_rows:
        return None
    return m.group(3)


def _is_number(v):
    try:
        float(v)
        return True
    except ValueError:
        return False


def lambdified(args, exprs):
    """``exprs(args)`` and its Jacobian (`_lambdify`), shared by every simulation whose
    expressions differ from another's only in their floating-point numbers: those are
    arguments of the shared code. A problem's conditions often give one simulation the
    same expressions as the next with other numbers in them (Fiedler_BMCSystBiol2016:
    thirty initial values of up to 250 operations each, 1.2 s of sympy's differentiating
    and printing a simulation; Raimundez_PCB2020: 170 simulations)."""
    numbers = []
    shape = tuple(_numbers_out(e, numbers) for e in exprs)
    names = tuple(_number(i) for i in range(len(numbers)))
    return _Bound(_lambdified(tuple(args), names, shape), np.array(numbers, dtype=np.float64))


def _number(i):
    # an identifier (lambdify renames others, slowly) outside SBML's and PEtab's ASCII ids
    return sympy.Symbol(f"\u03bd{i}")


def _numbers_out(e, numbers):
    """``e`` with each distinct floating-point number in it a symbol `_number` (its value
    appended to ``numbers``); an expression's equal numbers are one symbol, which keeps its
    derivatives as small as the expression's."""
    mine = {}
    for node in sympy.preorder_traversal(e):
        if isinstance(node, sympy.Float) and node not in mine:
            mine[node] = _number(len(numbers))
            numbers.append(float(node))
    return e.xreplace(mine) if mine else e


@functools.lru_cache(maxsize=1024)
def _lambdified(args, extra, exprs):
    return _lambdify(list(args), list(exprs), list(extra))


class _Bound:
    """A `_lambdify` with its last arguments given."""

    def __init__(self, shared, numbers):
        self.shared = shared
        self.numbers = numbers

    def _with_numbers(self, a):
        return np.concatenate([np.asarray(a, dtype=np.float64), self.numbers])

    def value(self, a):
        return self.shared.value(self._with_numbers(a))

    def jacobian(self, a):
        return self.shared.jacobian(self._with_numbers(a))


class _lambdify:
    """``exprs(args, extra)`` and its Jacobian in ``args``, compiled by sympy's lambdify
    (numpy)."""

    def __init__(self, args, exprs, extra=()):
        self.n = len(exprs)
        self.args = args
        m = sympy.Matrix(exprs) if exprs else sympy.zeros(0, 1)
        # The Jacobian's nonzero entries only, differentiating each expression by the
        # symbols it has: most of a PEtab model's parameters are constants of a simulation
        # (the dense matrix, generated as code, took minutes for Raimundez_PCB2020's 170
        # simulations)
        nz = [(i, k, sympy.diff(e, a)) for i, e in enumerate(exprs) for k, a in enumerate(args)
              if a in e.free_symbols]
        nz = [t for t in nz if t[2] != 0]
        self._rows = np.array([t[0] for t in nz], dtype=np.int64)
        self._cols = np.array([t[1] for t in nz], dtype=np.int64)
        self._f = sympy.lambdify([args + extra], list(m), "numpy")
        self._j = sympy.lambdify([args + extra], [t[2] for t in nz], "numpy", cse=True)

    def value(self, a):
        return np.array(self._f(a), dtype=np.float64).reshape(self.n)

    def jacobian(self, a):
        J = np.zeros((self.n, len(self.args)))
        if self._rows.size:
            J[self._rows, self._cols] = np.array(self._j(a), dtype=np.float64)
        return J
