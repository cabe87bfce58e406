"""PyMC step methods built on the model layer and the pure kernels."""

from pymc_bigdata.step_methods.austerity import AusterityMH
from pymc_bigdata.step_methods.austerity_gibbs import AusterityGibbs
from pymc_bigdata.step_methods.base import Preconditioner, SubsamplingStep
from pymc_bigdata.step_methods.ewsg import EWSG
from pymc_bigdata.step_methods.hmcecs import HMCECS
from pymc_bigdata.step_methods.sbps import SBPS, pSBPS
from pymc_bigdata.step_methods.sghmc import SGHMC
from pymc_bigdata.step_methods.sgld import SGLD

__all__ = [
    "AusterityGibbs",
    "AusterityMH",
    "EWSG",
    "HMCECS",
    "SBPS",
    "SGHMC",
    "SGLD",
    "Preconditioner",
    "SubsamplingStep",
    "pSBPS",
]
