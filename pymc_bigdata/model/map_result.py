"""A MAP estimate with its curvature (:class:`MapResult`), and the one place the package forms
the posterior precision (:func:`posterior_precision`): ``-(H_loglik + H_prior)``
symmetrised, from the full-data log-likelihood Hessian and the prior's; :func:`symmetrised`
is the symmetric part of a Hessian computed by batched Hessian-vector products (equal to it
up to rounding). :func:`dense_diagnostics` and :func:`diagonal_diagnostics` say how far a
point is from a mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

__all__ = [
    "MAP_DECREMENT_TOLERANCE",
    "MIN_RELATIVE_CURVATURE",
    "MapResult",
    "dense_diagnostics",
    "diagonal_diagnostics",
    "posterior_precision",
    "symmetrised",
]

#: a MAP whose Newton decrement exceeds this (log-density units) is not a mode
MAP_DECREMENT_TOLERANCE = 1e-3

#: smallest eigenvalue of the Laplace precision relative to its largest for a usable mode
MIN_RELATIVE_CURVATURE = 1e-12


def symmetrised(matrix: np.ndarray) -> np.ndarray:
    """``(M + M^T) / 2``: the symmetric part of a square matrix."""
    return 0.5 * (matrix + matrix.T)


def posterior_precision(loglik_hessian: np.ndarray, prior_hessian: np.ndarray) -> np.ndarray:
    """The posterior precision ``P = -(H_loglik + H_prior)``, symmetrised: ``(P + P^T) / 2``.

    Parameters
    ----------
    loglik_hessian : ndarray, shape (d, d)
        Hessian of the (full-data, or scaled subsample) summed log-likelihood.
    prior_hessian : ndarray, shape (d, d)
        Hessian of the log prior at the same point.

    Returns
    -------
    ndarray, shape (d, d)
        The negative Hessian of the log posterior, exactly symmetric.
    """
    precision = -(loglik_hessian + prior_hessian)
    return 0.5 * (precision + precision.T)


@dataclass(frozen=True)
class MapResult:
    """A MAP estimate with the curvature of the log posterior there.

    Attributes
    ----------
    theta : ndarray, shape (d,)
        The maximiser of the log posterior (unconstrained space).
    logp : float
        The log posterior at ``theta`` (where ``sums_point`` is not ``theta``: at
        ``sums_point`` plus the rise Newton's quadratic model predicts, half the decrement).
    loglik_grad : ndarray, shape (d,)
        Full-data gradient of the summed log-likelihood at ``sums_point`` (the control-variate
        anchor).
    loglik : float
        Full-data summed log-likelihood at ``sums_point``.
    hessian : ndarray, shape (d, d) or (d,)
        Negative Hessian of the log posterior at ``hessian_point`` (the Laplace precision);
        only its diagonal (shape (d,), a stochastic estimate) when
        ``d > DENSE_HESSIAN_MAX_DIM``.
    n_evaluations : int
        Full-data passes the optimiser made.
    loglik_hessian : ndarray, shape (d, d), or None
        Full-data Hessian of the summed log-likelihood at ``hessian_point`` (the second-order
        control variates' curvature); None when ``d > DENSE_HESSIAN_MAX_DIM``.
    hessian_point : ndarray, shape (d,), or None
        Where ``loglik_hessian`` was computed: ``theta`` up to ``DENSE_PRECONDITIONER_DIM``
        parameters; beyond, the subsample optimum from which Newton started (one full-data
        Hessian instead of two; ``hessian`` is then the Laplace precision to that accuracy).
    newton_decrement : float
        ``g^T H^{-1} g`` at ``theta`` (twice the log-density gap to the quadratic model's
        mode); near 0 at a mode, ``inf`` when ``H`` is not positive definite. Where the
        search's last Newton step was taken without a pass (``sums_point`` is not ``theta``),
        the decrement :func:`predicted_decrement` expects there.
    min_curvature : float
        Smallest eigenvalue of ``H`` relative to its largest (diagonal: smallest entry ratio).
    sums_point : ndarray, shape (d,), or None
        Where ``loglik`` and ``loglik_grad`` were read: ``theta`` itself (None), or, where the
        exact search took its last Newton step without a pass to check it
        (``FINAL_STEP_DECREMENT``), the point that step started from. The control variates
        are anchored there, where the full-data sums are exact.
    """

    theta: np.ndarray
    logp: float
    loglik_grad: np.ndarray
    loglik: float
    hessian: np.ndarray
    n_evaluations: int
    loglik_hessian: np.ndarray | None = None
    hessian_point: np.ndarray | None = None
    newton_decrement: float = 0.0
    min_curvature: float = 1.0
    sums_point: np.ndarray | None = None

    @property
    def dense(self) -> bool:
        """Whether :attr:`hessian` is the dense matrix (not only its diagonal)."""
        return self.hessian.ndim == 2

    @property
    def problem(self) -> str | None:
        """Why this point is not a usable mode for a Laplace fit, or None if it is.

        A mode needs a positive definite curvature and a vanishing Newton step: the search
        stopped at most ``MAP_DECREMENT_TOLERANCE`` (in log density) from the quadratic
        model's maximum.  A centred hierarchical model whose density grows without bound as a
        scale parameter goes to 0 fails the first or the second test.
        """
        if not np.isfinite(self.logp):
            return "the log posterior is not finite there"
        if not self.min_curvature > MIN_RELATIVE_CURVATURE:
            return (
                "the log posterior's Hessian is not negative definite there (relative "
                f"smallest curvature {self.min_curvature:.3g})"
            )
        if not self.newton_decrement <= MAP_DECREMENT_TOLERANCE:
            return (
                "the search did not reach a stationary point (Newton decrement "
                f"{self.newton_decrement:.3g}): the density may grow without bound towards a "
                "boundary, e.g. a scale parameter going to 0 in a centred hierarchical model"
            )
        return None


def dense_diagnostics(precision: np.ndarray, grad_lp: np.ndarray) -> tuple[float, float]:
    """Newton decrement ``g^T P^{-1} g`` and relative smallest eigenvalue of ``P``."""
    eig = np.linalg.eigvalsh(precision)
    if not np.all(np.isfinite(eig)) or eig[-1] <= 0:
        return math.inf, -math.inf
    min_curvature = float(eig[0] / eig[-1])
    if min_curvature <= MIN_RELATIVE_CURVATURE:
        return math.inf, min_curvature
    try:
        factor = scipy.linalg.cho_factor(precision)
    except np.linalg.LinAlgError:
        return math.inf, min_curvature
    return float(grad_lp @ scipy.linalg.cho_solve(factor, grad_lp)), min_curvature


def diagonal_diagnostics(precision_diag: np.ndarray, grad_lp: np.ndarray) -> tuple[float, float]:
    """The diagonal versions of :func:`dense_diagnostics`."""
    if not np.all(np.isfinite(precision_diag)) or precision_diag.max() <= 0:
        return math.inf, -math.inf
    min_curvature = float(precision_diag.min() / precision_diag.max())
    if min_curvature <= MIN_RELATIVE_CURVATURE:
        return math.inf, min_curvature
    return float(np.sum(grad_lp**2 / precision_diag)), min_curvature
