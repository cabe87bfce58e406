"""Start from the bulk: the chains' start, the anchor and the preconditioner from a Gaussian
at the posterior's bulk where the layer's MAP is far from it.

A layer whose group fits read where the bulk is (:class:`~pymc_bigdata.model.bulk_fit.
BulkReading`, set by :func:`~pymc_bigdata.step_methods.coordinates.sampling_layer`) and
whose MAP lies more than ``BULK_START_SDS`` marginal sds from it in some hyperparameter (or
whose MAP search found no usable mode) starts from
:func:`~pymc_bigdata.model.bulk_fit.bulk_precision`'s Gaussian there instead of the MAP's
Laplace fit: the chains start from its draws, the control variates' anchor is its centre
(with the full-data Hessian there) and the preconditioner is its covariance; the tuning
windows refine them as from a Laplace fit. Costs one full-data Hessian and one gradient
pass, only where it is used.

Beyond the dense Hessian (d > ``DENSE_HESSIAN_MAX_DIM``, e.g. crossed effects of thousands of
groups) the Gaussian is diagonal (:func:`diagonal_bulk_precision`), and it is used only where
the MAP search found no usable mode, in place of the fallback at the model's initial point:
where a MAP is found there, the reading cannot be compared with it (a centred model's reading
is taken at its own MAP, where the scales collapse, and was 54 marginal sds off on the
crossed ratings).
"""

from __future__ import annotations

import numpy as np

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM, PRIOR_DIAGONAL_MAX_DIM
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.bulk_fit import BulkReading, bulk_precision
from pymc_bigdata.model.laplace import MapResult
from pymc_bigdata.model.map_result import posterior_precision
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.preconditioner import Preconditioner
from pymc_bigdata.step_methods.windows import MODE_OUTSIDE_BULK_SD

__all__ = ["BULK_START_SDS", "bulk_start", "diagonal_bulk_precision"]

#: a MAP further than this many marginal sds from the bulk in some hyperparameter is not
#: started from: the tuning windows' own test of a fit against the draws
#: (:func:`~pymc_bigdata.step_methods.windows.mode_outside_bulk`) would reject it
BULK_START_SDS = MODE_OUTSIDE_BULK_SD


def bulk_start(
    layer: MinibatchModel, fit: MapResult, kind: str
) -> tuple[Preconditioner, Anchor] | None:
    """The fit and the anchor at the bulk (the module docstring), or None where the layer
    has no reading, its MAP is a usable mode within ``BULK_START_SDS`` of the bulk (beyond
    ``DENSE_HESSIAN_MAX_DIM``: any usable mode), or the Gaussian cannot be built there."""
    reading = layer.bulk
    if reading is None:
        return None
    if layer.dim > DENSE_HESSIAN_MAX_DIM:
        return _diagonal_bulk_start(layer, fit, reading, kind)
    if fit.problem is None and reading.distance(fit.theta) <= BULK_START_SDS:
        return None
    point = reading.point
    with np.errstate(all="ignore"):
        loglik_hessian = layer.full_loglik_hessian(point)
        loglik_hessian = 0.5 * (loglik_hessian + loglik_hessian.T)
        precision = bulk_precision(
            posterior_precision(loglik_hessian, layer.prior_hessian(point)), reading
        )
    if precision is None:
        return None
    try:
        laplace = Preconditioner.from_precision(point, precision, kind)
    except (np.linalg.LinAlgError, ValueError):
        return None
    curvature = Anchor(point, 0.0, np.zeros(layer.dim), point, loglik_hessian)
    return laplace, layer.anchor_at(point, curvature_from=curvature)


def diagonal_bulk_precision(
    loglik_diagonal: np.ndarray, prior_diagonal: np.ndarray, reading: BulkReading
) -> np.ndarray | None:
    """The diagonal Gaussian's precision at ``reading.point``: minus the log density's
    curvature along each coordinate (the full-data log-likelihood's Hessian diagonal and the
    prior's), except along the hyperparameters, whose precision is their marginal one
    (``1 / var`` from ``S_h^-1``: the profile's curvature there is not the marginal's, as in
    :func:`~pymc_bigdata.model.bulk_fit.bulk_precision`); None where an entry is not finite
    and positive."""
    precision = -(np.asarray(loglik_diagonal, dtype=np.float64) + prior_diagonal)
    hyper_variance = np.diag(np.linalg.inv(reading.hyper_precision))
    precision[reading.hyper] = 1.0 / hyper_variance
    if not (np.all(np.isfinite(precision)) and np.all(precision > 0.0)):
        return None
    return precision


def _diagonal_bulk_start(
    layer: MinibatchModel, fit: MapResult, reading: BulkReading, kind: str
) -> tuple[Preconditioner, Anchor] | None:
    """The diagonal Gaussian at the bulk and a first-order anchor at its centre, where the
    MAP search found no usable mode (the module docstring); None elsewhere or where the
    Gaussian cannot be built. Costs ``DIAGONAL_PROBES`` Hessian-vector passes and one
    gradient pass."""
    if fit.problem is None:
        return None
    point = reading.point
    with np.errstate(all="ignore"):
        loglik_diagonal = layer.full_loglik_hessian_diagonal(point)
        prior = np.diag(layer.prior_hessian(point)) if layer.dim <= PRIOR_DIAGONAL_MAX_DIM else 0.0
        precision = diagonal_bulk_precision(loglik_diagonal, prior, reading)
    if precision is None:
        return None
    return Preconditioner.from_precision(point, precision, kind), layer.anchor_at(point)
