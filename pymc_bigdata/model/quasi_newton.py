"""Quasi-Newton for the MAP search: L-BFGS-B on minus the log posterior, estimated from a
subsample (scaled by N/n) or read from the full data, with non-finite values as walls."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import scipy.optimize
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.model.compiled import CompiledModel
from pymc_bigdata.model.passes import FullDataPasses

__all__ = ["full_negative_logp", "lbfgs", "scaled_negative_logp"]


def scaled_negative_logp(
    compiled: CompiledModel, rows: list[np.ndarray], n_rows: int
) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """Minus the log posterior estimated from ``rows`` (scaled by N/n), and its gradient."""
    scale = n_rows / len(rows[0])

    def negative(theta):
        lp, g = compiled.loglik_grad(theta, rows)
        plp, pg = compiled.prior_logp_grad(theta)
        return -(plp + scale * lp), -(pg + scale * g)

    return negative


def full_negative_logp(passes: FullDataPasses) -> Callable[[np.ndarray], tuple]:
    """Minus the full-data log posterior and its gradient."""

    def negative(theta: np.ndarray) -> tuple[float, np.ndarray]:
        lp, g = passes.full_logp_grad(theta)
        return -lp, -g

    return negative


def lbfgs(
    negative_logp: Callable[[np.ndarray], tuple[float, np.ndarray]],
    theta: np.ndarray,
    maxiter: int,
    n_rows: int,
    ftol: float | None = None,
) -> np.ndarray:
    """L-BFGS-B on ``negative_logp(theta) -> (value, grad)``; non-finite values are walls;
    ``ftol``: scipy's relative-reduction rule (None: scipy's default)."""

    def guarded(x):
        try:
            value, g = negative_logp(x)
        except ParameterValueError:  # a parameter left its support (e.g. a scale underflowed)
            return np.inf, np.zeros_like(x)
        if not np.isfinite(value) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)
        return value, g

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return scipy.optimize.minimize(
            guarded,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": maxiter, "gtol": 1e-9 * n_rows}
            | ({} if ftol is None else {"ftol": ftol}),
        ).x
