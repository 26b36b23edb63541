"""Every error path of tracing and of the Model API, with the message it gives.

Tracing errors point into the user's function: its name and the file:line
of the offending statement.
"""

import inspect
import re

import numpy as np
import pytest

import sciml.model as sm
import sciml.model.model as model_module
from nets import Chain, Dense
from sciml.model import ModelError

from .model_zoo import lotka_volterra, lv_ude, ude_chain

U = ude_chain()
HERE = __file__


def lineno(fn, marker):
    """file:line of the source line of `fn` containing `marker`."""
    lines, start = inspect.getsourcelines(fn)
    for k, line in enumerate(lines):
        if marker in line:
            return f"{HERE}:{start + k}"
    raise AssertionError(marker)


def lv(f, **kw):
    return sm.Model(f, ["x", "y"], ["alpha", "delta"], **kw)


# ------------------------------------------------------------------ tracing


def test_if_on_a_state_points_at_the_line():
    def branching(u, p, t):
        if u.x > 1.0:  # MARK
            return [u.x, u.y]
        return [0.0, 0.0]

    where = re.escape(lineno(branching, "# MARK"))
    with pytest.raises(ModelError, match=rf"model function `branching`, at {where}: the model "
                       r"branches on a traced value \(`if`/`while` on a state or parameter\): "
                       r"use np.where\(condition, a, b\)"):
        lv(branching)


def test_branching_in_a_helper_points_at_the_helper():
    def helper(v):
        return v if v else -v  # MARK

    def f(u, p, t):
        return [helper(u.x), u.y]

    with pytest.raises(ModelError, match=re.escape(lineno(helper, "# MARK")) + ".*branches"):
        lv(f)


def test_while_and_and_on_traced_values():
    def looping(u, p, t):
        x = u.x
        while x > 0:
            x = x - 1
        return [x, u.y]

    def anded(u, p, t):
        return [np.where(u.x > 0 and u.y > 0, 1.0, 0.0), u.y]

    for f in (looping, anded):
        with pytest.raises(ModelError, match="branches on a traced value"):
            lv(f)


def test_unknown_state_and_parameter_names_list_the_known_ones():
    def bad_state(u, p, t):
        return [u.z, u.y]  # MARK

    def bad_param(u, p, t):
        return [p.beta * u.x, u.y]

    def swapped(u, p, t):
        return [u.alpha, u.y]

    with pytest.raises(ModelError, match=re.escape(lineno(bad_state, "# MARK"))
                       + r": unknown state 'z'; states: x, y"):
        lv(bad_state)
    with pytest.raises(ModelError, match=r"unknown parameter 'beta'; parameters: alpha, delta"):
        lv(bad_param)
    with pytest.raises(ModelError, match=r"'alpha' is a parameter: use p.alpha"):
        lv(swapped)


def test_unknown_net():
    def f(u, p, t, nets):
        return nets.V(u)

    with pytest.raises(ModelError, match=r"unknown net 'V'; nets: U"):
        lv(f, nets={"U": U})
    with pytest.raises(ModelError, match=r"unknown net 'V'; nets: \(none"):
        lv(f)


def test_wrong_number_of_derivatives():
    def three(u, p, t):
        return [u.x, u.y, u.x]

    def scalar(u, p, t):
        return u.x

    def condition(u, p, t):
        return [u.x > 0, u.y]

    def nothing(u, p, t):
        pass

    with pytest.raises(ModelError, match=r"model function `three` \(defined at .*\): returned 3 "
                       r"derivatives for 2 states; return one per state \(x, y\)"):
        lv(three)
    with pytest.raises(ModelError, match="returned a single value; return a list of 2"):
        lv(scalar)
    with pytest.raises(ModelError, match=r"model function `condition` \(defined at .*\): value 0 "
                       r"\(x\) is a condition, not a number or a traced expression"):
        lv(condition)
    with pytest.raises(ModelError, match="must return a list of 2 derivatives.*got NoneType"):
        lv(nothing)


def test_wrong_net_input_length():
    def f(u, p, t, nets):
        z = nets.U([u.x, u.y, t])  # MARK
        return [z[0], z[1]]

    with pytest.raises(ModelError, match=re.escape(lineno(f, "# MARK"))
                       + r": net `U` takes 2 inputs, got 3"):
        lv(f, nets={"U": U})

    def scalar_input(u, p, t, nets):
        return nets.U(u.x)

    with pytest.raises(ModelError, match=r"net `U` takes a sequence of 2 inputs, got Sym"):
        lv(scalar_input, nets={"U": U})


