"""Every tableau satisfies the order conditions of its order, and its checks refuse bad data.

Order conditions are those of Butcher's rooted trees (Hairer, Norsett &
Wanner, Solving ODEs I, Sec. II.2): for every tree t with |t| <= p,
``b . Phi(t) == 1 / gamma(t)``, where ``Phi`` of a tree whose root has
subtrees t_1..t_m is the elementwise product of ``A @ Phi(t_k)``. The
interpolant of order q satisfies ``b(theta) . Phi(t) == theta^|t| / gamma(t)``
for |t| <= q, and the embedded method the conditions of its order.
"""

import itertools
from functools import cache

import numpy as np
import pytest

from sciml.solvers import tableaus as T
from sciml.solvers.tableaus import ButcherTableau

ALL = {"Tsit5": T.TSIT5, "DP5": T.DP5, "BS3": T.BS3, "Vern7": T.VERN7, "RK4": T.RK4,
       "Euler": T.EULER}


@cache
def trees(order):
    """Rooted trees with `order` nodes, each a sorted tuple of its root's subtrees."""
    if order == 1:
        return ((),)
    out = set()
    # a root plus a multiset of subtrees whose sizes sum to order - 1
    for sizes in _partitions(order - 1):
        for combo in itertools.product(*(trees(k) for k in sizes)):
            out.add(tuple(sorted(combo)))
    return tuple(sorted(out))


def _partitions(n, largest=None):
    largest = largest or n
    if n == 0:
        yield ()
        return
    for k in range(min(n, largest), 0, -1):
        for rest in _partitions(n - k, k):
            yield (k,) + rest


def size(t):
    return 1 + sum(size(s) for s in t)


def gamma(t):
    return size(t) * np.prod([gamma(s) for s in t])


def phi(t, A):
    out = np.ones(A.shape[0])
    for s in t:
        out = out * (A @ phi(s, A))
    return out


def test_tree_counts():
    # OEIS A000081: 1, 1, 2, 4, 9, 20, 48
    assert [len(trees(k)) for k in range(1, 8)] == [1, 1, 2, 4, 9, 20, 48]


def residuals(weights, A, order, theta=1.0):
    return [abs(weights @ phi(t, A) - theta ** size(t) / gamma(t))
            for k in range(1, order + 1) for t in trees(k)]


@pytest.mark.parametrize("name", ALL)
def test_order_conditions(name):
    tab = ALL[name]
    assert max(residuals(tab.b, tab.A, tab.order)) < 1e-12
    # and not one order more (each method has exactly its order)
    assert max(residuals(tab.b, tab.A, tab.order + 1)) > 1e-6


@pytest.mark.parametrize("name", [k for k, t in ALL.items() if t.b_error is not None])
def test_embedded_order_conditions(name):
    tab = ALL[name]
    b_hat = tab.b - tab.b_error
    assert max(residuals(b_hat, tab.A, tab.embedded_order)) < 1e-12
    # the error estimate is of the embedded method's order, not better
    assert max(residuals(b_hat, tab.A, tab.embedded_order + 1)) > 1e-6


# The published Vern7 interpolant meets its order-7 conditions to about 1e-7
# (those of orders <= 6 to rounding): far below what any step size resolves.
DENSE_TOP_DEFECT = {"Vern7": 1e-6}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("theta", [0.1, 0.37, 0.5, 0.83])
def test_interpolant_order_conditions(name, theta):
    tab = ALL[name]
    w = tab.weights_at(theta)
    q = tab.dense_order
    assert max(residuals(w, tab.A, q - 1, theta), default=0.0) < 1e-12
    top = [abs(w @ phi(t, tab.A) - theta ** q / gamma(t)) for t in trees(q)]
    assert max(top) < DENSE_TOP_DEFECT.get(name, 1e-12)


def test_interpolant_endpoints():
    for tab in ALL.values():
        np.testing.assert_allclose(tab.weights_at(0.0), 0.0, atol=0)
        np.testing.assert_allclose(tab.weights_at(1.0), tab.b, atol=1e-13)


def test_fsal_structure():
    for name, tab in ALL.items():
        if tab.fsal:
            last = tab.n_step_stages - 1
            np.testing.assert_array_equal(tab.A[last], tab.b, err_msg=name)


def euler_kwargs(**over):
    kw = dict(c=[0.0, 1.0], A=[[0.0, 0.0], [1.0, 0.0]], b=[1.0, 0.0],
              b_dense=[[1.0, -2.0, 1.0], [0.0, -1.0, 1.0]], order=1, dense_order=1)
    kw.update(over)
    return kw


@pytest.mark.parametrize("over, message", [
    (dict(A=[[0.0, 0.0], [0.5, 0.0]]), "row 1 of `A` sums to 0.5, but c[1] = 1.0"),
    (dict(A=[[0.0, 1.0], [1.0, 0.0]]), "`A` must be strictly lower triangular"),
    (dict(A=[[0.0]]), "`A` must have shape (2, 2)"),
    (dict(b=[0.5, 0.0], b_dense=[[0.5], [0.0]]), "`b` must sum to 1"),
    (dict(b=[1.0]), "`b` must have shape (2,)"),
    (dict(b_error=[0.5, 0.0], embedded_order=1), "`embedded_order` must be in [1, order)"),
    (dict(b_error=[0.5, 0.0]), "`b_error` and `embedded_order` must be given together"),
    (dict(order=2, dense_order=1, b_error=[0.5, 0.0], embedded_order=1),
     "`b_error` must sum to 0"),
    (dict(b_dense=[[1.0, -1.0], [0.0, 0.0]]), "the interpolant must end on the step's result"),
    (dict(b_dense=[1.0, 0.0]), "`b_dense` must have shape (2, d)"),
    (dict(dense_order=2), "`dense_order` must be in [1, order=1]"),
    (dict(n_step_stages=1, b=[0.0, 1.0]),
     "`b` and `b_error` must be zero on the extra stages 1..1"),
    (dict(c=[0.0, 1.0], A=[[0.0, 0.0], [1.0, 0.0]], b=[0.5, 0.5],
          b_dense=[[0.5], [0.5]], fsal=True), "`fsal=True` needs the last step stage"),
])
def test_tableau_checks(over, message):
    with pytest.raises(ValueError, match=r"^ButcherTableau: ") as err:
        ButcherTableau(**euler_kwargs(**over))
    assert message in str(err.value)
