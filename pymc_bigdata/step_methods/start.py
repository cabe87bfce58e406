"""Where a step starts: the Laplace fit at the MAP (or, where the MAP search found no usable
mode, a fallback at the model's initial point), the control variates' anchor there, and the
census stratum of rows that every minibatch includes."""

from __future__ import annotations

import warnings

import numpy as np

from pymc_bigdata.errors import ModeWarning
from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.laplace import symmetrised
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.bulk_start import bulk_start
from pymc_bigdata.step_methods.held import Configuration
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = [
    "CENSUS_DIRECTIONS",
    "CENSUS_FACTOR",
    "anchor_and_census",
    "anchored_at_centre",
    "census_directions",
    "census_rows",
    "chain_start",
    "starting_fit",
]

#: rows whose influence (control-variate residual size) exceeds this multiple of the mean
#: are a census stratum, included in every minibatch with weight 1
CENSUS_FACTOR = 20.0

#: random displacements used to measure row influence
CENSUS_DIRECTIONS = 4


#: the control-variate order each ``control_variates`` setting starts at (``"auto"``: second
#: order where the dense full-data Hessian is known, else first)
_START_ORDER = {"none": 0, "first": 1, "second": 2}


def starting_fit(
    layer: MinibatchModel,
    start: np.ndarray | None,
    kind: str,
    name: str,
    cv_mode: str,
    anchor_at_centre: bool = True,
) -> Configuration:
    """The Laplace fit at the (cached) MAP from ``start``, the anchor there (None with
    ``cv_mode="none"``) and the starting control-variate order; where the layer's bulk is
    read and the MAP is far from it, the Gaussian and the anchor at the bulk instead
    (:mod:`.bulk_start`); else, where the MAP is no usable mode, a diagonal fit and an anchor
    at the model's initial point, with a ``ModeWarning``.
    Without ``anchor_at_centre`` the anchor may stay where the MAP search read its sums
    (:func:`anchored_at_centre`; the step's set-up moves it in the census's pass)."""
    fit = layer.map_estimate(start)
    at_bulk = bulk_start(layer, fit, kind)
    problem = None if at_bulk is not None else fit.problem
    if at_bulk is not None:
        laplace, anchor = at_bulk
    elif fit.problem is None:
        laplace = Preconditioner.from_precision(fit.theta, fit.hessian, kind)
        anchor = layer.map_anchor()
    else:
        center = layer.initial_theta
        anchor, precision = fallback_anchor(layer, center)
        _warn_no_mode(name, fit.problem)
        laplace = Preconditioner.from_precision(center, precision, "diag")
    config = Configuration(laplace, anchor if cv_mode != "none" else None, 0, problem)
    if cv_mode == "second" and not config.has_curvature:
        raise ValueError(
            "control_variates='second' needs the dense full-data Hessian, which is not "
            f"computed for d = {layer.dim} parameters; use 'first' or 'auto'."
        )
    order = _START_ORDER.get(cv_mode, 2 if config.has_curvature else 1)
    config = config._replace(cv_order=order)
    return anchored_at_centre(layer, config) if anchor_at_centre else config


def anchored_at_centre(layer: MinibatchModel, config: Configuration) -> Configuration:
    """``config`` with its anchor at the Laplace fit's centre: where the MAP search took its
    last Newton step without a pass (:attr:`~pymc_bigdata.model.laplace.MapResult.sums_point`),
    one gradient pass there, the Hessian kept where it was read."""
    anchor = config.anchor
    if anchor is None or np.array_equal(anchor.theta, config.laplace.center):
        return config
    return config._replace(anchor=layer.anchor_at(config.laplace.center, curvature_from=anchor))


def _warn_no_mode(name: str, problem: str) -> None:
    warnings.warn(
        f"{name}: the MAP search did not find a usable mode: {problem}. The chains start "
        "from the model's initial point with a diagonal preconditioner from the curvature "
        "there, and tuning re-centres the control variates and re-estimates the "
        "preconditioner from the draws. Use more tuning draws, and prefer a non-centred "
        "parameterisation for hierarchical models (a = mu + tau * z, z ~ Normal(0, 1)).",
        ModeWarning,
        stacklevel=5,
    )


