"""An SBML model read into sympy expressions (python-libsbml): what `sciml.Model` traces.

Read: compartments, species, parameters, reactions (kinetic laws with local
parameters, constant stoichiometry), assignment rules (substituted), rate
rules (their targets become states), initial assignments, events (read here;
`sciml.petab.switches` runs those triggered at a time). Refused, with the element
named: algebraic rules, delays, constraints, and constructs that change the model's
structure (fast reactions, variable stoichiometry).
"""

from dataclasses import dataclass

import libsbml
import sympy

from .errors import PetabError

__all__ = ["SBMLModel", "read_sbml", "symbol", "TIME"]

TIME = sympy.Symbol("t", real=True)


def symbol(name):
    """The sympy symbol of a PEtab / SBML identifier."""
    return sympy.Symbol(name, real=True)


@dataclass
class SBMLModel:
    """A model as expressions.

    states : list of str
        Species (and rate-rule targets) that change in time, in document order.
    rhs : dict str -> sympy.Expr
        d state / dt, in the model's symbols and `TIME`.
    initial : dict str -> sympy.Expr
        Initial value of every state, parameter and compartment (numbers or
        expressions of other entities).
    constants : list of str
        Parameters, compartments and constant species (not states).
    """

    path: str
    states: list
    rhs: dict
    initial: dict
    constants: list
    assignments: dict
    events: list

    def expand(self, expr):
        """`expr` with assignment-rule targets replaced by their formulas (to a fixed point)."""
        for _ in range(len(self.assignments) + 1):
            new = expr.xreplace(self.assignments)
            if new == expr:
                return expr
            expr = new
        raise PetabError(f"{self.path}: assignment rules refer to each other in a cycle")


_BINARY = {libsbml.AST_PLUS: sympy.Add, libsbml.AST_TIMES: sympy.Mul}
_FUNC = {
    libsbml.AST_FUNCTION_EXP: sympy.exp, libsbml.AST_FUNCTION_LN: sympy.log,
    libsbml.AST_FUNCTION_SIN: sympy.sin, libsbml.AST_FUNCTION_COS: sympy.cos,
    libsbml.AST_FUNCTION_TAN: sympy.tan, libsbml.AST_FUNCTION_TANH: sympy.tanh,
    libsbml.AST_FUNCTION_SINH: sympy.sinh, libsbml.AST_FUNCTION_COSH: sympy.cosh,
    libsbml.AST_FUNCTION_ARCSIN: sympy.asin, libsbml.AST_FUNCTION_ARCCOS: sympy.acos,
    libsbml.AST_FUNCTION_ARCTAN: sympy.atan, libsbml.AST_FUNCTION_ABS: sympy.Abs,
    libsbml.AST_FUNCTION_FLOOR: sympy.floor, libsbml.AST_FUNCTION_CEILING: sympy.ceiling,
}
_REL = {libsbml.AST_RELATIONAL_LT: sympy.StrictLessThan, libsbml.AST_RELATIONAL_LEQ:
        sympy.LessThan, libsbml.AST_RELATIONAL_GT: sympy.StrictGreaterThan,
        libsbml.AST_RELATIONAL_GEQ: sympy.GreaterThan, libsbml.AST_RELATIONAL_EQ: sympy.Eq,
        libsbml.AST_RELATIONAL_NEQ: sympy.Ne}
_LOGIC = {libsbml.AST_LOGICAL_AND: sympy.And, libsbml.AST_LOGICAL_OR: sympy.Or,
          libsbml.AST_LOGICAL_XOR: sympy.Xor}


