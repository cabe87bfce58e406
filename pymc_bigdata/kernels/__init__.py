"""Pure sampler kernels: numpy arrays and an explicit generator in, new state and info out.

Kernels work in *preconditioned* coordinates ``z`` (the adapters map ``theta = theta* + L z``)
and take a gradient callback ``grad_log_density(z) -> ndarray`` that returns a (stochastic)
estimate of the gradient of the log posterior at ``z``.
"""

from pymc_bigdata.kernels.ewsg import EWSGInfo, EWSGState, ewsg_steps, index_chain
from pymc_bigdata.kernels.sghmc import SGHMCInfo, SGHMCState, baoab_steps, sghmc_steps
from pymc_bigdata.kernels.sgld import SGLDInfo, sgld_steps

__all__ = [
    "EWSGInfo",
    "EWSGState",
    "ewsg_steps",
    "index_chain",
    "SGHMCInfo",
    "SGHMCState",
    "SGLDInfo",
    "baoab_steps",
    "sghmc_steps",
    "sgld_steps",
]