def fallback_anchor(layer: MinibatchModel, center: np.ndarray) -> tuple[Anchor, np.ndarray]:
    """Anchor and a positive diagonal precision at ``center`` (the initial point)."""
    if layer.dim <= DENSE_HESSIAN_MAX_DIM:  # the Hessian's diagonal, kept for second order
        loglik_hess = layer.full_loglik_hessian(center)
        loglik_hess = symmetrised(loglik_hess)
        diag = -np.diag(loglik_hess + layer.prior_hessian(center))
        anchor = layer.anchor_at(
            center, Anchor(center, 0.0, np.zeros(layer.dim), center, loglik_hess)
        )
    else:
        diag = -layer.full_loglik_hessian_diagonal(center)
        anchor = layer.anchor_at(center)
    diag = np.abs(diag)
    floor = 1e-8 * max(float(diag.max()), 1.0)
    return anchor, np.maximum(diag, floor)


def anchor_and_census(
    layer: MinibatchModel, config: Configuration, enabled: bool, batch_size: int
) -> tuple[Configuration, np.ndarray]:
    """The configuration with its anchor at the Laplace fit's centre, and the indices of the
    census stratum (:func:`census_rows`; empty when disabled, without control variates, when
    a minibatch is all rows, or when no row stands out), from at most one pass.

    Where the MAP search took its last Newton step without a pass
    (:attr:`~pymc_bigdata.model.laplace.MapResult.sums_point`), the fit's anchor sits where
    the full-data sums were read, up to 2 posterior sds from the mode (10^8 rows, d = 10:
    1.05), and the chains' tuning then moved it (a pass per chain). It moves to the fit's
    centre here, in the census's pass, keeping the Hessian where it was read: the
    second-order correction is exact with a Hessian taken elsewhere. Last, the rows are
    checked for NaN and infinities (:meth:`~pymc_bigdata.rows.RowSource.check_finite`: no
    pass where these passes have read every row).
    """
    config, census = _anchor_and_census(layer, config, enabled, batch_size)
    layer.rows.check_finite()
    return config, census


def _anchor_and_census(
    layer: MinibatchModel, config: Configuration, enabled: bool, batch_size: int
) -> tuple[Configuration, np.ndarray]:
    anchor = config.anchor
    move = anchor is not None and not np.array_equal(anchor.theta, config.laplace.center)
    if not (enabled and batch_size < layer.n_rows and anchor is not None):
        return anchored_at_centre(layer, config), np.empty(0, dtype=np.int64)
    if not move:
        return config, census_rows(layer, config.laplace, anchor.theta, batch_size)
    directions = census_directions(layer, config.laplace)
    with np.errstate(all="ignore"):
        anchor, rows = layer.anchor_with_census(
            config.laplace.center, anchor, directions, CENSUS_FACTOR, _census_cap(layer, batch_size)
        )
    return config._replace(anchor=anchor), rows


def chain_start(
    precond: Preconditioner,
    laplace: Preconditioner,
    theta0: np.ndarray,
    rng: np.random.Generator,
    at_fit: bool,
) -> np.ndarray:
    """Where a chain starts in ``z``: with ``at_fit``, a draw of the Laplace fit (``z ~
    N(0, I)``; with the identity preconditioner ``z = theta - c``, scaled by the Laplace
    sds), else PyMC's initial point ``theta0``."""
    if not at_fit:
        return precond.z(theta0)
    draw = rng.standard_normal(len(theta0))
    if precond.kind == "identity":
        draw = draw * laplace.laplace_sd()
    return draw


def census_directions(layer: MinibatchModel, laplace: Preconditioner) -> list[np.ndarray]:
    """``CENSUS_DIRECTIONS`` typical displacements of the Laplace fit, along which
    :func:`census_rows` measures each row's control-variate residual."""
    rng = np.random.default_rng(20260611)  # set-up, not sampling: the same for every chain
    return [
        laplace.theta(rng.standard_normal(layer.dim)) - laplace.center
        for _ in range(CENSUS_DIRECTIONS)
    ]


def census_rows(
    layer: MinibatchModel, laplace: Preconditioner, anchor_theta: np.ndarray, batch_size: int
) -> np.ndarray:
    """Rows whose control-variate residuals move ``CENSUS_FACTOR`` times more than the mean
    along ``CENSUS_DIRECTIONS`` typical displacements of the Laplace fit (e.g. the rows of a
    rare feature or a tiny group); at most ``batch_size // 2`` and ``N - batch_size``."""
    directions = census_directions(layer, laplace)
    with np.errstate(all="ignore"):
        return layer.influential_rows(
            anchor_theta, directions, CENSUS_FACTOR, _census_cap(layer, batch_size)
        )


def _census_cap(layer: MinibatchModel, batch_size: int) -> int:
    return min(batch_size // 2, layer.n_rows - batch_size)  # the rest must fill a minibatch
