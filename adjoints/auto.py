"""The default method: chosen from the solver and the sizes of the problem."""

from .continuous import GaussAdjoint, InterpolatingAdjoint
from .discrete import DiscreteAdjoint
from .forward import ForwardSensitivity

#: at most this many parameters -> forward sensitivities
FORWARD_MAX_PARAMS = 16
#: at most this many states -> the discrete adjoint (its memory: steps x stages x states)
DISCRETE_MAX_STATES = 64
#: ... and, with a stiff solver, at most this many states for forward sensitivities
FORWARD_MAX_STIFF_STATES = 64


def default_sensealg(model, solver=None):
    """The method `sciml.loss_and_grad` uses when none is given.

    Rule, first match:

    1. a stiff one-step solver (`Rodas5`), at most ``DISCRETE_MAX_STATES`` (64)
       states and the model's second-order ``hvp`` kernel -> `DiscreteAdjoint`:
       each stored step recomputed and reversed, one transposed solve a stage,
       on the forward's own steps. An adjoint integrated backward must resolve
       again the fast transients each observation's jump of lambda excites
       (Brannmark_JBC2010: 10,300 backward steps), and forward sensitivities
       take n Hessian-vector products a stage. On the 30 Benchmark-Models-PEtab
       models of this size it was faster than the former default (forward
       sensitivities up to 16 parameters, `GaussAdjoint` beyond) on 27, median
       1.5x (Beer 29 ms against 92 forward, Brannmark 15 against 43 Gauss,
       Sneyd 8.8 against 30), slower on Laske (96 ms against 54 Gauss) and
       Rahman (0.83 against 0.69); its gradients within 5e-6 of finite
       differences;
    2. at most ``FORWARD_MAX_PARAMS`` (16) parameters, and for a stiff solver
       (`BDF`, whose steps are not reversed) at most ``FORWARD_MAX_STIFF_STATES``
       (64) states -> `ForwardSensitivity`: n x n_params extra states cost less
       than a backward pass (mechanistic PK/PD models); a large stiff system is
       left to an adjoint, since the augmented system's Newton solves and its
       dense Jacobian-sensitivity products grow with n^2 x n_params;
    3. a stiff solver -> `GaussAdjoint` (with `BDF`, `InterpolatingAdjoint`: the
       quadrature needs a one-step method's stages), whose backward solve is
       stiff too, on the forward's linear solves (sparse for a large model),
       and controls the error of lambda alone;
    4. at most ``DISCRETE_MAX_STATES`` (64) states -> `DiscreteAdjoint`: one
       vector-Jacobian product per forward stage and no backward error
       control, the fastest here on small UDEs and neural ODEs (4x faster
       than the interpolating adjoint on the spiral benchmark), and its
       gradient is exactly that of the loss being minimised, which line
       searches like; the stored steps are small at these sizes;
    5. otherwise `GaussAdjoint`: memory of the forward steps only, backward
       error control on the n adjoint states however many weights there are.
    """
    stiff = solver is not None and solver.stiff
    small = model.n_states <= DISCRETE_MAX_STATES
    ok = getattr(solver, "sensitivities", True)
    second_order = not stiff or model.has_kernel("hvp")
    if stiff and small and second_order and (ok is True or "DiscreteAdjoint" in ok):
        return DiscreteAdjoint()
    if model.n_params <= FORWARD_MAX_PARAMS and second_order and (
            not stiff or model.n_states <= FORWARD_MAX_STIFF_STATES):
        return ForwardSensitivity()
    if stiff:
        return GaussAdjoint() if ok is True or "GaussAdjoint" in ok else InterpolatingAdjoint()
    if small:
        return DiscreteAdjoint()
    return GaussAdjoint()
