"""`PetabProblem`: a PEtab SciML problem as `sciml` models, problems and data.

How the format maps onto the public machinery:

- The SBML model, with the networks of the right-hand side (hybridization
  targets replaced by network outputs), becomes one `sciml.Model`; every
  PEtab observable and its noise formula are observables of it (networks in
  observables are called there). Initial values are model parameters
  ``u0_<state>`` so that conditions and networks can set them. An array-file
  input of a network in the model is constant in time: its entries are model
  parameters ``<input id>[j]``, set per simulation from its condition's array.
- Each experiment (split further where measurement rows give the
  placeholders different values) is an `sciml.ODEProblem` and a
  `Measurements`; its model parameters are expressions of the estimated
  parameters and of the outputs of the pre-initialization networks, which
  are evaluated once per experiment before the solve (``net(x, p)``) with
  their gradient chained back by ``net.vjp``.
- The gradient of each experiment is `sciml.loss_and_grad` (exact, by the
  chosen sensitivity method), mapped back to the estimated parameters
  through the Jacobian of that per-experiment map.
"""

import math
import os
import re
from dataclasses import replace

import numpy as np
import sympy
import yaml

import adjoints

from ..gradient import loss_and_grad, loss_value
from ..model import Model
from ..problem import ODEProblem
from ..segments import in_span, segments
from ..solve import solve
from ..solvers.kernels.observe import observe_jumps
from ..steady import steady_state
from . import likelihood as lk
from .errors import PetabError
from .experiment import PLACEHOLDER, Outer, placeholder_of
from .sbml import TIME, read_sbml, symbol
from .switches import Switches
from .tables import number, parse_formula, read_table
from .v1 import read_v1

__all__ = ["PetabProblem", "load"]

_IN = re.compile(r"^(\w+)\.inputs\[(\d+)\](?:\[(\d+)\])?$")
_OUT = re.compile(r"^(\w+)\.outputs\[(\d+)\]\[(\d+)\]$")
_PAR = re.compile(r"^(\w+)\.parameters(?:\[(\w+)\](?:\.(\w+))?)?$")


def load(problem_yaml, **options):
    """Read a PEtab SciML problem from its ``problem.yaml``; see `PetabProblem`."""
    return PetabProblem(problem_yaml, **options)


class _Net:
    """One network of the problem: its graph, where it sits, its parameters' status."""

    def __init__(self, name, net, pre):
        self.name, self.net, self.pre = name, net, pre
        self.w0 = np.zeros(net.n_params)              # nominal flat parameters
        self.level = np.full(net.n_params, -1)        # specificity of the row that set each
        self.estimated = np.zeros(net.n_params, bool)
        self.priors = []                              # (distribution, parameters) per row
        self.prior = np.full(net.n_params, -1)        # index into priors of each entry, -1 none
        self.inputs = {}                              # (arg, index or None) -> entity id
        self.outputs = {}                             # entity id -> flat output index
        self.chain = None                             # the nets.Chain inside the model