class _Math:
    """MathML (a libsbml AST) to sympy, with function definitions inlined."""

    def __init__(self, path, functions):
        self.path, self.functions = path, functions

    def __call__(self, ast, where):
        if ast is None:
            raise PetabError(f"{self.path}: {where} has no math")
        return self._node(ast, where, {})

    def _node(self, a, where, env):
        t = a.getType()
        kids = [self._node(a.getChild(i), where, env) for i in range(a.getNumChildren())]
        if t == libsbml.AST_NAME:
            name = a.getName()
            return env.get(name, symbol(name))
        if t == libsbml.AST_NAME_TIME:
            return TIME
        if t in (libsbml.AST_INTEGER,):
            return sympy.Integer(a.getInteger())
        if t in (libsbml.AST_REAL, libsbml.AST_REAL_E, libsbml.AST_RATIONAL):
            return sympy.Float(a.getReal())
        if t == libsbml.AST_CONSTANT_PI:
            return sympy.pi
        if t == libsbml.AST_CONSTANT_E:
            return sympy.E
        if t == libsbml.AST_CONSTANT_TRUE:
            return sympy.true
        if t == libsbml.AST_CONSTANT_FALSE:
            return sympy.false
        if t in _BINARY:
            return _BINARY[t](*kids) if kids else sympy.Integer(0 if t == libsbml.AST_PLUS else 1)
        if t == libsbml.AST_MINUS:
            return -kids[0] if len(kids) == 1 else kids[0] - kids[1]
        if t == libsbml.AST_DIVIDE:
            return kids[0] / kids[1]
        if t in (libsbml.AST_POWER, libsbml.AST_FUNCTION_POWER):
            return kids[0] ** kids[1]
        if t == libsbml.AST_FUNCTION_ROOT:
            return kids[-1] ** (1 / kids[0]) if len(kids) == 2 else sympy.sqrt(kids[0])
        if t == libsbml.AST_FUNCTION_LOG:
            return sympy.log(kids[-1]) / sympy.log(kids[0] if len(kids) == 2 else 10)
        if t in _FUNC:
            return _FUNC[t](*kids)
        if t in _REL:
            return _REL[t](*kids)
        if t in _LOGIC:
            return _LOGIC[t](*kids)
        if t == libsbml.AST_LOGICAL_NOT:
            return sympy.Not(kids[0])
        if t == libsbml.AST_FUNCTION_PIECEWISE:
            pairs = [(kids[i], kids[i + 1]) for i in range(0, len(kids) - 1, 2)]
            other = kids[-1] if len(kids) % 2 else sympy.nan
            return sympy.Piecewise(*pairs, (other, True))
        if t == libsbml.AST_FUNCTION_DELAY:
            raise PetabError(f"{self.path}: {where} uses delay(), which is not supported "
                             "(delay differential equations)")
        if t == libsbml.AST_FUNCTION and a.getName() in self.functions:
            args, body = self.functions[a.getName()]
            return self._node(body, where, dict(zip(args, kids)))
        raise PetabError(f"{self.path}: {where} uses the MathML element "
                         f"{a.getName() or libsbml.formulaToL3String(a)!r} (AST type {t}), "
                         "which is not supported")