def test_unsupported_numpy_function_is_named():
    def f(u, p, t):
        return [np.cumsum(u)[0], np.floor(u.y)]

    def g(u, p, t):
        return [np.floor(u.x), u.y]

    with pytest.raises(ModelError, match=r"np.cumsum is not supported on traced values; "
                       r"supported numpy functions: .*exp"):
        lv(f)
    with pytest.raises(ModelError, match=r"np.floor is not supported"):
        lv(g)


def test_math_functions_and_number_conversions():
    import math

    def f(u, p, t):
        return [math.exp(u.x), u.y]

    def g(u, p, t):
        return [[1.0, 2.0][int(u.x)], u.y]

    for fn in (f, g):
        with pytest.raises(ModelError, match="converted to a Python number.*use numpy functions"):
            lv(fn)


def test_other_tracing_misuse():
    def where1(u, p, t):
        return [np.where(u.x > 0), u.y]

    def assign(u, p, t):
        u.x = 1.0

    def floordiv(u, p, t):
        return [u.x // 2, u.y]

    def where_cond(u, p, t):
        return [np.where(u.x, 1.0, 0.0), u.y]

    with pytest.raises(ModelError, match=r"np.where needs three arguments"):
        lv(where1)
    with pytest.raises(ModelError, match="states are read-only"):
        lv(assign)
    with pytest.raises(ModelError, match="`//` is not supported"):
        lv(floordiv)
    with pytest.raises(ModelError, match="np.where: the condition must be a condition"):
        lv(where_cond)


def test_model_function_signature():
    with pytest.raises(TypeError, match="model function `<lambda>` must take 4 positional"):
        lv(lambda u, p, t: [u.x, u.y], nets={"U": U})
    with pytest.raises(TypeError, match="must take 3 or 4 positional arguments, it takes 2"):
        lv(lambda u, p: [u.x, u.y])
    with pytest.raises(TypeError, match="the model function must be callable"):
        lv(42)


# -------------------------------------------------------------- Model API


def test_bad_names():
    with pytest.raises(ValueError, match=r"`states`: 'x y' is not a valid name"):
        sm.Model(lotka_volterra, ["x y", "z"], [])
    with pytest.raises(ValueError, match=r"`params`: duplicate names alpha"):
        sm.Model(lotka_volterra, ["x", "y"], ["alpha", "alpha"])
    with pytest.raises(TypeError, match=r"`states` must be a list of names, got the string"):
        sm.Model(lotka_volterra, "xy", [])
    with pytest.raises(ValueError, match="`states` must name at least one state"):
        sm.Model(lotka_volterra, [], [])
    with pytest.raises(ValueError, match=r"'x' is both in `states` and in `params`"):
        sm.Model(lotka_volterra, ["x", "y"], ["x"])
    with pytest.raises(ValueError, match=r"'U' is both in `params` and in `nets`"):
        sm.Model(lv_ude, ["x", "y"], ["U"], nets={"U": U})


def test_bad_nets_and_observables(cube_activation, monkeypatch):
    with pytest.raises(TypeError, match=r"`nets\['U'\]` must be a nets.Chain, got Dense"):
        lv(lv_ude, nets={"U": Dense(2)})
    with pytest.raises(TypeError, match="`nets` must be a dict"):
        lv(lv_ude, nets=[U])
    # A custom activation is no longer an error: a warning that it compiles per process
    # (once per activation and process: forget earlier ones).
    monkeypatch.setattr(model_module, "_WARNED", set())
    with pytest.warns(sm.CacheWarning, match=r"`nets\['U'\]` uses the custom activation "
                      r"'cube': its numba functions are compiled once in each process"):
        lv(lv_ude, nets={"U": Chain(2, Dense(2, "cube"))})
    with pytest.raises(TypeError, match="`observables` must be a dict"):
        lv(lv_ude, nets={"U": U}, observables=[lambda u, p: u.x])
    with pytest.raises(TypeError, match=r"observable 'bad' must take 2 or 3 or 4 positional "
                       r"arguments, it takes 1"):
        lv(lv_ude, nets={"U": U}, observables={"bad": lambda u: u.x})
    with pytest.raises(TypeError, match=r"observable 'g' must be a function g\(u, p\), "
                       r"g\(u, p, t\) or g\(u, p, t, nets\), got 3"):
        lv(lv_ude, nets={"U": U}, observables={"g": 3})
    with pytest.raises(ModelError,
                       match=r"observable 'v' \(defined at .*\): must return one number"):
        lv(lv_ude, nets={"U": U}, observables={"v": lambda u, p: [u.x, u.y]})
    with pytest.raises(ModelError, match=r"observable 'w', at .*unknown state 'w'"):
        lv(lv_ude, nets={"U": U}, observables={"w": lambda u, p: u.w})
    # observables may call the model's nets, with the same checks as the model function
    with pytest.raises(ModelError, match=r"observable 'o', at .*: unknown net 'V'; nets: U"):
        lv(lv_ude, nets={"U": U}, observables={"o": lambda u, p, t, nets: nets.V(u)[0]})
    with pytest.raises(ModelError, match=r"observable 'o', at .*: net `U` takes 2 inputs, got 1"):
        lv(lv_ude, nets={"U": U}, observables={"o": lambda u, p, t, nets: nets.U([u.x])[0]})
    with pytest.raises(ModelError, match=r"observable 'o' \(defined at .*\): must return one "
                       r"number or traced expression, got Vec"):
        lv(lv_ude, nets={"U": U}, observables={"o": lambda u, p, t, nets: nets.U(u)})


def test_initial_value_function_errors():
    m = lv(lv_ude, nets={"U": U})

    def three(p, nets):
        return [p.alpha, p.delta, 1.0]

    def reads_a_state(p, nets):
        return [p.x, p.delta]  # MARK

    def condition(p):
        return [p.alpha > 0, p.delta]

    with pytest.raises(ModelError, match=r"initial-value function `three` \(defined at .*\): "
                       r"returned 3 initial values for 2 states; return one per state \(x, y\)"):
        m.initial_table(three)
    with pytest.raises(ModelError, match=re.escape(lineno(reads_a_state, "# MARK"))
                       + r": unknown parameter 'x' \('x' is a state: use u.x\)"):
        m.initial_table(reads_a_state)
    with pytest.raises(ModelError, match=r"value 0 \(x\) is a condition"):
        m.initial_table(condition)
    with pytest.raises(TypeError, match="`u0` must be an array or a function u0"):
        m.initial_table(42)


def test_init_params_errors():
    m = lv(lv_ude, nets={"U": U})
    with pytest.raises(ValueError, match=r"no value for mechanistic parameter\(s\) delta; pass "
                       r"them, e\.g\. model.init_params\(seed=0, delta=\.\.\.\)"):
        m.init_params(alpha=1.0)
    with pytest.raises(ValueError, match=r"unknown name\(s\) beta; parameters: alpha, delta; "
                       r"nets: U"):
        m.init_params(alpha=1.0, delta=1.0, beta=2.0)
    with pytest.raises(ValueError, match="`alpha` must be a finite number, got nan"):
        m.init_params(alpha=np.nan, delta=1.0)
    with pytest.raises(ValueError, match=r"`U` must have shape \(87,\), got \(3,\)"):
        m.init_params(alpha=1.0, delta=1.0, U=np.zeros(3))
    with pytest.raises(ValueError, match=r"unpack: `theta` must be an ndarray of shape \(89,\)"):
        m.unpack(np.zeros(3))
    views = m.unpack(m.init_params(alpha=1.0, delta=1.0))
    with pytest.raises(AttributeError, match="no parameter or net named 'beta'; known: alpha"):
        views.beta  # noqa: B018
    with pytest.raises(ValueError, match=r"`u` must have shape \(2,\), got \(3,\)"):
        m.rhs(np.zeros(3), np.zeros(89))
    with pytest.raises(ValueError, match=r"`p` must have shape \(89,\), got \(2,\)"):
        m.rhs(np.zeros(2), np.zeros(2))


def test_neural_ode_errors():
    with pytest.raises(ValueError, match="NeuralODE: the chain must map n states to n "
                       "derivatives; it has 2 inputs and 3 outputs"):
        sm.NeuralODE(Chain(2, Dense(3)))
    with pytest.raises(TypeError, match="NeuralODE: `chain` must be a nets.Chain"):
        sm.NeuralODE(Dense(3))