class PetabProblem:
    """A PEtab SciML problem (``problem.yaml``), ready for likelihoods, gradients and fits.

    Parameters
    ----------
    problem_yaml : str or path
    solver : sciml solver, optional
        Default `sciml.Rodas5()` (stiff, as AMICI and PEtab.jl default to for SBML
        models), or `sciml.Tsit5()` when networks sit in the right-hand side.
    sensealg : adjoints method, optional
        Default ``adjoints.ForwardSensitivity()`` where networks sit in the right-hand side
        (see `DEFAULT_SENSEALG`), else `adjoints.default_sensealg`'s choice for the model
        and solver (with Rodas5, `DiscreteAdjoint` up to 64 states, `GaussAdjoint`
        beyond: faster than forward sensitivities or `GaussAdjoint` on 27 of the
        Benchmark-Models collection's 30 models of that size; forward sensitivities cost
        n_states x n_params extra states, 40x the adjoint's time on Alkan_SciSignal2018's
        73 conditions).
    rtol, atol : float
        Tolerances of the solves (default 1e-8, 1e-10).
    share_solves : bool
        Experiments whose conditions give the model the same start, parameters and
        pre-equilibration (they differ only in what is measured, or in their observables'
        and noise parameters) share one solve, to the last of their times (default True;
        Raimundez_PCB2020's 170 experiments are 37 solves). False: one solve each.

    Attributes
    ----------
    parameter_names : list of str
        The estimated parameters in the parameter table's order; a network's
        estimated entries appear, flattened (``net1.parameters[layer1].weight[0,1]``),
        where the network's first row is.
    nominal : ndarray
        The estimated parameters at their nominal values, on their PEtab scale.
    lower_bounds, upper_bounds : ndarray
        On the parameter scale (networks: as the table gives, often infinite).
    model : sciml.Model
    """

    #: why the default: the forward sensitivities are integrated with the states under one
    #: error control, so the gradient is as accurate as the solve even where a ReLU network
    #: makes the right-hand side kinked (the discrete adjoint differentiates the steps taken,
    #: whose error grows at the kinks).
    DEFAULT_SENSEALG = "ForwardSensitivity"

    def __init__(self, problem_yaml, solver=None, sensealg=None, rtol=1e-8, atol=1e-10,
                 share_solves=True):

        from ..solvers.erk import Tsit5
        from ..solvers.rosenbrock import Rodas5

        self.path = os.fspath(problem_yaml)
        self.solver = solver
        self.sensealg = sensealg
        self.rtol, self.atol = float(rtol), float(atol)
        self.share_solves = bool(share_solves)
        self._read()
        self._build_model()
        if self.solver is None:
            # SBML models are often stiff (AMICI and PEtab.jl default to stiff solvers);
            # networks in the right-hand side are not, and an explicit method needs no
            # second derivatives through them
            self.solver = Tsit5() if self.model.nets else Rodas5()
        if self.sensealg is None:
            self.sensealg = adjoints.ForwardSensitivity() if self.model.nets else \
                adjoints.default_sensealg(self.model, self.solver)
        self._build_simulations()

    # ================================================================== reading

    def _file(self, name):
        return os.path.join(self.dir, name)

    def _read(self):
        if not os.path.isfile(self.path):
            raise PetabError(f"the PEtab problem file {self.path} does not exist")
        with open(self.path) as f:
            cfg = yaml.safe_load(f)
        self.dir = os.path.dirname(os.path.abspath(self.path))
        version = str(cfg.get("format_version", "")).split(".")[0]
        if version == "1":
            self._read_v1(cfg)
        elif version == "2":
            self._read_v2(cfg)
        else:
            raise PetabError(f"{self.path}: format_version {cfg.get('format_version')!r}; "
                             "PEtab v1 (1.0.0) and v2 (2.0.0) problems are read")
        self._read_mapping()
        self._read_parameters()

    def _read_v1(self, cfg):
        sbml_path, t = read_v1(self.path, cfg, self._file)
        self.version = 1
        self.sbml = read_sbml(sbml_path)
        self.t_par, self.t_obs, self.t_meas = t["parameter"], t["observable"], t["measurement"]
        self.t_cond, self.t_exp = t["condition"], t["experiment"]
        self._condition_ids = t["condition_ids"]
        self.t_map, self.t_hyb, self.nets, self.input_arrays = [], [], {}, {}

    def _read_v2(self, cfg):
        self.version = 2

        def files(key, required=True):
            out = cfg.get(key) or []
            if required and not out:
                raise PetabError(f"{self.path}: `{key}` is missing (a required table)")
            return [self._file(p) for p in out]

        models = cfg.get("model_files") or {}
        if len(models) != 1:
            raise PetabError(f"{self.path}: `model_files` must name one SBML model, got "
                             f"{len(models)}")
        (mid, spec), = models.items()
        if spec.get("language", "sbml") != "sbml":
            raise PetabError(f"{self.path}: model {mid!r} is in {spec.get('language')!r}; "
                             "only SBML is read")
        sbml_path = self._file(spec["location"])
        if not os.path.isfile(sbml_path):
            raise PetabError(f"the SBML model {sbml_path} does not exist (named in "
                             f"{self.path})")
        self.sbml = read_sbml(sbml_path)
        sciml = (cfg.get("extensions") or {}).get("sciml") or {}

        def tables(key, required_cols, what, required=True):
            out = [read_table(p, required_cols, what) for p in files(key, required)]
            return out

        # parameterScale is optional in current v2 drafts (default lin)
        self.t_par = tables("parameter_files", ["parameterId", "lowerBound", "upperBound",
                                                "nominalValue", "estimate"], "parameter")
        self.t_obs = tables("observable_files", ["observableId", "observableFormula",
                                                 "noiseFormula"], "observable")
        self.t_meas = tables("measurement_files", ["observableId", "experimentId", "time",
                                                   "measurement"], "measurement")
        self.t_cond = tables("condition_files", ["conditionId", "targetId", "targetValue"],
                             "condition", required=False)
        self.t_exp = tables("experiment_files", ["experimentId", "time", "conditionId"],
                            "experiment", required=False)
        self.t_map = tables("mapping_files", ["petabEntityId", "modelEntityId"], "mapping",
                            required=False)
        hyb = [self._file(p) for p in sciml.get("hybridization_files") or []]
        self.t_hyb = [read_table(p, ["targetId", "targetValue"], "hybridization") for p in hyb]
        from nets import petab as npetab

        self.nets = {}
        # the networks' section: `neural_networks` in the current PEtab SciML files (the
        # suite renamed it at 0c00157), `neural_nets` in earlier ones; both are read
        specs = sciml.get("neural_nets") or sciml.get("neural_networks") or {}
        for name, spec in specs.items():
            loc = self._file(spec["location"])
            if not os.path.isfile(loc):
                raise PetabError(f"the network file {loc} of {name!r} does not exist (named "
                                 f"in {self.path})")
            self.nets[name] = _Net(name, npetab.load(loc), bool(spec.get("pre_initialization")))
        self._read_arrays(npetab, [self._file(p) for p in sciml.get("array_files") or []])

    def _read_arrays(self, npetab, paths):
        import h5py

        self.input_arrays = {}  # input entity id -> {condition id or "0": array}
        for path in paths:
            if not os.path.isfile(path):
                raise PetabError(f"the array file {path} does not exist (named in {self.path})")
            with h5py.File(path, "r") as h:
                for name in (h["parameters"].keys() if "parameters" in h else ()):
                    if name not in self.nets:
                        raise PetabError(f"{path}: parameters for {name!r}, which is not a "
                                         f"network of the problem ({', '.join(self.nets)})")
                    nt = self.nets[name]
                    grp = h["parameters"][name]
                    for lid, arr, shape, _ in nt.net.arrays:
                        if lid not in grp or arr not in grp[lid]:
                            raise PetabError(f"{path}: no array parameters/{name}/{lid}/{arr}")
                        got = grp[lid][arr].shape
                        if tuple(got) != tuple(shape):
                            raise PetabError(f"{path}: parameters/{name}/{lid}/{arr} has shape "
                                             f"{tuple(got)}; the network {name!r} expects "
                                             f"{tuple(shape)}")
                    nt.w0[:] = npetab.read_parameters(nt.net, path)
                    nt.level[:] = 0
                for iid in (h["inputs"].keys() if "inputs" in h else ()):
                    grp = h["inputs"][iid]
                    self.input_arrays[iid] = {k: np.asarray(grp[k], dtype=np.float64)
                                              for k in grp.keys()}

    def _read_mapping(self):
        self.entity = {}  # petab entity id -> ("in", net, arg, idx) / ("out", net, k) / ("par", ..)
        for t in self.t_map:
            for line, row in t.rows():
                pid = t.require(line, row, "petabEntityId")
                mid = t.require(line, row, "modelEntityId")
                m_in, m_out, m_par = _IN.match(mid), _OUT.match(mid), _PAR.match(mid)
                m = m_in or m_out or m_par
                if m is None:
                    continue  # a plain model entity: nothing to do for us
                net = m.group(1)
                if net not in self.nets:
                    raise PetabError(f"{t.where(line, 'modelEntityId')}: {mid!r} names the "
                                     f"network {net!r}, which is not in problem.yaml "
                                     f"({', '.join(self.nets) or 'none'})")
                nt = self.nets[net]
                if m_in:
                    arg = int(m.group(2))
                    if arg >= len(nt.net.inputs):
                        raise PetabError(f"{t.where(line, 'modelEntityId')}: {mid!r}: network "
                                         f"{net!r} has {len(nt.net.inputs)} input(s)")
                    idx = None if m.group(3) is None else int(m.group(3))
                    nt.inputs[(arg, idx)] = pid
                    self.entity[pid] = ("in", net, arg, idx)
                elif m_out:
                    self.entity[pid] = ("out", net, int(m.group(2)), int(m.group(3)))
                else:
                    self.entity[pid] = ("par", net, m.group(2), m.group(3), t.where(
                        line, "modelEntityId"))

    def _net_slice(self, nt, layer, array, where):
        sel = np.zeros(nt.net.n_params, bool)
        found = False
        for lid, arr, shape, off in nt.net.arrays:
            if (layer is None or lid == layer) and (array is None or arr == array):
                sel[off:off + int(np.prod(shape))] = True
                found = True
        if not found:
            raise PetabError(f"{where}: network {nt.name!r} has no "
                             f"{'layer ' + repr(layer) if array is None else repr(array)}"
                             f"{'' if array is None else ' in layer ' + repr(layer)}")
        return sel

    def _read_parameters(self):
        self.params = {}   # scalar id -> dict(scale, lb, ub, nominal, estimate, prior)
        order = []         # ("scalar", id) / ("net", name), in table order
        net_rows = []
        for t in self.t_par:
            for line, row in t.rows():
                pid = t.require(line, row, "parameterId")
                if pid in self.params:
                    raise PetabError(f"{t.where(line, 'parameterId')}: {pid!r} is listed twice")
                scale = row.get("parameterScale", "") or "lin"
                if scale not in ("lin", "log", "log10"):
                    raise PetabError(f"{t.where(line, 'parameterScale')}: expected lin, log or "
                                     f"log10, got {scale!r}")
                est = t.require(line, row, "estimate").lower()
                if est not in ("true", "false", "1", "0"):
                    raise PetabError(f"{t.where(line, 'estimate')}: expected true or false, got "
                                     f"{row['estimate']!r}")
                est = est in ("true", "1")
                ent = self.entity.get(pid)
                if ent is not None and ent[0] == "par":
                    if scale != "lin":
                        # the networks' arrays are read, estimated and written as values
                        raise PetabError(f"{t.where(line, 'parameterScale')}: {scale!r} for "
                                         f"the network parameters {pid!r}; they are on the "
                                         "linear scale (lin)")
                    net_rows.append((t, line, row, ent, est))
                    if ("net", ent[1]) not in order:
                        order.append(("net", ent[1]))
                    continue
                lb = number(t, line, "lowerBound", row["lowerBound"] or "-inf")
                ub = number(t, line, "upperBound", row["upperBound"] or "inf")
                nom = number(t, line, "nominalValue", t.require(line, row, "nominalValue"))
                prior = _read_prior(t, line, row)
                self.params[pid] = dict(scale=scale, lb=lb, ub=ub, nominal=nom, estimate=est,
                                        prior=prior)
                order.append(("scalar", pid))
        # networks' rows: more specific rows (a layer, an array) override less specific ones
        net_rows.sort(key=lambda r: (r[3][2] is not None) + (r[3][3] is not None))
        for t, line, row, (_, net, layer, array, where), est in net_rows:
            nt = self.nets[net]
            level = (layer is not None) + (array is not None)
            sel = self._net_slice(nt, layer, array, where)
            nom = row["nominalValue"]
            if nom != "array":
                nt.w0[sel] = number(t, line, "nominalValue", nom)
            elif np.any(nt.level[sel] < 0):
                raise PetabError(f"{t.where(line, 'nominalValue')}: 'array', but no array file "
                                 f"holds the parameters of {net!r}")
            nt.level[sel] = level
            nt.estimated[sel] = est
            # the row's prior covers its entries; a more specific row sets its own (or none)
            prior = _read_prior(t, line, row)
            if prior is None:
                nt.prior[sel] = -1
            else:
                nt.priors.append(prior)
                nt.prior[sel] = len(nt.priors) - 1
        self.scalar_est = [p for k, p in order if k == "scalar" and self.params[p]["estimate"]]
        names, layout = [], []  # layout: ("scalar", id) or ("net", name, flat indices)
        for kind, key in order:
            if kind == "scalar":
                if self.params[key]["estimate"]:
                    names.append(key)
                    layout.append(("scalar", key, len(names) - 1))
                continue
            nt = self.nets[key]
            idx = np.flatnonzero(nt.estimated)
            start = len(names)
            for lid, arr, shape, off in nt.net.arrays:
                for k in range(int(np.prod(shape))):
                    if nt.estimated[off + k]:
                        ij = ",".join(map(str, np.unravel_index(k, shape)))
                        names.append(f"{key}.parameters[{lid}].{arr}[{ij}]")
            layout.append(("net", key, np.arange(start, len(names)), idx))
        self.parameter_names = names
        self._layout = layout
        n = len(names)
        self.nominal = np.zeros(n)
        self.lower_bounds, self.upper_bounds = np.full(n, -np.inf), np.full(n, np.inf)
        for item in layout:
            if item[0] == "scalar":
                p = self.params[item[1]]
                i = item[2]
                self.nominal[i] = _scale(p["nominal"], p["scale"])
                self.lower_bounds[i] = _scale(p["lb"], p["scale"])
                self.upper_bounds[i] = _scale(p["ub"], p["scale"])
            else:
                nt = self.nets[item[1]]
                self.nominal[item[2]] = nt.w0[item[3]]

    # ================================================================== the model

    def _hybridization(self):
        """Net inputs (entity -> expr or 'array') and assignments (target -> expr)."""
        inputs, assign = {}, {}
        for t in self.t_hyb:
            for line, row in t.rows():
                tid = t.require(line, row, "targetId")
                val = t.require(line, row, "targetValue")
                ent = self.entity.get(tid)
                if ent is not None and ent[0] == "in":
                    if val == "array":
                        if tid not in self.input_arrays:
                            raise PetabError(f"{t.where(line, 'targetValue')}: 'array', but no "
                                             f"array file holds inputs/{tid}")
                        inputs[tid] = "array"
                    else:
                        inputs[tid] = (parse_formula(t, line, "targetValue", val),
                                       t.where(line, "targetValue"))
                else:
                    assign[tid] = (parse_formula(t, line, "targetValue", val),
                                   t.where(line, "targetValue"))
        return inputs, assign

    def _array_size(self, net, pid):
        """The length of input `pid`'s arrays (one per condition, all of one 1-D shape): a
        network in the model takes one vector."""
        shapes = {k: a.shape for k, a in self.input_arrays[pid].items()}
        if len(set(shapes.values())) > 1:
            raise PetabError(f"array files: the arrays inputs/{pid}/<condition> of network "
                             f"{net!r} differ in shape ({shapes}); the network in the model "
                             "takes one input size")
        (shape,) = set(shapes.values())
        if len(shape) != 1:
            raise PetabError(f"array files: inputs/{pid} of network {net!r} has shape {shape};"
                             " a network in the model (not pre_initialization) takes a vector")
        return shape[0]

    def _known(self, name):
        return (name in self.params or name in self.sbml.initial or name in self.entity
                or name in self._cond_targets or PLACEHOLDER.match(name) is not None)

    def _check_symbols(self, expr, where):
        for s in expr.free_symbols:
            if s != TIME and not self._known(s.name):
                raise PetabError(f"{where}: unknown parameter or entity {s.name!r} (not in the "
                                 "SBML model, the parameter, condition or mapping tables)")

    def _placeholder_groups(self, parsed):
        """The model's observables: ``(names, observable formulas, noise formulas)``.

        An observable whose formulas have placeholders (``observableParameter1_obs``,
        ``noiseParameter1_obs``) becomes one model observable per distinct assignment of
        them in the measurement table, the row's values (numbers, or parameters) put in
        its formulas; ``self._obs_col[(oid, observable parameters, noise parameters)]``
        is the model observable of a row. So an experiment is one simulation however
        its rows assign the placeholders (Chen_MSB2009's 4 experiments were 39 solves of
        500 states when each assignment had a simulation of its own). An observable
        without placeholders is one model observable, named by its id."""
        seen = {}  # oid -> {(op, np): where the assignment first appears}
        for t in self.t_meas:
            for line, row in t.rows():
                key = (tuple(_split(t, line, "observableParameters", row)),
                       tuple(_split(t, line, "noiseParameters", row)))
                seen.setdefault(row.get("observableId", ""), {}).setdefault(key, (t, line))
        names, obs_e, sig_e = [], [], []
        self._obs_col = {}
        for oid, e, s in parsed:
            phs = {q for q in e.free_symbols | s.free_symbols
                   if placeholder_of(self, q.name) == oid}
            groups = list(seen.get(oid, {}).items())
            if not phs or not groups:
                # (an observable whose placeholders no row assigns is never measured: its
                # placeholders are 1, never read)
                names.append(oid)
                obs_e.append(e.xreplace({q: sympy.Float(1.0) for q in phs}))
                sig_e.append(s.xreplace({q: sympy.Float(1.0) for q in phs}))
                self._obs_col[oid] = oid
                continue
            for k, (key, (t, line)) in enumerate(groups):
                sub = {}
                for kind, vals in zip(("observable", "noise"), key):
                    for i, v in enumerate(vals):
                        q = symbol(f"{kind}Parameter{i + 1}_{oid}")
                        try:
                            sub[q] = sympy.Float(float(v))
                        except ValueError:
                            sub[q] = symbol(v)
                            self._check_symbols(sub[q], t.where(line, f"{kind}Parameters"))
                missing = sorted(q.name for q in phs if q not in sub)
                if missing:
                    col = missing[0].split("Parameter")[0] + "Parameters"
                    raise PetabError(f"{t.where(line, col)}: no value for the placeholder "
                                     f"{missing[0]!r} of {oid!r} (columns observableParameters"
                                     " / noiseParameters)")
                name = oid if len(groups) == 1 else f"{oid}#{k}"
                names.append(name)
                obs_e.append(e.xreplace(sub))
                sig_e.append(s.xreplace(sub))
                self._obs_col[(oid,) + key] = name
        return names, obs_e, sig_e

    def _build_model(self):
        sb = self.sbml
        self._cond_targets = {row["targetId"] for t in self.t_cond for _, row in t.rows()}
        net_inputs, assign = self._hybridization()
        # outputs: entity -> (net, flat index); a net's inputs as expressions, in flat order
        out_sym = {}
        for pid, ent in self.entity.items():
            if ent[0] == "out":
                out_sym[symbol(pid)] = (ent[1], ent[3])
        self._net_in = {}
        self._array_params = {}  # model parameter "<input id>[j]" -> (input id, j)
        for name, nt in self.nets.items():
            exprs = []
            for _key, pid in sorted(nt.inputs.items(), key=lambda kv: (kv[0][0],
                                                                           kv[0][1] or 0)):
                v = net_inputs.get(pid)
                if v == "array" and not nt.pre:
                    # a network of the model: the array is constant in time (per condition),
                    # so its entries become model parameters "<id>[j]" that each simulation
                    # sets from the array of its condition (`Outer`); the traced model stays
                    # one model for all conditions. Brackets: no PEtab or SBML id has them.
                    for j in range(self._array_size(name, pid)):
                        s = symbol(f"{pid}[{j}]")
                        self._array_params[s.name] = (pid, j)
                        exprs.append(s)
                elif v == "array":
                    exprs.append(("array", pid))
                elif v is None:
                    if not (pid in self.params or pid in self._cond_targets):
                        raise PetabError(f"the input {pid!r} of network {name!r} (mapping "
                                         "table) names nothing: it is not a hybridization "
                                         "target, a parameter or a condition target")
                    exprs.append(symbol(pid))
                else:
                    self._check_symbols(v[0], v[1])
                    exprs.append(v[0])
            if not exprs:
                raise PetabError(f"network {name!r} has no inputs in the mapping table")
            self._net_in[name] = exprs
        self._out_sym = out_sym
        model_nets = {n for n, nt in self.nets.items() if not nt.pre}
        states = list(sb.states)
        state_syms = {symbol(s) for s in states}
        self._assign_model, self._assign_outer = {}, {}
        for tid, (e, where) in assign.items():
            self._check_symbols(e, where)
            uses = {out_sym[s][0] for s in e.free_symbols if s in out_sym}
            if uses & model_nets:
                if tid in states:
                    raise PetabError(f"{where}: the right-hand-side network sets the state "
                                     f"{tid!r}; only parameters can be replaced by it")
                self._assign_model[symbol(tid)] = e
            else:
                self._assign_outer[tid] = e
        # expressions of the model, in SBML and PEtab symbols
        rhs = [sb.expand(sb.rhs[s]).xreplace(self._assign_model) for s in states]
        parsed, self._obs_rows = [], {}
        for t in self.t_obs:
            for line, row in t.rows():
                oid = t.require(line, row, "observableId")
                if oid in self._obs_rows:
                    raise PetabError(f"{t.where(line, 'observableId')}: {oid!r} twice")
                e = parse_formula(t, line, "observableFormula", row["observableFormula"])
                s = parse_formula(t, line, "noiseFormula", row["noiseFormula"])
                self._check_symbols(e, t.where(line, "observableFormula"))
                self._check_symbols(s, t.where(line, "noiseFormula"))
                dist = row.get("noiseDistribution", "") or "normal"
                tr = row.get("observableTransformation", "") or "lin"
                if dist not in lk.DISTRIBUTIONS:
                    raise PetabError(f"{t.where(line, 'noiseDistribution')}: expected one of "
                                     f"{', '.join(lk.DISTRIBUTIONS)}, got {dist!r}")
                if tr not in lk.TRANSFORMS:
                    raise PetabError(f"{t.where(line, 'observableTransformation')}: expected "
                                     f"lin, log or log10, got {tr!r}")
                kind, tr2 = lk.DISTRIBUTIONS[dist]
                if tr2 and lk.TRANSFORMS[tr]:
                    raise PetabError(f"{t.where(line, 'observableTransformation')}: {tr!r} "
                                     f"with the noise distribution {dist!r}")
                self._obs_rows[oid] = (kind, tr2 or lk.TRANSFORMS[tr])
                parsed.append((oid, sb.expand(e).xreplace(self._assign_model),
                               sb.expand(s).xreplace(self._assign_model)))
        self.observable_ids = [oid for oid, _, _ in parsed]
        obs_names, obs_e, sig_e = self._placeholder_groups(parsed)
        sig_names = [f"sigma_{o}" for o in obs_names]
        # piecewise switches in time: flag parameters, changed at the switching times
        taken = set(self.params) | set(sb.initial) | set(states) | set(self.entity)
        for e in rhs + obs_e + sig_e:
            taken |= {q.name for q in e.free_symbols}
        events = [replace(ev, trigger=sb.expand(ev.trigger),
                          assign={v: sb.expand(e) for v, e in ev.assign.items()})
                  for ev in sb.events]
        self._switches = Switches(rhs + obs_e + sig_e, state_syms, taken, events, sb.path,
                                  states)
        rhs = [self._switches.replace(e) for e in rhs]
        obs_e = [self._switches.replace(e) for e in obs_e]
        sig_e = [self._switches.replace(e) for e in sig_e]
        # parameters of the model: every free symbol that is not a state, t or a net output
        exprs = rhs + obs_e + sig_e
        for name in model_nets:
            exprs += [e for e in self._net_in[name] if not isinstance(e, tuple)]
        free = set(self._switches.symbols())
        for e in exprs:
            free |= e.free_symbols
        free -= state_syms | {TIME} | set(out_sym)
        self._u0_names = [f"u0_{s}" for s in states]
        mech = sorted({s.name for s in free} | set(self._switches.parameters)) + \
            self._u0_names
        if len(set(self._u0_names) & (set(sorted(s.name for s in free)) | set(states))):
            raise PetabError(f"{self.sbml.path}: an entity is named like an initial value "
                             f"(u0_<state>); rename it")
        chains = {}
        for name in model_nets:
            ch = self.nets[name].net.as_chain()
            if ch is None:
                raise PetabError(f"network {name!r} sits in the model (not pre-initialization)"
                                 " but is not a chain of Linear layers and activations")
            if len(self._net_in[name]) != ch.n_in:
                raise PetabError(f"network {name!r} takes {ch.n_in} input values, but the "
                                 f"mapping and hybridization tables (with the array files) "
                                 f"give it {len(self._net_in[name])}")
            chains[name] = ch
            self.nets[name].chain = ch
        self._mech = mech
        # the model parameters the states depend on: those of the right-hand side, the
        # initial values, and a switch's or event's time and values; the others (scales,
        # offsets, noise) reach only observables, whose parameter derivatives need no
        # forward sensitivities
        dyn = {q.name for e in rhs for q in e.free_symbols} | set(self._u0_names) \
            | set(self._switches.parameters) | set(self._switches.symbols())
        self._dynamic = frozenset(i for i, q in enumerate(mech) if q in dyn)
        self._switches.bind(mech)
        # the model's names: SBML ids that are not plain Python names (`_Cyt__CCND`) mapped
        py = _python_names(states + mech + obs_names + sig_names)
        self._py = py
        sym_of = {**{symbol(s): ("u", py[s]) for s in states},
                  **{symbol(p): ("p", py[p]) for p in mech}}
        net_in, order_nets = self._net_in, sorted(model_nets)

        def bind(u, p, t, nets, es):
            sub = {TIME: t.expr}
            for s, (kind, name) in sym_of.items():
                sub[s] = getattr(u if kind == "u" else p, name).expr
            used = set()
            for e in es:
                used |= e.free_symbols
            for name in order_nets:
                outs = [s for s, (n, _) in out_sym.items() if n == name]
                if not set(outs) & used:
                    continue
                z = nets[name]([_sym(e.xreplace(sub)) for e in net_in[name]])
                for s in outs:
                    sub[s] = z[out_sym[s][1]].expr
            return [_sym(e.xreplace(sub)) for e in es]

        def f(u, p, t, nets):
            return bind(u, p, t, nets, rhs)

        self._events = [_state_event(bind, py, g, direction, assign)
                        for _, g, direction, assign in self._switches.state_events]
        if self._events and (self._switches.flags or self._switches.events):
            raise PetabError(f"{self.sbml.path}: SBML events triggered by the state together "
                             "with switches or events in time are not supported yet")

        observables = {}
        for k, name in enumerate(obs_names + sig_names):
            e = (obs_e + sig_e)[k]
            observables[py[name]] = _observable(bind, e)
        base = os.path.splitext(os.path.basename(self.sbml.path))[0]
        f.__name__ = _python_names([base])[base]
        self.model = Model(f, [py[s] for s in states], [py[p] for p in mech],
                           nets=chains or None, observables=observables)
        self._obs_names, self._sig_names = obs_names, sig_names
        u0_names = [py[n] for n in self._u0_names]
        self._u0_fn = lambda p: [getattr(p, n) for n in u0_names]
        self.states = states

    # ============================================================ simulations

    def _conditions(self):
        cond = {c: {} for c in getattr(self, "_condition_ids", ())}
        for t in self.t_cond:
            for line, row in t.rows():
                cid = t.require(line, row, "conditionId")
                tid = t.require(line, row, "targetId")
                val = parse_formula(t, line, "targetValue", t.require(line, row, "targetValue"))
                self._check_symbols(val, t.where(line, "targetValue"))
                if not (tid in self.params or tid in self.sbml.initial or tid in self.entity
                        or tid in self.states or tid in self._mech):
                    raise PetabError(f"{t.where(line, 'targetId')}: unknown target {tid!r} "
                                     "(not an entity of the SBML model or the parameter "
                                     "table)")
                cond.setdefault(cid, {})[tid] = val
        exps = {}
        for t in self.t_exp:
            for line, row in t.rows():
                eid = t.require(line, row, "experimentId")
                tt = number(t, line, "time", t.require(line, row, "time"))
                cids = [c for c in row["conditionId"].split(";") if c]
                for c in cids:
                    if c not in cond and not any(c in a for a in self.input_arrays.values()):
                        raise PetabError(f"{t.where(line, 'conditionId')}: unknown condition "
                                         f"{c!r}")
                exps.setdefault(eid, []).append((tt, cids, t.where(line, "time")))
        return cond, exps

    def _build_simulations(self):
        cond, exps = self._conditions()
        rows = {}  # experiment -> list of (line info, obs, t, m, obs params, noise params)
        self._meas = []
        for t in self.t_meas:
            for line, row in t.rows():
                oid = t.require(line, row, "observableId")
                if oid not in self._obs_rows:
                    raise PetabError(f"{t.where(line, 'observableId')}: unknown observable "
                                     f"{oid!r}")
                eid = row.get("experimentId", "")
                if eid and eid not in exps:
                    raise PetabError(f"{t.where(line, 'experimentId')}: unknown experiment "
                                     f"{eid!r}")
                tm = number(t, line, "time", t.require(line, row, "time"))
                if tm == -math.inf:
                    raise PetabError(f"{t.where(line, 'time')}: a measurement at -inf")
                m = number(t, line, "measurement", t.require(line, row, "measurement"))
                op = tuple(_split(t, line, "observableParameters", row))
                npar = tuple(_split(t, line, "noiseParameters", row))
                k = len(self._meas)
                self._meas.append(dict(row))
                rows.setdefault(eid, []).append((k, oid, tm, m, op, npar))
        self._meas_columns = list(self.t_meas[0].columns)
        solves = {}  # what the model is given -> (experiments, their rows, the experiment)
        for eid, rs in rows.items():
            at_rest = [r for r in rs if r[2] == math.inf]
            if at_rest and len(at_rest) < len(rs):
                raise PetabError(f"experiment {eid!r} has measurements both at steady state "
                                 "(time inf) and at finite times, which is not supported "
                                 "(post-equilibration after a simulation)")
            periods = sorted(exps.get(eid, [(0.0, [], "")]), key=lambda p: p[0])
            pre = [p for p in periods if p[0] == -math.inf]
            main = [p for p in periods if p[0] != -math.inf]
            if not main:
                raise PetabError(f"{periods[0][2]}: experiment {eid!r} has only a "
                                 "pre-equilibration period (time -inf)")
            if len({p[0] for p in main}) > 1:
                raise PetabError(f"{main[1][2]}: experiment {eid!r} has several periods; "
                                 "only one period after an optional pre-equilibration is "
                                 "supported (parameter changes within a simulation are not "
                                 "read yet)")
            t0 = main[0][0]
            first = min(r[2] for r in rs)
            if first < t0:
                raise PetabError(f"experiment {eid!r}: a measurement at t = {first} precedes "
                                 f"its start t = {t0}")
            cids = [c for p in main for c in p[1]]
            changes = {}
            for c in cids:
                changes.update(cond.get(c, {}))
            pre_changes = None
            if pre:
                pre_changes = {}
                for c in (c for p in pre for c in p[1]):
                    pre_changes.update(cond.get(c, {}))
            # (placeholders are in the model's observables: `_placeholder_groups`, so an
            # experiment's solve depends on its conditions alone; their ids only through
            # array inputs)
            key = (t0, bool(at_rest), frozenset(changes.items()),
                   None if pre_changes is None else frozenset(pre_changes.items()),
                   (tuple(cids), tuple(c for p in pre for c in p[1]))
                   if self.input_arrays else None)
            if not self.share_solves:
                key = eid
            group = solves.get(key)
            if group is None:
                group = solves[key] = ([], [], (t0, cids, changes, pre, pre_changes))
            group[0].append(eid)
            group[1].extend(rs)
        self.sims = []
        for eids, rs, (t0, cids, changes, pre, pre_changes) in solves.values():
            sim = self._simulation(eids, cids, t0, changes, rs)
            if pre_changes is not None:
                sim["pre"] = self._preequilibration(eids[0], pre, pre_changes, changes)
            self.sims.append(sim)

    def _preequilibration(self, eid, periods, pre_changes, changes):
        """What a simulation needs to start from the steady state of its pre-equilibration:
        that period's parameters (`Outer`), the problem that equilibrates, and the states
        it hands on (those the main period's condition does not set again)."""
        outer = Outer(self, eid, [c for p in periods for c in p[1]], pre_changes, {})
        states = [i for i, s in enumerate(self.states) if s not in changes]
        mech = {n: i for i, n in enumerate(self._mech)}
        u0_idx = np.array([mech[self._u0_names[i]] for i in states], dtype=np.int64)
        theta = outer.theta(*self._split_x(self.nominal))[0]
        prob = ODEProblem(self.model, self._u0_fn, (0.0, 1.0), theta)
        return dict(outer=outer, prob=prob, states=np.array(states, dtype=np.int64),
                    u0_idx=u0_idx)

    def _theta(self, sim, zv, W):
        """A simulation's problem and model parameters at the estimated values ``(zv, W)``,
        and the tape of `_theta_vjp`: with a pre-equilibration, the initial values it hands
        on are those of its steady state; with time switches inside its span, the problem
        changes its flags there. ``(None, None, None)`` where the steady state is not found."""
        theta, tape = sim["outer"].theta(zv, W)
        prob = sim["prob"]
        sw = self._switches
        if sw:
            theta, changes = sw.schedule(theta, *prob.tspan)
            if changes:
                prob = prob.remake(changes=changes)
        pre = sim.get("pre")
        if pre is None:
            return prob, theta, (tape, None)
        th_pre, tape_pre = pre["outer"].theta(zv, W)
        if sw:  # the flags as they are at the start of the pre-equilibration
            th_pre = sw.at(th_pre, pre["prob"].tspan[0])
        res = self._rest(pre["prob"], th_pre)
        if not res.converged:
            return None, None, None
        theta = theta.copy()
        theta[pre["u0_idx"]] = res.u[pre["states"]]
        return prob, theta, (tape, (res, th_pre, tape_pre))

    def _theta_vjp(self, sim, g, tapes, gz, gW):
        """Adds ``g^T d theta / d (z, W)`` (g over the model parameters) to gz and gW, through
        the pre-equilibration's steady state (implicit function theorem)."""
        tape, pre = tapes
        if pre is not None:
            res, th_pre, tape_pre = pre
            sp = sim["pre"]
            lam = np.zeros(self.model.n_states)
            lam[sp["states"]] = g[sp["u0_idx"]]
            g = g.copy()
            g[sp["u0_idx"]] = 0.0
            gp, gs = res.vjp(lam)
            sp["outer"].vjp(gp + sp["prob"].initial_vjp(th_pre, gs), tape_pre, gz, gW)
        sim["outer"].vjp(g, tape, gz, gW)

    def _simulation(self, eids, cids, t0, changes, rs):
        times = np.unique([r[2] for r in rs])
        steady = bool(times[-1] == math.inf)  # measured at steady state
        if steady:
            times = np.array([t0])  # where the rows point; the state is the steady state
        # the model observable of each row (its placeholders' assignment), and the columns
        # this simulation reads: those observables, then their noise formulas
        of_row = [self._obs_col.get(r[1]) or self._obs_col[(r[1], r[4], r[5])] for r in rs]
        used = list(dict.fromkeys(of_row))
        col = {n: i for i, n in enumerate(used)}
        names = [self._py[n] for n in used] + [self._py[f"sigma_{n}"] for n in used]
        row_t = np.searchsorted(times, [r[2] for r in rs]) if not steady else \
            np.zeros(len(rs), dtype=np.int64)
        row_y = np.array([col[n] for n in of_row], dtype=np.int64)
        meas = lk.Measurements(
            times, names, row_t, row_y, row_y + len(used), np.array([r[3] for r in rs]),
            np.array([self._obs_rows[r[1]][0] for r in rs]),
            np.array([self._obs_rows[r[1]][1] for r in rs]))
        outer = Outer(self, eids[0], cids, changes, {}, ())
        tf = times[-1] if times[-1] > t0 else t0 + 1.0
        theta = outer.theta(*self._split_x(self.nominal))[0]
        prob = ODEProblem(self.model, self._u0_fn, (t0, tf), theta, events=self._events)
        return dict(experiments=eids, rows=[r[0] for r in rs], data=meas, prob=prob, outer=outer,
                    steady=steady)

    # ============================================================ evaluation

    def _split_x(self, x):
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (len(self.parameter_names),):
            raise ValueError(f"PetabProblem: `x` must have shape ({len(self.parameter_names)},) "
                             f"(len(parameter_names)), got {x.shape}")
        z = {}
        W = {name: nt.w0.copy() for name, nt in self.nets.items()}
        for item in self._layout:
            if item[0] == "scalar":
                z[item[1]] = _unscale(x[item[2]], self.params[item[1]]["scale"])
            else:
                W[item[1]][item[3]] = x[item[2]]
        zv = np.array([z[p] for p in self.scalar_est])
        return zv, W

    def _chain_back(self, x, gz, gW):
        g = np.zeros(len(self.parameter_names))
        idx = {p: i for i, p in enumerate(self.scalar_est)}
        for item in self._layout:
            if item[0] == "scalar":
                sc = self.params[item[1]]["scale"]
                g[item[2]] = gz[idx[item[1]]] * _dunscale(x[item[2]], sc)
            else:
                g[item[2]] = gW[item[1]][item[3]]
        return g

    def _prior(self, x):
        v, g = 0.0, np.zeros(len(x))
        for item in self._layout:
            if item[0] != "scalar":
                # a network's estimated entries (x[pos] are the flat entries idx), grouped by
                # the row whose prior covers them; values on the linear scale, as the arrays
                _, name, pos, idx = item
                which = self.nets[name].prior[idx]
                for k, (dist, pars) in enumerate(self.nets[name].priors):
                    sel = which == k
                    if sel.any():
                        lv, d = lk.log_prior(dist, pars, x[pos[sel]])
                        v += float(np.sum(lv))
                        g[pos[sel]] += d
                continue
            p = self.params[item[1]]
            if p["prior"] is None:
                continue
            name, pars = p["prior"]
            i = item[2]
            if name in lk.ON_SCALE:
                lv, d = lk.log_prior(name, pars, x[i])
            else:
                zi = _unscale(x[i], p["scale"])
                lv, d = lk.log_prior(name, pars, zi)
                d *= _dunscale(x[i], p["scale"])
            v += lv
            g[i] += d
        return v, g

    def llh(self, x, prior=True):
        """The log-likelihood at `x` (PEtab's convention), with the log priors unless
        ``prior=False`` (the likelihood alone, as AMICI's references give it)."""
        return self.llh_and_grad(x, grad=False, prior=prior)

    def llh_and_grad(self, x, grad=True, prior=True):
        """``(llh, d llh / dx)`` at `x`: the gradient is exact up to the solver tolerance,
        by the sensitivity method of the problem (`sensealg`); `prior` as in `llh`."""
        zv, W = self._split_x(x)
        total = 0.0
        gz = np.zeros(len(zv))
        gW = {k: np.zeros_like(w) for k, w in W.items()}
        for sim in self.sims:
            prob, theta, tape = self._theta(sim, zv, W)
            if theta is None:  # no steady state for its pre-equilibration
                return (-math.inf, np.full(len(x), np.nan)) if grad else -math.inf
            if sim["steady"]:
                v, g = self._at_rest(sim, prob, theta, grad)
                if v is None:
                    return (-math.inf, np.full(len(x), np.nan)) if grad else -math.inf
                if grad:
                    self._theta_vjp(sim, g, tape, gz, gW)
            elif grad:
                v, g = loss_and_grad(prob, sim["data"], loss=_LOSS, solver=self.solver,
                                     sensealg=self._method(sim), rtol=self.rtol,
                                     atol=self.atol, params=theta)
                if not math.isfinite(v):
                    return (-math.inf, np.full(len(x), np.nan)) if grad else -math.inf
                self._theta_vjp(sim, g, tape, gz, gW)
            else:
                v = loss_value(prob, sim["data"], loss=_LOSS, solver=self.solver,
                               rtol=self.rtol, atol=self.atol, params=theta)
            total += v
        pv, pg = self._prior(np.asarray(x, dtype=np.float64)) if prior else (0.0, 0.0)
        if not grad:
            return -total + pv
        return -total + pv, -self._chain_back(np.asarray(x, float), gz, gW) + pg

    def _method(self, sim):
        """The sensitivity method for one simulation: forward sensitivities only for the
        model parameters the estimated ones reach (the rest of a PEtab model's parameters,
        its initial values among them, are fixed for the simulation) and the states depend
        on (an observable's own parameters get their derivatives directly)."""
        sa = self.sensealg
        if type(sa) is not adjoints.ForwardSensitivity or sa.params is not None:
            return sa
        m = sim.get("_method")
        if m is None or m[0] is not sa:
            reached = set(sim["outer"].reached) & self._dynamic
            for _, sl in sim["outer"].model_nets:
                reached |= set(range(sl.start, sl.stop))
            if sim.get("pre") is not None:
                reached |= set(sim["pre"]["u0_idx"].tolist())
            m = sim["_method"] = (sa, adjoints.ForwardSensitivity(
                sa.error_on_sensitivities, sa.rtol, sa.atol, params=sorted(reached)))
        return m[1]

    def _rest(self, prob, theta):
        """The steady state of `prob` at the model parameters `theta`, under the problem's
        solver and tolerances."""
        return steady_state(prob, params=theta, solver=self.solver, rtol=self.rtol,
                            atol=self.atol)

    def _at_rest(self, sim, prob, theta, grad):
        """``(-llh, its gradient over the model parameters)`` of measurements at steady
        state: observables at the steady state reached from the simulation's start (its
        conserved totals), the gradient through it by the implicit function theorem.
        ``(None, None)`` where none is found."""
        res = self._rest(prob, theta)
        if not res.converged:
            return None, None
        d, model, n = sim["data"], self.model, self.model.n_states
        t0 = prob.tspan[0]
        U = res.u[None, :]
        Y = model.observe(res.u, theta, t0)[None, :]
        cols = d.columns(model)
        v, ybar, _ = _LOSS(Y[:, cols], d, theta, model)
        if not grad:
            return v, None
        Ybar = np.zeros_like(Y)
        Ybar[:, cols] = ybar
        G, pobs = np.zeros((1, n)), np.zeros(model.n_params)
        observe_jumps(model.kernel_table("obs", "obs_vjp"), theta, model.workspace(), G, pobs,
                      Ybar, U, np.array([t0]), np.zeros(n))
        gp, gs = res.vjp(G[0])
        return v, pobs + gp + prob.initial_vjp(theta, gs)

    def _observe(self, sim, prob, theta):
        d = sim["data"]
        if sim["steady"]:
            res = self._rest(prob, theta)
            y = self.model.observe(res.u, theta, prob.tspan[0])
            cols = [self.model.obs_names.index(n) for n in d.names]
            return np.full((len(d.t), len(cols)), np.nan) if not res.converged else \
                np.repeat(y[cols][None, :], len(d.t), axis=0)
        sol = solve(prob.remake(params=theta), self.solver, rtol=self.rtol, atol=self.atol,
                    saveat=d.t)
        if sol.status_code != 0:
            return np.full((len(d.t), len(d.names)), np.nan)
        if not prob.changes:
            obs = sol.observables
            return np.stack([obs[n] for n in d.names], axis=1)
        # each time's observables under the parameters of its segment
        cols = [self.model.obs_names.index(n) for n in d.names]
        Y = np.empty((len(d.t), len(d.names)))
        for seg in segments(prob, theta):
            lo, hi = seg.tspan
            for i in np.flatnonzero(in_span(d.t, lo, hi, hi == prob.tspan[1])):
                Y[i] = self.model.observe(sol.u[i], seg.p, d.t[i])[cols]
        return Y

    def simulate(self, x):
        """The measurement table's keys and a ``simulation`` column at `x` (a DataFrame)."""
        import pandas as pd

        zv, W = self._split_x(x)
        sim_values = np.full(len(self._meas), np.nan)
        for sim in self.sims:
            prob, theta, _ = self._theta(sim, zv, W)
            d = sim["data"]
            Y = self._observe(sim, prob, theta) if theta is not None else \
                np.full((len(d.t), len(d.names)), np.nan)
            d = sim["data"]
            sim_values[sim["rows"]] = Y[d.row_t, d.row_y]
        keys = [c for c in self._meas_columns if c != "measurement"]
        df = pd.DataFrame([{k: r.get(k, "") for k in keys} for r in self._meas])
        df["time"] = df["time"].astype(float)
        df["simulation"] = sim_values
        return df

    def unflatten(self, g):
        """A vector over `parameter_names` as ``{"alpha": float, ..., "net1": {"layer1":
        {"weight": array, "bias": array}}}``; frozen arrays are absent."""
        g = np.asarray(g, dtype=np.float64)
        out = {}
        for item in self._layout:
            if item[0] == "scalar":
                out[item[1]] = float(g[item[2]])
                continue
            nt = self.nets[item[1]]
            full = np.zeros(nt.net.n_params)
            full[item[3]] = g[item[2]]
            d = {}
            for lid, arr, shape, off in nt.net.arrays:
                n = int(np.prod(shape))
                if nt.estimated[off:off + n].all():
                    d.setdefault(lid, {})[arr] = full[off:off + n].reshape(shape)
                elif nt.estimated[off:off + n].any():
                    d.setdefault(lid, {})[arr] = np.where(
                        nt.estimated[off:off + n], full[off:off + n], np.nan).reshape(shape)
            out[item[1]] = d
        return out

    # ============================================================ fitting

    def fit(self, n_starts=10, seed=0, optimizers=None, client=None, workers=None,
            progress=False, results=None, spread=None):
        """Multistart maximum likelihood (`sciml.multistart.run_starts`, threads or Dask),
        each start fitted by `sciml.fit` on minus the log-likelihood; best first.

        Start k depends on `seed` and k only. ``spread=None`` (PEtab's convention): every
        parameter with finite bounds uniform between them (on its scale); the others (network
        weights) at their nominal values plus ``N(0, 0.1)``. ``spread=s``: around `nominal`
        instead, ``x * exp(s z)`` for bounded parameters (``s z`` where x is 0) and
        ``x + s z / 5`` for the others. `optimizers`: as in `sciml.fit` (default
        Adam then L-BFGS).

        Returns
        -------
        sciml.MultistartResult
            ``result.best.params`` is on the scale of `parameter_names`;
            ``result.best.objective`` is minus the log-likelihood.
        """
        from ..multistart import _n_starts, _seed, run_starts

        n = _n_starts(n_starts)
        children = np.random.SeedSequence(_seed(seed)).spawn(n)
        lo, hi = self.lower_bounds, self.upper_bounds
        finite = np.isfinite(lo) & np.isfinite(hi)
        X = np.empty((n, len(self.nominal)))
        for k, c in enumerate(children):
            rng = np.random.default_rng(c)
            u, z = rng.random(len(lo)), rng.standard_normal(len(lo))
            x0 = self.nominal
            if spread is None:
                X[k] = np.where(finite, lo + (hi - lo) * u, x0 + 0.1 * z)
            else:
                moved = np.where(x0 != 0, x0 * np.exp(spread * z), spread * z)
                X[k] = np.where(finite, np.clip(moved, lo, hi), x0 + spread * z / 5)
        return run_starts(_FitTask(self, optimizers), X, client, results, progress, workers)

    def __reduce__(self):
        return (PetabProblem, (self.path, self.solver, self.sensealg, self.rtol, self.atol))

    def __repr__(self):
        return (f"PetabProblem({self.path!r}, {len(self.parameter_names)} parameters, "
                f"{len(self.sims)} simulation(s), nets={list(self.nets)})")


