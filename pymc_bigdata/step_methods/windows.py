"""The tuning windows' judgements: is the Laplace fit still where the chain is, has the chain
settled, what covariance the next preconditioner takes, and when the anchor moves.

Pure functions of a window's draws (:class:`~pymc_bigdata.adaptation.RunningMoments`) and the
current fits; the step (``SubsamplingStep._end_window``) acts on their answers.
"""

from __future__ import annotations

import math

import numpy as np

from pymc_bigdata.adaptation import RunningMoments, blend_covariance, rescale_laplace
from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.laplace import posterior_precision, symmetrised
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = [
    "BULK_CURVATURE_FLOOR",
    "DENSE_HESSIAN_MAX_DIM",
    "MIN_TRAVEL",
    "MODE_OUTSIDE_BULK_SD",
    "RECENTRE_SD",
    "RECENTRE_SE",
    "SETTLED_VIRIAL",
    "bulk_precision",
    "diagonal",
    "mode_distance",
    "mode_outside_bulk",
    "recentre_wanted",
    "window_covariance",
    "window_settled",
]

#: the preconditioner's scales are re-estimated only when one draw spans at least this much
#: dynamics time (step size x inner steps; the defaults give 2-3): a window of more
#: correlated draws underestimates the posterior's spread
MIN_TRAVEL = 1.0

#: the anchor moves to a window's mean only when that is this many sds from it (one
#: full-data pass saved per window when the MAP already sits at the posterior mean) and
#: more than ``RECENTRE_SE`` standard errors of the window mean (``sd sqrt(2 / draws)``:
#: tuned chains keep an ESS of at least half their draws), so that a short window's noisy
#: mean does not move it
RECENTRE_SD = 0.2
RECENTRE_SE = 3.0

#: a MAP this many of the draws' sds from their mean (any coordinate) is no longer trusted
#: for the preconditioner's shape or the step size's curvature (see :func:`mode_outside_bulk`;
#: in units of the larger of the window's and the Laplace sd)
MODE_OUTSIDE_BULK_SD = 3.0

#: when it is, the Laplace fit is re-done at the window's mean (the step's
#: ``_refit_at_bulk``) up to ``DENSE_HESSIAN_MAX_DIM`` parameters (a dense full-data
#: Hessian); the curvature's eigenvalues, in units of the window's marginal sds, are raised to
#: at least this (an sd at most 3x the draws')
BULK_CURVATURE_FLOOR = 1.0 / 9.0
#: ... and only when the window's mean virial is within this of 1 (a settled chain)
SETTLED_VIRIAL = 0.5


def diagonal(cov: np.ndarray) -> np.ndarray:
    """The variances of a covariance matrix, or the vector itself (diagonal fits)."""
    return np.diag(cov) if cov.ndim == 2 else cov


def mode_distance(moments: RunningMoments, laplace: Preconditioner) -> np.ndarray:
    """``|window mean - MAP|`` per coordinate in sds, the larger of the window's and the
    Laplace one (correlated draws understate the window's spread); non-finite as 0."""
    window_var = diagonal(moments.covariance())
    sd = np.sqrt(np.maximum(window_var, diagonal(laplace.covariance())))
    with np.errstate(divide="ignore", invalid="ignore"):
        distance = np.abs(moments.mean - laplace.center) / sd
    return np.where(np.isfinite(distance), distance, 0.0)


def mode_outside_bulk(moments: RunningMoments, laplace: Preconditioner) -> bool:
    """Whether the MAP lies more than ``MODE_OUTSIDE_BULK_SD`` sds from the window's mean in
    some coordinate (:func:`mode_distance`): the Laplace fit then describes a region the chain
    does not visit (e.g. a hierarchical scale whose joint mode is far from its marginal
    bulk), and neither its shape nor its curvature should set the step."""
    return bool(np.any(mode_distance(moments, laplace) > MODE_OUTSIDE_BULK_SD))


def window_settled(virials: list[float]) -> bool:
    """Whether a window's draws look stationary: their mean virial (1 at equilibrium, far
    above it for a chain still falling into the bulk) within ``SETTLED_VIRIAL``; a sampler
    that records no virial is not judged."""
    finite = [v for v in virials if math.isfinite(v)]
    return not finite or abs(float(np.mean(finite)) - 1.0) <= SETTLED_VIRIAL


def bulk_precision(
    loglik_hessian: np.ndarray, prior_hessian: np.ndarray, moments: RunningMoments
) -> np.ndarray | None:
    """The posterior precision at the window's mean from the full-data log-likelihood
    Hessian (symmetrised) and the prior's, its eigenvalues in units of the window's marginal
    sds raised to at least ``BULK_CURVATURE_FLOOR`` (non-positive ones included: an sd at
    most 3x the draws'); None when it or the window's variances are not usable."""
    with np.errstate(all="ignore"):
        precision = posterior_precision(loglik_hessian, prior_hessian)
    window_var = diagonal(moments.covariance())
    if not (np.all(np.isfinite(precision)) and np.all(window_var > 0)):
        return None
    scale = np.sqrt(window_var)  # floor the curvature in the draws' own units
    values, vectors = np.linalg.eigh(precision * np.outer(scale, scale))
    values = np.maximum(values, BULK_CURVATURE_FLOOR)
    precision = (vectors * values) @ vectors.T / np.outer(scale, scale)
    return symmetrised(precision)


def window_covariance(
    moments: RunningMoments,
    precond: Preconditioner,
    laplace: Preconditioner | None,
    decorrelated: bool,
) -> np.ndarray:
    """The next preconditioner's covariance: with a trusted Laplace fit (``laplace``), its
    shape rescaled to the window's spread (or kept, when the draws are too correlated to
    judge the scales); without one, the draws' own covariance."""
    if laplace is not None and not decorrelated:
        return precond.covariance()
    if laplace is not None:
        return rescale_laplace(laplace.covariance(), moments.covariance(), moments.count)
    return blend_covariance(moments.covariance(), moments.count, precond.covariance(), 1)


def recentre_wanted(moments: RunningMoments, anchor_theta: np.ndarray, cov: np.ndarray) -> bool:
    """Whether the anchor should move to the window's mean: more than ``RECENTRE_SD`` sds
    and ``RECENTRE_SE`` standard errors of the window mean away (in some coordinate)."""
    shift = np.abs(moments.mean - anchor_theta)
    threshold = max(RECENTRE_SD, RECENTRE_SE * math.sqrt(2.0 / moments.count))
    return bool(np.max(shift / np.sqrt(diagonal(cov))) > threshold)
