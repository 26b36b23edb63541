"""State-dependent events (`sciml.Event`): the bouncing ball against its closed-form event
times, gradients through the bounces for all six sensitivity methods with Tsit5 and Rodas5
against central finite differences, terminal events, directions, a condition zero at t0,
simultaneous events, and the errors."""

import numpy as np
import pytest

import adjoints
import sciml
from sciml.events import run_events

from .central import loss_gradient


def _ball(u, p, t, nets):
    return [u[1], -p.g]


BALL = sciml.Model(_ball, states=["h", "v"], params=["g", "e"])
TH = np.array([9.81, 0.8])


def _bounce(**kw):
    return sciml.Event(lambda u, p, t: u.h, affect=lambda u, p, t: {"v": -p.e * u.v},
                       direction=-1, **kw)


def _bounce_times(tf, h0=1.0):
    g, e = TH
    t = [np.sqrt(2 * h0 / g)]
    v = e * g * t[0]
    while t[-1] + 2 * v / g < tf:
        t.append(t[-1] + 2 * v / g)
        v *= e
    return np.array(t)


def test_bouncing_ball_event_times():
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 3.0), TH, events=[_bounce()])
    sol = sciml.solve(prob, sciml.Tsit5(), rtol=1e-10, atol=1e-12, saveat=[0.0, 0.3, 3.0])
    np.testing.assert_allclose(sol.t_events, _bounce_times(3.0), atol=1e-10)
    np.testing.assert_array_equal(sol.i_events, 0)
    np.testing.assert_allclose(sol.u[1], [1.0 - TH[0] * 0.09 / 2, -TH[0] * 0.3], atol=1e-10)
    every = sciml.solve(prob, sciml.Rodas5(), rtol=1e-8, atol=1e-10)  # every step saved
    assert np.all(np.diff(every.t) >= 0) and np.all(every.u[:, 0] > -1e-8)


@pytest.fixture(scope="module")
def ball_fd():
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 3.0), TH, events=[_bounce()])
    ts = np.array([0.2, 0.7, 1.0, 1.4, 1.9, 2.3, 2.7])
    y = sciml.solve(prob, saveat=ts, rtol=1e-10, atol=1e-12).u * 1.1 + 0.05
    data = sciml.Data(t=ts, y=y)

    return prob, data, loss_gradient(prob, data, TH)


METHODS = [adjoints.ForwardSensitivity, adjoints.GaussAdjoint, adjoints.DiscreteAdjoint,
           adjoints.InterpolatingAdjoint, adjoints.BacksolveAdjoint,
           adjoints.QuadratureAdjoint]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("solver", [sciml.Tsit5(), sciml.Rodas5()], ids=lambda s: s.name)
def test_gradient_through_bounces(ball_fd, method, solver):
    prob, data, fd = ball_fd
    _, g = sciml.loss_and_grad(prob, data, solver=solver, sensealg=method(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_terminal_event_stops_the_solve():
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 3.0), TH, events=[_bounce(terminal=True)])
    sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, saveat=np.linspace(0, 3, 31))
    t1 = np.sqrt(2 / TH[0])
    assert sol.success and sol.t_end == pytest.approx(t1, abs=1e-10)
    assert sol.t[-1] < t1 and len(sol.t_events) == 1


def test_direction_and_a_condition_zero_at_the_start():
    rising = sciml.Event(lambda u, p, t: u.h, direction=+1)  # the ball never rises through 0
    at_zero = sciml.Event(lambda u, p, t: u.v)               # v = 0 at t0: no event there
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 0.4), TH, events=[rising, at_zero])
    sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, saveat=[0.4])
    assert sol.t_events.size == 0


def test_simultaneous_events_fire_in_order():
    first = sciml.Event(lambda u, p, t: u.h, affect=lambda u, p, t: {"v": -u.v}, direction=-1)
    second = sciml.Event(lambda u, p, t: 2 * u.h, affect=lambda u, p, t: {"v": 0.5 * u.v},
                         direction=-1)
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 0.6), TH, events=[first, second])
    sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, saveat=[0.6])
    t1 = np.sqrt(2 / TH[0])
    np.testing.assert_array_equal(sol.i_events, [0, 1])
    np.testing.assert_allclose(sol.t_events, [t1, t1], atol=1e-10)
    v = 0.5 * TH[0] * t1  # reversed, then halved
    np.testing.assert_allclose(sol.u[0, 1], v - TH[0] * (0.6 - t1), atol=1e-9)


def test_errors():
    with pytest.raises(ValueError, match="`direction`"):
        sciml.Event(lambda u, p, t: u.h, direction=2)
    bad = sciml.Event(lambda u, p, t: u.h, affect=lambda u, p, t: {"w": 0.0})
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 1.0), TH, events=[bad])
    with pytest.raises(ValueError, match="sets 'w', which is not a state"):
        sciml.solve(prob)
    with pytest.raises(TypeError, match=r"events\[0\]` must be a sciml.Event"):
        sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 1.0), TH, events=[lambda u: u])


@pytest.mark.parametrize("method", [adjoints.ForwardSensitivity, adjoints.GaussAdjoint],
                         ids=lambda m: m.__name__)
def test_many_bounces_and_a_kick(method):
    """Many bounces (the pieces look ahead past several of them) and a bolus on v."""
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 3.5), TH, events=[_bounce()],
                            doses=[sciml.Bolus(2.0, 8.0, "v")])
    ts = np.linspace(0.1, 3.4, 25)
    pieces, _ = run_events(prob, sciml.Tsit5(), TH, 1e-10, np.full(2, 1e-12), None, 10**5)
    assert any(not p.fired and not p.final for p in pieces)  # a look-ahead boundary
    sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, saveat=ts)
    np.testing.assert_allclose(sol.t_events[:3], _bounce_times(2.0)[:3], atol=1e-10)
    assert sol.success and sol.t_events.size >= 3 and np.all(sol.u[:, 0] > -1e-8)
    data = sciml.Data(t=ts, y=sol.u * 1.05)

    fd = loss_gradient(prob, data, TH)
    _, g = sciml.loss_and_grad(prob, data, sensealg=method(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-5)


def test_an_infusion_before_later_pieces():
    # a push upward for 0.1 time units, over before the first bounce (and later pieces)
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 2.0), TH, events=[_bounce()],
                            doses=[sciml.Infusion(0.0, 0.1, 2.0, "v")])
    sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, saveat=[2.0])
    g, e = TH
    v1, h1 = 0.2 - g * 0.1, 1.0 + 0.1 * 0.1 - g * 0.01 / 2  # after the push
    t1 = 0.1 + (v1 + np.sqrt(v1 ** 2 + 2 * g * h1)) / g
    np.testing.assert_allclose(sol.t_events[0], t1, atol=1e-10)
    assert sol.t_events.size >= 2
    data = sciml.Data(t=np.array([0.5, 1.5]), y=np.zeros((2, 2)))
    _, grad = sciml.loss_and_grad(prob, data, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, loss_gradient(prob, data, TH), rtol=1e-6)


def test_a_failed_solve_reports_where_and_why():
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 3.0), TH, events=[_bounce()])
    with pytest.warns(sciml.SolveWarning, match="maximum number of steps"):
        sol = sciml.solve(prob, rtol=1e-10, atol=1e-12, max_steps=3)
    assert sol.status == "max_steps" and 0.0 < sol.t_end < 3.0
    assert sol.t[-1] <= sol.t_end and sol.t.shape[0] == sol.u.shape[0] > 1
