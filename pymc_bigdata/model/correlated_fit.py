"""Where the bulk of a correlated group effect's covariance is, and what each group's rows say.

The matrix form of :func:`~pymc_bigdata.model.group_fit.fit_groups`, for a correlated
effect ``ab_j = mu + L z_j`` written either way (:mod:`pymc_bigdata.model.correlated_effects`). The
centring rule (:func:`~pymc_bigdata.model.correlated_reparam.choose_correlated_centredness`)
reads each group's information ``H_j = L' K_j L`` about ``z_j``; read at the model's MAP it
sees the MAP's ``L``, which the non-centred prior inflates (on 40 groups of 3 to 8 rows,
sds 0.4 and 0.3, the MAP's diagonal was several times the bulk's): every group then looked
data-rich, was sampled centred, and the chains met the centred form's funnel (SGHMC 1.05 sd
off). Here each group's rows are read as a Gaussian likelihood of ``ab_j``
(``-ab' K_j ab / 2 + eta_j' ab``: one Newton step from the point), the effects are integrated
out, and ``(mu, L)`` are put at the mode of their marginal posterior (empirical Bayes, exact
for a Gaussian likelihood), where ``H_j`` is read instead.

With ``Sigma = L L'`` and ``M_j = I + Sigma K_j``, group ``j``'s marginal log-likelihood of
``(mu, L)`` is, up to a constant,

    -log|M_j| / 2 + eta_j' M_j^-1 Sigma eta_j / 2 + eta_j' M_j^-1 mu - mu' K_j M_j^-1 mu / 2,

finite as ``L -> 0`` (no inverse of ``Sigma``) and 0 for a group without rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize

from pymc_bigdata.model.bulk_fit import finite_difference_hessian
from pymc_bigdata.model.correlated_effects import CorrelatedEffect
from pymc_bigdata.model.correlated_reparam import group_information

__all__ = ["CorrelatedFit", "correlated_bulk_point", "fit_correlated_groups", "marginal_loglik"]


class CorrelatedFit(NamedTuple):
    """What the rows say about each group's effects, and ``(mu, L)`` at the bulk."""

    #: ``K_j``, the rows' precision about ``ab_j``, shape (J, K, K)
    precision: np.ndarray
    #: ``eta_j = K_j ab_j + d loglik / d ab_j`` at the point read, shape (J, K)
    linear: np.ndarray
    #: the raveled point with ``mu`` and ``L``'s packed value at the marginal mode (``z``
    #: as read)
    point: np.ndarray
    #: indices of ``L``'s packed value and a free ``mu`` in :attr:`point`
    hyper: np.ndarray | None = None
    #: their marginal posterior's precision at the mode (finite differences; None where it
    #: is not positive definite or the mode not finite)
    hyper_precision: np.ndarray | None = None

    def information(self, effect: CorrelatedEffect) -> np.ndarray:
        """``H_j = L' K_j L`` at the fit's ``L``, shape (J, K, K)."""
        chol = effect.factor(self.point)
        return np.swapaxes(chol, -1, -2) @ self.precision @ chol


def marginal_loglik(
    precision: np.ndarray, linear: np.ndarray, loc: np.ndarray, chol: np.ndarray
) -> float:
    """The groups' summed marginal log-likelihood of ``(mu, L)`` (the module docstring):
    ``precision`` (J, K, K) and ``linear`` (J, K) the groups' Gaussian reading, ``loc`` (K,)
    and the lower-triangular ``chol`` (K, K)."""
    sigma = chol @ chol.T
    m = np.eye(chol.shape[-1]) + sigma @ precision  # (J, K, K)
    sign, log_det = np.linalg.slogdet(m)
    if np.any(sign <= 0):
        return -np.inf
    rhs = np.stack([linear @ sigma, np.broadcast_to(loc, linear.shape)], axis=-1)
    solved = np.linalg.solve(m, rhs)  # M^-1 Sigma eta_j, M^-1 mu
    by_sigma, by_loc = solved[..., 0], solved[..., 1]
    k_by_loc = np.einsum("jab,jb->ja", precision, by_loc)
    terms = (
        -0.5 * log_det
        + 0.5 * np.vecdot(linear, by_sigma)
        + np.vecdot(linear, by_loc)
        - 0.5 * (k_by_loc @ loc)
    )
    return float(np.sum(terms))


