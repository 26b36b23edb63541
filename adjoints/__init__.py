"""adjoints: gradients of losses on ODE solutions, on the models' compiled vjp kernels.

Every method is a settings object passed as ``sensealg=`` to
`sciml.loss_and_grad` / `sciml.fit`:

- `InterpolatingAdjoint` - backward [lambda, mu], u from the forward dense output;
- `BacksolveAdjoint` - backward [u, lambda, mu] (O(1) memory; checkpointed by default);
- `GaussAdjoint` - backward lambda, mu by Gauss-Legendre quadrature per step;
- `QuadratureAdjoint` - backward lambda, mu by adaptive Gauss-Kronrod quadrature;
- `ForwardSensitivity` - forward sensitivity equations (few parameters);
- `DiscreteAdjoint` - reverse mode through the solver's steps (exact discrete gradient).

`default_sensealg` documents the automatic choice.

Solving one problem many times (a population model's subjects): `Job` holds a
problem's setting, `values(job)` solves it at its observation times
(`prepare_values(job)` returns such a solve with its system built once) and
``ForwardSensitivity().prepare(job, cols)`` returns a solve with sensitivities whose
system is built once; a failed solve raises `SolveFailed`.
"""

from .auto import default_sensealg
from .base import Job, SensitivityAlgorithm, SolveFailed, prepare_values, values
from .continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from .discrete import DiscreteAdjoint
from .forward import ForwardSensitivity

__all__ = [
    "SensitivityAlgorithm", "InterpolatingAdjoint", "BacksolveAdjoint", "GaussAdjoint",
    "QuadratureAdjoint", "ForwardSensitivity", "DiscreteAdjoint", "default_sensealg",
    "SolveFailed", "Job", "values", "prepare_values",
]