def read_sbml(path):
    """Read the SBML file `path` into an `SBMLModel`; unsupported constructs raise
    `PetabError` naming the element."""
    doc = libsbml.readSBMLFromFile(str(path))
    errors = [doc.getError(i) for i in range(doc.getNumErrors())
              if doc.getError(i).getSeverity() >= libsbml.LIBSBML_SEV_ERROR]
    if errors:
        raise PetabError(f"{path}: not valid SBML: line {errors[0].getLine()}: "
                         f"{errors[0].getMessage().strip()}")
    m = doc.getModel()
    if m is None:
        raise PetabError(f"{path}: the SBML document has no <model>")
    if m.getNumConstraints():
        raise PetabError(f"{path}: SBML constraint {m.getConstraint(0).getId() or '#1'!r} is "
                         f"not supported ({m.getNumConstraints()} constraint(s) in the model)")
    functions = {}
    for i in range(m.getNumFunctionDefinitions()):
        fd = m.getFunctionDefinition(i)
        lam = fd.getMath()
        args = [lam.getChild(k).getName() for k in range(lam.getNumChildren() - 1)]
        functions[fd.getId()] = (args, lam.getChild(lam.getNumChildren() - 1))
    math = _Math(path, functions)

    initial, constants, volume, amount = {}, [], {}, {}
    for c in m.getListOfCompartments():
        volume[c.getId()] = symbol(c.getId())
        initial[c.getId()] = sympy.Float(c.getSize() if c.isSetSize() else 1.0)
        constants.append(c.getId())
    for p in m.getListOfParameters():
        initial[p.getId()] = sympy.Float(p.getValue()) if p.isSetValue() else sympy.nan
        constants.append(p.getId())
    species, dynamic = [], []
    for s in m.getListOfSpecies():
        sid, comp = s.getId(), symbol(s.getCompartment())
        amount[sid] = bool(s.getHasOnlySubstanceUnits())
        if s.isSetInitialAmount():
            v = sympy.Float(s.getInitialAmount())
            initial[sid] = v if amount[sid] else v / comp
        elif s.isSetInitialConcentration():
            v = sympy.Float(s.getInitialConcentration())
            initial[sid] = v * comp if amount[sid] else v
        else:
            initial[sid] = sympy.nan
        species.append(sid)
        if s.getConstant() or s.getBoundaryCondition():
            constants.append(sid)
        else:
            dynamic.append(sid)

    assignments, rates = {}, {}
    for r in m.getListOfRules():
        var = r.getVariable() if not r.isAlgebraic() else ""
        where = f"rule for {var!r}" if var else "algebraic rule"
        if r.isAlgebraic():
            formula = libsbml.formulaToL3String(r.getMath())
            raise PetabError(f"{path}: SBML algebraic rule ({formula}) is not supported "
                             "(differential-algebraic equations)")
        e = math(r.getMath(), where)
        if r.isAssignment():
            assignments[symbol(var)] = e
        else:
            rates[var] = e
    for ia in m.getListOfInitialAssignments():
        initial[ia.getSymbol()] = math(ia.getMath(), f"initial assignment of {ia.getSymbol()!r}")

    # each state's terms summed once at the end: sympy sorts a sum's terms at every `+`,
    # which a species in many reactions made quadratic (SalazarCavazos_MBoC2020: 0.5 s)
    terms = {s: [] for s in dynamic}
    for r in m.getListOfReactions():
        rid = r.getId()
        if r.isSetFast() and r.getFast():
            raise PetabError(f"{path}: SBML reaction {rid!r} is fast, which is not supported")
        kl = r.getKineticLaw()
        if kl is None:
            raise PetabError(f"{path}: SBML reaction {rid!r} has no kinetic law")
        local = {symbol(p.getId()): sympy.Float(p.getValue())
                 for p in list(kl.getListOfParameters()) + list(kl.getListOfLocalParameters())}
        v = math(kl.getMath(), f"kinetic law of reaction {rid!r}").xreplace(local)
        for refs, sign in ((r.getListOfReactants(), -1), (r.getListOfProducts(), 1)):
            for ref in refs:
                sid = ref.getSpecies()
                if ref.isSetStoichiometryMath() or (ref.isSetId() and (
                        symbol(ref.getId()) in assignments or ref.getId() in rates)):
                    raise PetabError(f"{path}: reaction {rid!r}: the stoichiometry of "
                                     f"{sid!r} varies, which is not supported")
                if sid not in terms:
                    continue  # boundary or constant species: reactions do not change it
                st = ref.getStoichiometry() if ref.isSetStoichiometry() else 1.0
                comp = symbol(m.getSpecies(sid).getCompartment())
                term = sign * sympy.Float(st) * v
                terms[sid].append(term if amount[sid] else term / comp)
    rhs = {s: sympy.Add(*t) for s, t in terms.items()}
    for var, e in rates.items():
        if var in amount and not amount[var]:
            pass  # a rate rule on a concentration species gives d[S]/dt directly
        rhs[var] = e
        if var in constants:
            constants.remove(var)
    for sid in list(rhs):
        if symbol(sid) in assignments:
            if rhs[sid] != 0:
                raise PetabError(f"{path}: species {sid!r} has an assignment rule and "
                                 "reactions that change it")
            del rhs[sid]  # its rule gives its value: not a state
            constants.append(sid)
    states = [s for s in species if s in rhs] + [v for v in rhs if v not in species]
    events = [_event(path, math, e, k) for k, e in enumerate(m.getListOfEvents())]
    return SBMLModel(str(path), states, rhs, initial, constants, assignments, events)


def _event(path, math, e, k):
    """An SBML event as ``(id, trigger, {variable: value})`` in sympy; what cannot be read
    (delays, priorities) is refused by name."""
    eid = e.getId() or f"#{k + 1}"
    where = f"SBML event {eid!r}"
    if e.isSetDelay():
        raise PetabError(f"{path}: {where} has a delay, which is not supported")
    if e.isSetPriority():
        raise PetabError(f"{path}: {where} has a priority, which is not supported")
    trig = e.getTrigger()
    if trig is None or trig.getMath() is None:
        raise PetabError(f"{path}: {where} has no trigger")
    cond = math(trig.getMath(), f"the trigger of {where}")
    assign = {a.getVariable(): math(a.getMath(), f"an assignment of {where}")
              for a in e.getListOfEventAssignments()}
    return SBMLEvent(eid, cond, assign, bool(trig.getInitialValue()),
                     bool(trig.getPersistent()))


@dataclass
class SBMLEvent:
    """An event: when `trigger` becomes true, each variable of `assign` takes its value."""

    id: str
    trigger: object
    assign: dict
    initial_value: bool
    persistent: bool
