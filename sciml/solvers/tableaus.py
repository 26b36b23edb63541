"""Butcher tableaus of the explicit Runge-Kutta methods, as checked data.

A `ButcherTableau` carries everything the one compiled ERK loop needs:
stages (``c``, ``A``), propagated weights ``b``, error weights
``b_error = b - b_hat`` of the embedded pair, and the dense-output weights
``b_dense``: the interpolant on a step is

    u(t + theta*h) = u + h * sum_i b_i(theta) k_i,   b_i(theta) = sum_j b_dense[i, j] theta**(j+1),

over all stages, including *extra* stages (beyond ``n_step_stages``) that
only the interpolant uses and that the loop computes lazily, for steps that
contain output points. Coefficients are published data; each constant below
cites its source. `tests/sciml/test_erk_tableaus.py` checks every order
condition up to each method's order (and its interpolant's).
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.polynomial import polynomial as npoly

from .kernels.structs import ERKTableau, RosTableau

_EPS = np.finfo(np.float64).eps


def _close(x, y, scale):
    return abs(x - y) <= 64 * _EPS * max(1.0, scale)


@dataclass(frozen=True, eq=False)
class ButcherTableau:
    """An explicit Runge-Kutta method, checked on construction.

    Parameters
    ----------
    c : array_like, (s,)
        Nodes; ``c[0] == 0`` and ``c[i] == sum(A[i])``.
    A : array_like, (s, s)
        Stage coefficients, strictly lower triangular.
    b : array_like, (s,)
        Weights of the propagated solution; sum to 1; zero on extra stages.
    b_dense : array_like, (s, d)
        Interpolant weights: ``b_i(theta) = sum_j b_dense[i, j] * theta**(j + 1)``,
        with ``b_i(1) == b_i`` (the interpolant ends on the step's result).
    order, dense_order : int
        Order of the propagated solution and of the interpolant.
    b_error : array_like, (s,), optional
        ``b - b_hat`` of an embedded pair (sums to 0): the local error estimate
        is ``h * sum_i b_error[i] k_i``. None for fixed-step methods.
    embedded_order : int, optional
        Order of ``b_hat``; given exactly when ``b_error`` is.
    n_step_stages : int, optional
        Stages a step evaluates (default: all ``s``); stages past it are the
        interpolant's extra stages.
    fsal : bool
        First same as last: the last step stage is ``f(t + h, u_new)`` (row
        ``A[s-1] == b``), reused as the next step's first stage.
    """

    c: np.ndarray
    A: np.ndarray
    b: np.ndarray
    b_dense: np.ndarray
    order: int
    dense_order: int
    b_error: np.ndarray | None = None
    embedded_order: int | None = None
    n_step_stages: int | None = None
    fsal: bool = False

    def __post_init__(self):
        f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
        for name in ("c", "A", "b", "b_dense"):
            object.__setattr__(self, name, f64(getattr(self, name)))
        if self.b_error is not None:
            object.__setattr__(self, "b_error", f64(self.b_error))
        s = self.c.shape[0]
        if self.n_step_stages is None:
            object.__setattr__(self, "n_step_stages", s)
        self._check_shapes(s)
        self._check_values(s)

    def _check_shapes(self, s):
        def fail(msg):
            raise ValueError(f"ButcherTableau: {msg}")

        if self.c.ndim != 1 or s < 1:
            fail(f"`c` must be a non-empty 1-D array, got shape {self.c.shape}")
        if self.A.shape != (s, s):
            fail(f"`A` must have shape ({s}, {s}) to match `c`, got {self.A.shape}")
        if self.b.shape != (s,):
            fail(f"`b` must have shape ({s},), got {self.b.shape}")
        if self.b_dense.ndim != 2 or self.b_dense.shape[0] != s or self.b_dense.shape[1] < 1:
            fail(f"`b_dense` must have shape ({s}, d) with d >= 1, got {self.b_dense.shape}")
        if (self.b_error is None) != (self.embedded_order is None):
            fail("`b_error` and `embedded_order` must be given together")
        if self.b_error is not None and self.b_error.shape != (s,):
            fail(f"`b_error` must have shape ({s},), got {self.b_error.shape}")
        if not (1 <= self.n_step_stages <= s):
            fail(f"`n_step_stages` must be in [1, {s}], got {self.n_step_stages}")
        if not (1 <= self.dense_order <= self.order):
            fail(f"`dense_order` must be in [1, order={self.order}], got {self.dense_order}")
        if self.embedded_order is not None and not (1 <= self.embedded_order < self.order):
            fail(f"`embedded_order` must be in [1, order), got {self.embedded_order}")

    def _check_values(self, s):
        def fail(msg):
            raise ValueError(f"ButcherTableau: {msg}")

        A, b, c, e = self.A, self.b, self.c, self.b_error
        if np.any(np.triu(A) != 0):
            i, j = np.argwhere(np.triu(A) != 0)[0]
            fail(f"`A` must be strictly lower triangular (explicit method); A[{i}, {j}] = "
                 f"{float(A[i, j])!r}")
        for i in range(s):
            if not _close(A[i].sum(), c[i], np.abs(A[i]).sum()):
                fail(f"row {i} of `A` sums to {float(A[i].sum())!r}, but c[{i}] = {float(c[i])!r}")
        if not _close(b.sum(), 1.0, np.abs(b).sum()):
            fail(f"`b` must sum to 1, got {float(b.sum())!r}")
        ns = self.n_step_stages
        if np.any(b[ns:] != 0) or (e is not None and np.any(e[ns:] != 0)):
            fail(f"`b` and `b_error` must be zero on the extra stages {ns}..{s - 1}")
        if e is not None and not _close(e.sum(), 0.0, np.abs(e).sum()):
            fail(f"`b_error` must sum to 0, got {float(e.sum())!r}")
        ends = self.b_dense.sum(axis=1)
        for i in range(s):
            if not _close(ends[i], b[i], np.abs(self.b_dense[i]).sum()):
                fail(f"the interpolant must end on the step's result: b_{i}(1) = "
                     f"{float(ends[i])!r}, but b[{i}] = {float(b[i])!r}")
        if self.fsal:
            last = ns - 1
            if c[last] != 1.0 or b[last] != 0.0 or not np.allclose(A[last], b, rtol=0,
                                                                     atol=64 * _EPS):
                fail(f"`fsal=True` needs the last step stage ({last}) to be f(t + h, u_new): "
                     "c = 1, A row == b, b = 0 there")

    @property
    def n_stages(self):
        """All stages, including the interpolant's extra ones."""
        return self.c.shape[0]

    @property
    def end_stage(self):
        """A stage equal to f(t + h, u_new), reused as the next step's first: the FSAL
        stage, else an extra stage with row ``b`` (Vern7's); -1 if none."""
        s = self.n_step_stages
        if self.fsal:
            return s - 1
        for i in range(s, self.n_stages):
            if self.c[i] == 1.0 and np.array_equal(self.A[i], self.b):
                return i
        return -1

    @functools.cached_property
    def _engine(self):
        s = self.n_step_stages
        e = self.b_error if self.b_error is not None else np.zeros(self.n_stages)
        return ERKTableau(self.A.ravel().copy(), self.b[:s].copy(), e[:s].copy(),
                          self.c.copy(), self.b_dense.ravel().copy(), s, self.end_stage,
                          self.order)

    def engine(self, constants=False):
        """The tableau as the compiled loops take it (`kernels.structs.ERKTableau`):
        arrays, or with ``constants`` tuples of floats (the lean entry points)."""
        if not constants:
            return self._engine
        t = self._engine
        return t._replace(**{k: tuple(map(float, getattr(t, k))) for k in "A b e c P".split()})

    def weights_at(self, theta):
        """Interpolant weights ``b_i(theta)`` (s,) at one ``theta`` in [0, 1]."""
        powers = theta ** np.arange(1, self.b_dense.shape[1] + 1)
        return self.b_dense @ powers


def _lower(rows, s=None):
    """A strictly lower triangular matrix from its rows below the diagonal."""
    s = s or len(rows) + 1
    A = np.zeros((s, s))
    for i, row in enumerate(rows, start=1):
        for j, v in row.items() if isinstance(row, dict) else enumerate(row):
            A[i, j] = v
    return A


def _hermite_dense(b):
    """Cubic Hermite interpolant weights for an FSAL tableau (last stage = f(t+h, u_new)).

    Matches u and f at both ends of the step: ``u(theta) = u + h*[(3 theta^2 -
    2 theta^3) sum b_i k_i + (theta - 2 theta^2 + theta^3) k_1 + (theta^3 -
    theta^2) k_last]``; third order when the method is of order >= 3.
    """
    b = np.asarray(b, dtype=np.float64)
    P = np.zeros((b.shape[0], 3))
    P[:, 1] += 3 * b
    P[:, 2] -= 2 * b
    P[0] += [1.0, -2.0, 1.0]
    P[-1] += [0.0, -1.0, 1.0]
    return P


# ---------------------------------------------------------------- Tsit5

TSIT5 = ButcherTableau(
    # Ch. Tsitouras, "Runge-Kutta pairs of order 5(4) satisfying only the first
    # column simplifying assumption", Comput. Math. Appl. 62 (2011) 770-775,
    # Table 1 (nodes, stages, weights) and the interpolant of its Sec. 3.
    c=[0.0, 0.161, 0.327, 0.9, 0.9800255409045097, 1.0, 1.0],
    A=_lower([
        [0.161],
        [-0.008480655492356989, 0.335480655492357],
        [2.8971530571054935, -6.359448489975075, 4.3622954328695815],
        [5.325864828439257, -11.748883564062828, 7.4955393428898365, -0.09249506636175525],
        [5.86145544294642, -12.92096931784711, 8.159367898576159, -0.071584973281401,
         -0.028269050394068383],
        [0.09646076681806523, 0.01, 0.4798896504144996, 1.379008574103742,
         -3.290069515436081, 2.324710524099774],
    ]),
    b=[0.09646076681806523, 0.01, 0.4798896504144996, 1.379008574103742,
       -3.290069515436081, 2.324710524099774, 0.0],
    b_error=[-0.00178001105222577714, -0.0008164344596567469, 0.007880878010261995,
             -0.1447110071732629, 0.5823571654525552, -0.45808210592918697,
             0.015151515151515152],
    b_dense=[
        [1.0, -2.763706197274826, 2.9132554618219126, -1.0530884977290216],
        [0.0, 0.13169999999999998, -0.2234, 0.1017],
        [0.0, 3.9302962368947516, -5.941033872131505, 2.490627285651253],
        [0.0, -12.411077166933676, 30.33818863028232, -16.548102889244902],
        [0.0, 37.50931341651104, -88.1789048947664, 47.37952196281928],
        [0.0, -27.896526289197286, 65.09189467479366, -34.87065786149661],
        [0.0, 1.5, -4.0, 2.5],
    ],
    order=5, embedded_order=4, dense_order=4, fsal=True,
)

# ---------------------------------------------------------------- DP5


def _dopri5():
    # J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae",
    # J. Comput. Appl. Math. 6 (1980) 19-26 (RK5(4)7M). Dense output: L. F.
    # Shampine, "Some practical Runge-Kutta formulas", Math. Comp. 46 (1986)
    # 135-150, in the form of Hairer, Norsett & Wanner, Solving ODEs I, Sec. II.6.
    b = np.array([35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0])
    b_hat = np.array([5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200,
                      187 / 2100, 1 / 40])
    d = np.array([-12715105075 / 11282082432, 0, 87487479700 / 32700410799,
                  -10690763975 / 1880347072, 701980252875 / 199316789632,
                  -1453857185 / 822651844, 69997945 / 29380423])
    e1, e7 = np.eye(7)[0], np.eye(7)[6]
    # b(theta) = theta b + theta(1-theta)(e1 - b) + theta^2(1-theta)(2b - e1 - e7)
    #            + theta^2 (1-theta)^2 d, expanded in powers of theta.
    terms = [(np.array([0.0, 1.0]), b),
             (npoly.polymul([0, 1], [1, -1]), e1 - b),
             (npoly.polymul([0, 0, 1], [1, -1]), 2 * b - e1 - e7),
             (npoly.polymul([0, 0, 1], npoly.polymul([1, -1], [1, -1])), d)]
    P = np.zeros((7, 5))
    for poly, w in terms:
        P[:, :len(poly)] += np.outer(w, poly)
    return ButcherTableau(
        c=[0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1, 1],
        A=_lower([
            [1 / 5],
            [3 / 40, 9 / 40],
            [44 / 45, -56 / 15, 32 / 9],
            [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
            [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
            list(b[:6]),
        ]),
        b=b, b_error=b - b_hat, b_dense=P[:, 1:],
        order=5, embedded_order=4, dense_order=4, fsal=True,
    )


DP5 = _dopri5()

# ---------------------------------------------------------------- BS3

_BS3_B = [2 / 9, 1 / 3, 4 / 9, 0.0]
BS3 = ButcherTableau(
    # P. Bogacki, L. F. Shampine, "A 3(2) pair of Runge-Kutta formulas",
    # Appl. Math. Lett. 2 (1989) 321-325. Dense output: cubic Hermite.
    c=[0.0, 1 / 2, 3 / 4, 1.0],
    A=_lower([[1 / 2], [0.0, 3 / 4], _BS3_B[:3]]),
    b=_BS3_B,
    b_error=np.array(_BS3_B) - np.array([7 / 24, 1 / 4, 1 / 3, 1 / 8]),
    b_dense=_hermite_dense(_BS3_B),
    order=3, embedded_order=2, dense_order=3, fsal=True,
)

# ---------------------------------------------------------------- Vern7


def _vern7():
    # J. H. Verner, "Numerically optimal Runge-Kutta pairs with interpolants",
    # Numer. Algorithms 53 (2010) 383-396: the "most efficient" 7(6) pair
    # (10 stages) and its order-7 interpolant (6 extra stages), coefficients
    # as published on Verner's web page of RK pairs. Stage numbers below are
    # 1-based as in the paper.
    s = 16
    c = np.zeros(s)
    c[1:10] = [0.005, 0.10888888888888888, 0.16333333333333333, 0.4555,
               0.6095094489978381, 0.884, 0.925, 1.0, 1.0]
    c[10:] = [1.0, 0.29, 0.125, 0.25, 0.53, 0.79]
    b = np.zeros(s)
    b[[0, 3, 4, 5, 6, 7, 8]] = [0.04715561848627222, 0.25750564298434153,
                                0.26216653977412624, 0.15216092656738558,
                                0.4939969170032485, -0.29430311714032503,
                                0.08131747232495111]
    e = np.zeros(s)
    e[[0, 3, 4, 5, 6, 7, 8, 9]] = [0.002547011879931045, -0.00965839487279575,
                                   0.04206470975639691, -0.0666822437469301,
                                   0.2650097464621281, -0.29430311714032503,
                                   0.08131747232495111, -0.02029518466335628]

    def row(pairs):
        return {j - 1: v for j, v in pairs}

    rows = [
        row([(1, 0.005)]),
        row([(1, -1.07679012345679), (2, 1.185679012345679)]),
        row([(1, 0.04083333333333333), (3, 0.1225)]),
        row([(1, 0.6389139236255726), (3, -2.455672638223657), (4, 2.272258714598084)]),
        row([(1, -2.6615773750187572), (3, 10.804513886456137), (4, -8.3539146573962),
             (5, 0.820487594956657)]),
        row([(1, 6.067741434696772), (3, -24.711273635911088), (4, 20.427517930788895),
             (5, -1.9061579788166472), (6, 1.006172249242068)]),
        row([(1, 12.054670076253203), (3, -49.75478495046899), (4, 41.142888638604674),
             (5, -4.461760149974004), (6, 2.042334822239175), (7, -0.09834843665406107)]),
        row([(1, 10.138146522881808), (3, -42.6411360317175), (4, 35.76384003992257),
             (5, -4.3480228403929075), (6, 2.0098622683770357), (7, 0.3487490460338272),
             (8, -0.27143900510483127)]),
        row([(1, -45.030072034298676), (3, 187.3272437654589), (4, -154.02882369350186),
             (5, 18.56465306347536), (6, -7.141809679295079), (7, 1.3088085781613787)]),
        # extra stages for the interpolant; stage 11 is f(t + h, u_new)
        {j: v for j, v in enumerate(b) if v != 0},
        row([(1, 0.0523222769159969), (4, 0.22495861826705715), (5, 0.017443709248776376),
             (6, -0.007669379876829393), (7, 0.03435896044073285), (8, -0.0410209723009395),
             (9, 0.025651133005205617), (11, -0.0160443457)]),
        row([(1, 0.053053341257859085), (4, 0.12195301011401886), (5, 0.017746840737602496),
             (6, -0.0005928372667681495), (7, 0.008381833970853752),
             (8, -0.01293369259698612), (9, 0.009412056815253861),
             (11, -0.005353253107275676), (12, -0.06666729992455811)]),
        row([(1, 0.03887903257436304), (4, -0.0024403203308301317),
             (5, -0.0013928917214672623), (6, -0.00047446291558680135),
             (7, 0.00039207932413159514), (8, -0.00040554733285128004),
             (9, 0.00019897093147716726), (11, -0.00010278198793179169),
             (12, 0.03385661513870267), (13, 0.1814893063199928)]),
        row([(1, 0.05723681204690013), (4, 0.22265948066761182), (5, 0.12344864200186899),
             (6, 0.04006332526666491), (7, -0.05269894848581452), (8, 0.04765971214244523),
             (9, -0.02138895885042213), (11, 0.015193891064036402),
             (12, 0.12060546716289655), (13, -0.022779423016187374)]),
        row([(1, 0.051372038802756814), (4, 0.5414214473439406), (5, 0.350399806692184),
             (6, 0.14193112269692182), (7, 0.10527377478429423), (8, -0.031081847805874016),
             (9, -0.007401883149519145), (11, -0.006377932504865363),
             (12, -0.17325495908361865), (13, -0.18228156777622026)]),
    ]
    P = np.zeros((s, 7))
    interp = {
        1: [1.0, -8.413387198332767, 33.675508884490895, -70.80159089484886,
            80.64695108301298, -47.19413969837522, 11.133813442539243],
        4: [0.0, 8.754921980674396, -88.4596828699771, 346.9017638429916,
            -629.2580030059837, 529.6773755604193, -167.35886986514018],
        5: [0.0, 8.913387586637922, -90.06081846893218, 353.1807459217058,
            -640.6476819744374, 539.2646279047156, -170.38809442991547],
        6: [0.0, 5.1733120298478, -52.271115900055385, 204.9853867374073,
            -371.8306118563603, 312.9880934374529, -98.89290352172495],
        7: [0.0, 16.79537744079696, -169.70040000059728, 665.4937727009246,
            -1207.1638892336007, 1016.1291515818546, -321.06001557237494],
        8: [0.0, -10.005997536098665, 101.1005433052275, -396.47391512378437,
            719.1787707014183, -605.3681033918824, 191.27439892797935],
        9: [0.0, 2.764708833638599, -27.934602637390462, 109.54779186137893,
            -198.7128113064482, 167.26633571640318, -52.85010499525706],
        11: [0.0, -2.1696320280163506, 22.016696037569876, -86.90152427798948,
             159.22388973861476, -135.9618306534588, 43.792401183280006],
        12: [0.0, -4.890070188793804, 22.75407737425176, -30.78034218537731,
             -2.797194317207249, 31.369456637508403, -15.655927320381801],
        13: [0.0, 10.862170929551967, -50.542971417827104, 68.37148040407511,
             6.213326521632409, -69.68006323194157, 34.776056794509195],
        14: [0.0, -11.37286691922923, 130.79058078246717, -488.65113677785604,
             832.2148793276441, -664.7743368554426, 201.79288044241662],
        15: [0.0, -5.919778732715007, 63.27679965889219, -265.432682088738,
             520.1009254140611, -467.412109533902, 155.3868452824017],
        16: [0.0, -10.492146197961823, 105.35538525188011, -409.43975011988937,
             732.831448907654, -606.3044574733512, 188.0495196316683],
    }
    for stage, coeffs in interp.items():
        P[stage - 1] = coeffs
    return ButcherTableau(c=c, A=_lower(rows, s), b=b, b_error=e, b_dense=P,
                          order=7, embedded_order=6, dense_order=7, n_step_stages=10)


VERN7 = _vern7()

# ---------------------------------------------------------------- fixed step

_RK4_B = [1 / 6, 1 / 3, 1 / 3, 1 / 6, 0.0]
RK4 = ButcherTableau(
    # The classical Runge-Kutta method (W. Kutta, Z. Math. Phys. 46 (1901)
    # 435-453), with f(t + h, u_new) appended as an FSAL stage for the Hermite
    # interpolant; each step still costs four evaluations.
    c=[0.0, 1 / 2, 1 / 2, 1.0, 1.0],
    A=_lower([[1 / 2], [0.0, 1 / 2], [0.0, 0.0, 1.0], _RK4_B[:4]]),
    b=_RK4_B, b_dense=_hermite_dense(_RK4_B),
    order=4, dense_order=3, fsal=True,
)

EULER = ButcherTableau(
    # The explicit Euler method, with f(t + h, u_new) appended (FSAL) for the
    # Hermite interpolant; one evaluation per step.
    c=[0.0, 1.0], A=[[0.0, 0.0], [1.0, 0.0]], b=[1.0, 0.0],
    b_dense=_hermite_dense([1.0, 0.0]), order=1, dense_order=1, fsal=True,
)


# ---------------------------------------------------------------- Rosenbrock


def _lower_rows(rows, s, name):
    if len(rows) != s or any(len(r) != i for i, r in enumerate(rows)):
        raise ValueError(f"RosenbrockTableau: `{name}` must have rows of length 0, 1, ..., "
                         f"{s - 1}")
    M = np.zeros((s, s))
    for i, r in enumerate(rows):
        M[i, :i] = r
    return M


@dataclass(frozen=True, eq=False)
class RosenbrockTableau:
    """A Rosenbrock method in the transformed form of Hairer & Wanner (II, IV.7), checked
    on construction.

    Stage increments ``k_i`` solve ``(I/(h gamma) - J) k_i = f(t + c_i h, u + sum_j
    a_ij k_j) + sum_j (C_ij / h) k_j + h d_i df/dt``; ``u_new = u + sum_i b_i k_i``, the
    error ``sum_i (b_i - b_embedded_i) k_i``, the dense output
    ``u(theta) = (1 - theta) u0 + theta (u1 + (1 - theta) (K1 + theta (K2 + theta K3 ...)))``
    with ``K_j = sum_i H[j][i] k_i``. The check maps the coefficients back to the
    original (alpha, gamma) form and verifies the stage times and time-derivative
    weights, every order condition of the solution (up to `order`), of the embedded
    solution (up to `embedded_order`) and of the interpolant (up to `dense_order`).

    Parameters
    ----------
    gamma : float
    c, d, b, b_embedded : sequences of s floats
    a, C : rows of the strictly lower triangular matrices (row i has i entries)
    H : rows of the interpolant, s entries each
    order, embedded_order, dense_order : int
    """

    gamma: float
    c: tuple
    d: tuple
    a: tuple
    C: tuple
    b: tuple
    b_embedded: tuple
    H: tuple
    order: int
    embedded_order: int
    dense_order: int

    def __post_init__(self):
        s = len(self.c)
        a, C = _lower_rows(self.a, s, "a"), _lower_rows(self.C, s, "C")
        c, d, b, bh = (np.asarray(v, dtype=np.float64) for v in
                       (self.c, self.d, self.b, self.b_embedded))
        H = np.asarray(self.H, dtype=np.float64)
        g = float(self.gamma)
        if not (d.shape == b.shape == bh.shape == (s,) and H.ndim == 2 and H.shape[1] == s):
            raise ValueError(f"RosenbrockTableau: `d`, `b`, `b_embedded` need {s} entries and "
                             f"`H` {s} columns")
        # Back to the original form: Gamma (with gamma on its diagonal) and alpha.
        Gam = np.linalg.inv(np.eye(s) / g - C)
        alpha = a @ Gam
        beta = alpha + Gam
        _require(np.abs(alpha.sum(1) - c).max() < 1e-10, "c != row sums of alpha")
        _require(np.abs(Gam.sum(1) - d).max() < 1e-10, "d != row sums of Gamma")
        _check_order("solution", b @ Gam, alpha, beta, self.order)
        _check_order("embedded", bh @ Gam, alpha, beta, self.embedded_order)
        for th in (0.2, 0.5, 0.9):
            # the interpolant's weights at theta, as in `kernels.ros.ros_interp`
            w = th * b + th * (1 - th) * sum(th ** j * H[j] for j in range(H.shape[0]))
            _check_order("dense output", w @ Gam, alpha, beta, self.dense_order, th)
        object.__setattr__(self, "_engine", RosTableau(
            a.ravel().copy(), C.ravel().copy(), c, d, b, b - bh, H.ravel().copy(), g,
            self.embedded_order))

    @property
    def n_stages(self):
        return len(self.c)

    @property
    def n_dense(self):
        """Rows ``K_j`` of the interpolant."""
        return len(self.H)

    def engine(self):
        """The tableau as the compiled loops take it (`kernels.structs.RosTableau`)."""
        return self._engine


def _check_order(what, weights, alpha, beta, order, theta=1.0):
    """``sum_i weights_i Phi_i(t) = theta^|t| / density(t)`` for every tree up to `order`."""
    for q in range(1, order + 1):
        for t in _trees(q):
            res = weights @ _phi(t, alpha, beta) - theta ** q / _density(t)
            _require(abs(res) < 1e-10, f"{what} fails an order-{q} condition "
                                            f"(residual {res:.2e})")


def _require(ok, msg):
    if not ok:
        raise ValueError(f"RosenbrockTableau: inconsistent method coefficients: {msg}")


@functools.cache
def _trees(order):
    """Rooted trees with `order` vertices, each a sorted tuple of its subtrees."""
    if order == 1:
        return [()]
    found = set()
    for first in range(1, order):
        for sub in _trees(first):
            for rest in _forests(order - 1 - first):
                found.add(tuple(sorted((sub, *rest))))
    return sorted(found)


def _forests(order):
    if order == 0:
        return [()]
    out = []
    for first in range(1, order + 1):
        for sub in _trees(first):
            out += [(sub, *rest) for rest in _forests(order - first)]
    return out


def _density(t):
    return (1 + sum(_size(u) for u in t)) * math.prod(_density(u) for u in t)


def _size(t):
    return 1 + sum(_size(u) for u in t)


def _phi(t, alpha, beta):
    """Elementary weights of a Rosenbrock method (Hairer & Wanner II, IV.7).

    A vertex with one child contributes ``beta`` (the J terms join in), a
    vertex with several children the product of ``alpha`` terms.
    """
    if not t:
        return np.ones(alpha.shape[0])
    if len(t) == 1:
        return beta @ _phi(t[0], alpha, beta)
    return math.prod(alpha @ _phi(u, alpha, beta) for u in t)


# ---------------------------------------------------------------- Rodas5

_A6 = (-14.09640773051259, 6.925207756232704, -41.47510893210728, 2.343771018586405,
       24.13215229196062)

RODAS5 = RosenbrockTableau(
    # G. Di Marzo, "RODAS5(4) -- Methodes de Rosenbrock d'ordre 5(4) adaptees aux problemes
    # differentiels-algebriques", Master's thesis, Universite de Geneve, 1993; coefficients
    # (including the interpolation coefficients H) as tabulated in OrdinaryDiffEq.jl,
    # ``rosenbrock_tableaus.jl`` (``Rodas5Tableau``; MIT licence).
    gamma=0.19,
    c=(0.0, 0.38, 0.3878509998321533, 0.4839718937873840, 0.4570477008819580, 1.0, 1.0, 1.0),
    d=(0.19, -0.1823079225333714636, -0.319231832186874912, 0.3449828624725343,
         -0.377417564392089818, 0.0, 0.0, 0.0),
    a=(
        (),
        (2.0,),
        (3.040894194418781, 1.041747909077569),
        (2.576417536461461, 1.622083060776640, -0.9089668560264532),
        (2.760842080225597, 1.446624659844071, -0.3036980084553738, 0.2877498600325443),
        _A6,
        (*_A6, 1.0),  # stages 7 and 8 continue from the stage-6 input: stiffly accurate
        (*_A6, 1.0, 1.0),
    ),
    C=(
        (),
        (-10.31323885133993,),
        (-21.04823117650003, -7.234992135176716),
        (32.22751541853323, -4.943732386540191, 19.44922031041879),
        (-20.69865579590063, -8.816374604402768, 1.260436877740897, -0.7495647613787146),
        (-46.22004352711257, -17.49534862857472, -289.6389582892057, 93.60855400400906,
         318.3822534212147),
        (34.20013733472935, -14.15535402717690, 57.82335640988400, 25.83362985412365,
         1.408950972071624, -6.551835421242162),
        (42.57076742291101, -13.80770672017997, 93.98938432427124, 18.77919633714503,
         -31.58359187223370, -6.685968952921985, -5.810979938412932),
    ),
    b=(*_A6, 1.0, 1.0, 1.0),  # u_new = (input of stage 8) + k_8
    b_embedded=(*_A6, 1.0, 1.0, 0.0),  # the input of stage 8: error = k_8
    H=(
        (27.354592673333357, -6.925207756232857, 26.40037733258859, 0.5635230501052979,
         -4.699151156849391, -1.6008677469422725, -1.5306074446748028, -1.3929872940716344),
        (44.19024239501722, 1.3677947663381929e-13, 202.93261852171622, -35.5669339789154,
         -181.91095152160645, 3.4116351403665033, 2.5793540257308067, 2.2435122582734066),
        (-44.0988150021747, -5.755396159656812e-13, -181.26175034586677, 56.99302194811676,
         183.21182741427398, -7.480257918273637, -5.792426076169686, -5.32503859794143),
    ),
    order=5, embedded_order=4, dense_order=4,
)
