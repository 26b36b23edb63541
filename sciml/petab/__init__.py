"""sciml.petab: PEtab SciML problems (SBML model, PEtab v2 tables, networks in the PEtab
network YAML with HDF5 arrays) as `sciml` models, with likelihoods, exact gradients and
multistart fits.

>>> import sciml.petab
>>> problem = sciml.petab.load("petab/problem.yaml")
>>> llh, g = problem.llh_and_grad(problem.nominal)

Needs the ``petab`` extra (python-libsbml, petab, h5py, pyyaml, pandas); ``import sciml``
does not import this package.
"""

from .errors import PetabError
from .problem import PetabProblem, load

__all__ = ["load", "PetabProblem", "PetabError"]
