"""`sciml.nlme`: nonlinear mixed-effects population models (FO, FOCE, FOCE-I, Laplace,
SAEM).

A population model is a `sciml.Model` (dynamics, observables, doses from
event tables) with an individual-parameter function of typical values
(theta), random effects (eta ~ N(0, omega)) and covariates, and residual
error models per observable. `NLME.fit` estimates theta, omega and sigma by
the chosen approximation of the marginal likelihood and returns an
`NLMEFit` (estimates, empirical Bayes estimates, standard errors,
diagnostics table, goodness-of-fit plots).
"""

from .errors import Additive, Combined, Proportional
from .nlme import NLME
from .results import NLMEFit
from .saem import SAEM

__all__ = ["NLME", "NLMEFit", "SAEM", "Additive", "Proportional", "Combined"]