_LOSS = lk.NegLogLikelihood()


class _FitTask:
    """One multistart start for `run_starts`: `sciml.fit` on minus the log-likelihood."""

    def __init__(self, problem, optimizers):
        self.problem, self.optimizers = problem, optimizers

    def objective(self, x):
        v, g = self.problem.llh_and_grad(x)
        return -v, -g

    def __call__(self, k, x0):
        import copy
        import time

        from ..fit import fit
        from ..multistart import StartFit, failed_start

        t0 = time.perf_counter()
        sims = self.problem.sims
        opts = copy.deepcopy(self.optimizers) if self.optimizers is not None else None
        try:
            r = fit([s["prob"] for s in sims], [s["data"] for s in sims], optimizers=opts,
                    objective=self.objective, params=x0, progress=False)
        except Exception as e:
            return failed_start(k, x0, e, time.perf_counter() - t0)
        return StartFit(k, x0, r.params, r.loss, r.penalty, r.objective, r.history,
                        r.n_iters, r.n_evals, r.stopped, "ok", "", time.perf_counter() - t0)

    def warm(self, x0):
        try:
            self.objective(x0)
        except Exception:
            pass

    def portable(self):
        return self


def _python_names(ids):
    """``{id: name}``: each id as itself where it is a plain Python name, else made one
    (``_Cyt__CCND`` -> ``x_Cyt__CCND``), distinct from every other id."""
    import keyword

    taken, out = set(ids), {}
    for i in ids:
        if i.isidentifier() and not keyword.iskeyword(i) and not i.startswith("_"):
            out[i] = i
            continue
        n = "x" + re.sub(r"\W", "_", i)
        while n in taken or keyword.iskeyword(n):
            n += "_"
        taken.add(n)
        out[i] = n
    return out