def fit_correlated_groups(
    effect: CorrelatedEffect,
    theta: np.ndarray,
    loglik_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    loglik_hvp: Callable[[np.ndarray, np.ndarray], np.ndarray],
    prior_logp: Callable[[np.ndarray], float],
) -> CorrelatedFit:
    """Each group's rows read at ``theta`` (the model's coordinates, e.g. its MAP) and ``(mu,
    L)`` at the mode of their marginal posterior: the groups' :func:`marginal_loglik` plus the
    model's log prior with ``mu`` and ``L``'s packed value moved and ``z`` held (its density
    does not move; transforms' Jacobians included, so the mode is in the value
    coordinates), and the marginal posterior's precision there (finite differences). Costs
    two full-data passes per row of ``z`` (:func:`group_information`) and one gradient, and
    prior evaluations. Where the mode is not finite the point's own ``(mu, L)`` are kept.
    """
    theta = np.asarray(theta, dtype=np.float64)
    chol = effect.factor(theta)
    inv_chol = np.linalg.inv(chol)
    blocks = group_information(effect, theta, loglik_hvp)  # about z_j, or ab_j if centred
    own = effect.matrix(theta).T  # (J, K): z_j or ab_j
    grad_own = effect.matrix(np.asarray(loglik_grad(theta)[1])).T
    if effect.centred:
        precision, effects, grad_effects = blocks, own, grad_own
    else:  # ab_j = mu + L z_j: K_j = L^-T H_j L^-1, d/d ab_j = L^-T d/d z_j
        precision = inv_chol.T @ blocks @ inv_chol
        effects = effect.loc(theta) + own @ chol.T
        grad_effects = grad_own @ inv_chol
    linear = np.nan_to_num(np.einsum("jab,jb->ja", precision, effects) + grad_effects)
    prior = _prior_of_loc_and_factor(effect, theta, prior_logp)
    free = [effect.scale_slice] + ([effect.loc_slice] if effect.loc_slice is not None else [])
    index = np.concatenate([np.arange(s.start, s.stop) for s in free])

    def moved(x: np.ndarray) -> np.ndarray:
        out = theta.copy()
        out[index] = x
        return out

    def neg_log_posterior(x: np.ndarray) -> float:
        point = moved(x)
        value = marginal_loglik(precision, linear, effect.loc(point), effect.factor(point))
        value += prior(point)
        return -value if np.isfinite(value) else np.inf

    with np.errstate(all="ignore"):
        best = minimize(
            neg_log_posterior,
            theta[index],
            method="Nelder-Mead",
            options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 4000},
        )
    if not np.isfinite(best.fun):
        return CorrelatedFit(precision, linear, theta.copy())
    with np.errstate(all="ignore"):
        hessian = finite_difference_hessian(neg_log_posterior, best.x)
    if not (np.all(np.isfinite(hessian)) and np.all(np.linalg.eigvalsh(hessian) > 0.0)):
        hessian = None
    return CorrelatedFit(precision, linear, moved(best.x), index, hessian)


def _prior_of_loc_and_factor(
    effect: CorrelatedEffect, theta: np.ndarray, prior_logp: Callable[[np.ndarray], float]
) -> Callable[[np.ndarray], float]:
    """The log prior of ``mu`` and ``L`` at a point that moves them from ``theta``, up to a
    constant: the model's prior with ``z`` held. A centred model's ``ab_j = mu + L z_j``
    move with them, and the ``-J log|L|`` of their density is added back."""
    if not effect.centred:
        return prior_logp
    z = np.linalg.solve(effect.factor(theta), effect.matrix(theta) - effect.loc(theta)[:, None])

    def log_density(point: np.ndarray) -> float:
        ab = effect.loc(point)[:, None] + effect.factor(point) @ z
        log_det = np.sum(point[effect.scale_slice][effect.log_entries])
        return prior_logp(effect.with_matrix(point, ab)) + effect.n_groups * log_det

    return log_density


def correlated_bulk_point(
    effect: CorrelatedEffect, theta: np.ndarray, fit: CorrelatedFit
) -> np.ndarray:
    """``theta`` moved to the fit's bulk: ``mu`` and ``L`` at the fit's, each ``z_j`` at its
    conditional mean given them, ``(I + L' K_j L)^-1 L' (eta_j - K_j mu)`` (a centred
    model's ``ab_j = mu + L z_j``)."""
    out = np.array(theta, dtype=np.float64)
    point = fit.point
    chol, loc = effect.factor(point), effect.loc(point)
    residual = fit.linear - np.einsum("jab,b->ja", fit.precision, loc)
    system = np.eye(effect.n_effects) + fit.information(effect)
    z = np.linalg.solve(system, (residual @ chol)[..., None])[..., 0]  # (J, K)
    out = effect.with_matrix(out, loc[:, None] + chol @ z.T if effect.centred else z.T)
    out[effect.scale_slice] = point[effect.scale_slice]
    if effect.loc_slice is not None:
        out[effect.loc_slice] = point[effect.loc_slice]
    return out
