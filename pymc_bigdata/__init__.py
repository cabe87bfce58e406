"""pymc-bigdata: subsampling MCMC step methods for PyMC models with many rows."""

from pymc_bigdata.data import Data
from pymc_bigdata.distributed import ChainFailedError, read_store, sample_dask
from pymc_bigdata.errors import (
    BiasWarning,
    DivergenceWarning,
    FullDataWarning,
    ModelNotSupportedError,
    ModeWarning,
    SharedRowsGone,
    StaleDataError,
)
from pymc_bigdata.loo import add_log_likelihood, loo_subsample_inputs, pointwise_log_likelihood
from pymc_bigdata.model import MapResult, MinibatchModel
from pymc_bigdata.model.layer_cache import clear_layer_cache
from pymc_bigdata.registry import prefer, register
from pymc_bigdata.rows import BlockIndexSampler, RowIndexSampler, RowSource
from pymc_bigdata.score_check import ScoreCheck, score_check
from pymc_bigdata.shared_rows import rows_travel_with_pickles
from pymc_bigdata.signs import sign_corrected_summary, sign_weights
from pymc_bigdata.step_methods import (
    EWSG,
    HMCECS,
    SBPS,
    SGHMC,
    SGLD,
    AusterityGibbs,
    AusterityMH,
    SubsamplingStep,
    pSBPS,
)

register()

__all__ = [
    "AusterityGibbs",
    "BlockIndexSampler",
    "ChainFailedError",
    "Data",
    "AusterityMH",
    "EWSG",
    "HMCECS",
    "SBPS",
    "SGHMC",
    "pSBPS",
    "SGLD",
    "SubsamplingStep",
    "BiasWarning",
    "DivergenceWarning",
    "FullDataWarning",
    "ModeWarning",
    "SharedRowsGone",
    "StaleDataError",
    "MapResult",
    "MinibatchModel",
    "ModelNotSupportedError",
    "RowIndexSampler",
    "RowSource",
    "ScoreCheck",
    "add_log_likelihood",
    "clear_layer_cache",
    "loo_subsample_inputs",
    "pointwise_log_likelihood",
    "prefer",
    "register",
    "read_store",
    "rows_travel_with_pickles",
    "sample_dask",
    "score_check",
    "sign_corrected_summary",
    "sign_weights",
]
