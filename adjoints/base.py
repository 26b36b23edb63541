"""What every sensitivity algorithm is: settings, a forward pass and a backward pass.

A method is used in two halves so that the loss sits between them:
``state = method.forward(job)`` solves the problem and returns the states at
the observation times (``state.u``); the caller evaluates its loss there and
turns dL/du at each observation into the rows of ``G``; then
``method.backward(job, state, G)`` returns the gradient of the loss with
respect to the flat parameters and dL/du0 (None when the method has already
carried initial values that depend on the parameters through itself).

Every method runs with every solver, explicit or Rosenbrock; ``needs`` names
the model kernels it calls beyond the solver's own.
"""

import numpy as np

from sciml._validate import optional_tolerance

from .primal import Job, SolveFailed, prepare_values, values

__all__ = ["SensitivityAlgorithm", "SolveFailed", "Job", "values", "prepare_values"]


class SensitivityAlgorithm:
    """Base of the methods. ``rtol``/``atol``: tolerances of the sensitivity solve
    (default: the forward solve's)."""

    #: True for a method that carries sensitivities forward with the state (across the
    #: pieces of a problem with changes or events, S is handed on as the next piece's
    #: initial sensitivities); False for one that runs backward (the adjoint jumps there)
    forward_mode = False

    def __init__(self, rtol=None, atol=None):
        cls = type(self).__name__
        self.rtol = optional_tolerance(rtol, "rtol", cls)
        self.atol = optional_tolerance(atol, "atol", cls)

    def needs(self, solver):
        """Model kernels the method calls with ``solver``, beyond the solver's own."""
        return ("vjp",)

    def check_solver(self, solver):
        ok = getattr(solver, "sensitivities", True)
        if ok is not True and type(self).__name__ not in ok:
            raise ValueError(f"{type(self).__name__}: sensitivities through {solver.name} are "
                             f"not available yet (with it: {', '.join(ok) or 'none'}); use "
                             "sciml.Rodas5() (stiff) or an explicit solver")
        if not solver.adaptive and type(self).__name__ != "DiscreteAdjoint":
            raise ValueError(f"{type(self).__name__} needs an adaptive solver; with a "
                             f"fixed-step {solver.name} use DiscreteAdjoint()")

    def check_model(self, model, solver):
        """A clear error when the model lacks a kernel the method needs."""
        if model.mass_matrix is not None:
            raise ValueError(f"{type(self).__name__}: sensitivities of a model with a mass "
                             "matrix (M du/dt = f) are not available yet")
        for k in self.needs(solver):
            if not model.has_kernel(k):
                raise ValueError(f"{type(self).__name__} with {solver.name} needs the model's "
                                 f"`{k}` kernel, which {model!r} does not have (a model from "
                                 "hand-written kernels has no second derivatives: use "
                                 "adjoints.GaussAdjoint() or InterpolatingAdjoint())")

    def _tols(self, job, n_err):
        """(rtol, atol (n_err,)) of the sensitivity solve."""
        rtol = self.rtol if self.rtol is not None else job.rtol
        atol = self.atol if self.atol is not None else float(np.min(job.atol))
        return rtol, np.full(n_err, atol)

    def lean(self, solver, model):
        """The method's one-call compiled gradient for a plain problem (no doses, u0 an
        array, `SSE` on states) solved by the explicit ``solver``, or None when it has
        none with these settings (the general `forward` / `backward` path runs).

        The entry is called ``entry(kern, tab, ctl, backward_control, args)`` with
        ``args = (u0, p, span, data, grad, stats)`` (`adjoints.kernels.backward`) and
        ``backward_control(n_err)`` the backward solve's `Control` for an error norm over
        ``n_err`` components; it returns ``(status, value)``. A method with such an entry
        says so here: `sciml.loss_and_grad` asks, it does not know the methods.
        """
        return None

    def lean_many(self, solver, model):
        """Like `lean`, for many plain problems of one model in one parallel compiled call:
        ``entry(kern, tab, ctl, U0, P, spans, data, offsets, grads, losses, status)``
        (`adjoints.kernels.backward.grad_discrete_many`), or None."""
        return None

    def forward(self, job):
        raise NotImplementedError

    def backward(self, job, state, G):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"