def _state_event(bind, py, g, direction, assign):
    """An SBML event triggered by the state as a `sciml.Event` over the model's names."""
    from ..events import Event

    names = list(assign)

    def condition(u, p, t):
        return bind(u, p, t, None, [g])[0]

    def affect(u, p, t):
        vals = bind(u, p, t, None, [assign[v] for v in names])
        return {py[v]: x for v, x in zip(names, vals)}

    return Event(condition, affect=affect, direction=direction)


def _observable(bind, e):
    """An observable function ``g(u, p, t, nets)`` computing the expression `e`."""
    return lambda u, p, t, nets: bind(u, p, t, nets, [e])[0]


def _read_prior(t, line, row):
    """``(distribution, parameters)`` of a parameter table row, None without a prior."""
    dist = row.get("priorDistribution", "")
    if not dist:
        return None
    vals = [number(t, line, "priorParameters", v)
            for v in row.get("priorParameters", "").split(";") if v]
    lk.check_prior(t.where(line, "priorDistribution"), dist, vals)
    return (dist, vals)


def _split(t, line, column, row):
    v = row.get(column, "")
    if v == "":
        return []
    return [s.strip() for s in v.split(";")]


def _scale(v, scale):
    if scale == "lin":
        return v
    with np.errstate(divide="ignore"):
        return float(np.log(v) if scale == "log" else np.log10(v))


def _unscale(v, scale):
    return v if scale == "lin" else (math.exp(v) if scale == "log" else 10.0 ** v)


def _dunscale(v, scale):
    return 1.0 if scale == "lin" else (math.exp(v) if scale == "log" else
                                       math.log(10.0) * 10.0 ** v)


def _sym(e):
    from ..model.trace import Sym

    return Sym(e)
