"""What each group's rows say about its effect, and where the posterior's bulk is.

For a loc-scale effect (:mod:`pymc_bigdata.model.loc_scale`) the centring rule of
:mod:`pymc_bigdata.model.reparam` needs each group's information ``h_j = kappa_j scale^2``
at the scale of the posterior's bulk, not at a joint mode's. :func:`fit_groups` reads each
group's rows as a Gaussian likelihood of its effect (:func:`group_curvature`, one Newton step
from a point) and fits the scale of the random-effects meta-analysis it implies;
:func:`fit_parent` does the same for the parents' effect of nested groups, from its groups'
fit; :func:`bulk_point` moves a point there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize_scalar

from pymc_bigdata.model.loc_scale import LocScaleEffect
from pymc_bigdata.model.nested_loc import effect_loc

__all__ = [
    "GroupFit",
    "bulk_point",
    "effect_values",
    "fit_groups",
    "fit_parent",
    "group_curvature",
    "group_information",
    "scale_at",
]


def scale_at(effect: LocScaleEffect, theta: np.ndarray) -> float:
    """The effect's ``scale`` at ``theta`` (the model's coordinates)."""
    value = float(theta[effect.scale_slice][0])
    return float(np.exp(value)) if effect.scale_transform == "log" else abs(value)


def _loc_at(effect: LocScaleEffect, theta: np.ndarray) -> float | np.ndarray:
    """The effect's ``loc`` at ``theta``: a float, or one per group where it is a vector
    (groups nested in parents, a regression on group-level covariates)."""
    if effect.parent is not None or effect.linear_loc is not None:
        return effect_loc(effect, np.asarray(theta, dtype=np.float64))
    return effect.loc_value if effect.loc_slice is None else float(theta[effect.loc_slice][0])


def group_curvature(
    effect: LocScaleEffect,
    theta: np.ndarray,
    loglik_hvp: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """``kappa_j = -d^2 loglik / d a_j^2`` at ``theta`` (the model's coordinates): what each
    group's rows say about ``a_j``, as a precision.

    An effect read only as ``a[g]`` (``indexed_only``) has a diagonal log-likelihood Hessian
    in ``t``, so one full-data Hessian-vector product along the effect's slots gives it:
    ``-d^2 loglik / d z_j^2 = scale^2 kappa_j`` (non-centred), ``kappa_j`` (centred).
    Negative or non-finite curvatures (no rows, or a non-log-concave likelihood far out)
    count as 0.
    """
    if not effect.indexed_only:
        raise ValueError(f"{effect.name}: the likelihood reads it other than as a[g].")
    direction = np.zeros_like(theta)
    direction[effect.effect_slice] = 1.0
    curvature = -np.asarray(loglik_hvp(theta, direction))[effect.effect_slice]
    if not effect.centred:
        curvature = curvature / scale_at(effect, theta) ** 2
    return np.maximum(np.nan_to_num(curvature, nan=0.0, posinf=0.0, neginf=0.0), 0.0)


def group_information(
    effect: LocScaleEffect,
    theta: np.ndarray,
    loglik_hvp: Callable[[np.ndarray, np.ndarray], np.ndarray],
    scale: float | None = None,
) -> np.ndarray:
    """``h_j = kappa_j scale^2``: each group's data information about ``a_j`` relative to the
    prior's (:func:`group_curvature` at ``theta``), at ``scale`` (default: the scale at
    ``theta``)."""
    kappa = group_curvature(effect, theta, loglik_hvp)
    return kappa * (scale_at(effect, theta) if scale is None else scale) ** 2


class GroupFit(NamedTuple):
    """What the rows say about each group of an effect, and the scale of the posterior's
    bulk (:func:`fit_groups`)."""

    #: ``kappa_j``, the rows' precision about ``a_j`` (0: no rows)
    kappa: np.ndarray
    #: ``a_j^``, the rows' estimate of ``a_j`` (``loc`` where ``kappa_j = 0``)
    estimate: np.ndarray
    #: the scale at the mode of its marginal posterior
    scale: float
    #: ``loc`` (a free one at its weighted mean given :attr:`scale`; one per group where
    #: the groups are nested in parents, held at the point's, or a regression on group-level
    #: covariates, at its weighted least-squares fit)
    loc: float | np.ndarray
    #: the sd of ``log scale``'s marginal posterior, from its curvature at the mode (0 where
    #: the fit did not run)
    log_scale_sd: float = 0.0
    #: a regression ``loc``'s fitted coefficients (None for any other ``loc``)
    coefficients: np.ndarray | None = None

    @property
    def information(self) -> np.ndarray:
        """``h_j = kappa_j scale^2`` at the bulk's scale."""
        return self.kappa * self.scale**2

    def information_below(self, n_sds: float) -> np.ndarray:
        """``h_j`` at the scale ``n_sds`` posterior sds of ``log scale`` below its mode."""
        return self.kappa * (self.scale * np.exp(-n_sds * self.log_scale_sd)) ** 2


def fit_groups(
    effect: LocScaleEffect,
    theta: np.ndarray,
    loglik_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    loglik_hvp: Callable[[np.ndarray, np.ndarray], np.ndarray],
    prior_logp: Callable[[np.ndarray], float],
) -> GroupFit:
    """The groups' data and the scale where the posterior's bulk is, read from a point
    ``theta`` (the model's coordinates) that may be far from it, e.g. a joint MAP.

    A joint mode is a poor place to read the scale at. Written non-centred, the prior of
    ``z = (a - loc) / scale`` rewards a larger scale at fixed ``a`` and only the scale's own
    prior holds it back (2,000 groups of true scale 0.5 put the joint mode near 4); written
    centred, the density is unbounded as the scale and every ``a_j - loc`` go to 0 together,
    and a search can end there. Instead each group's rows are read as a Gaussian
    likelihood of ``a_j``: precision ``kappa_j`` (:func:`group_curvature`), centred at the
    data estimate ``a_j^ = a_j + g_j / kappa_j`` (one Newton step from ``theta``,
    ``g_j = d loglik / d a_j``). Integrating the effects out gives
    ``a_j^ ~ Normal(loc, scale^2 + 1 / kappa_j)`` (empirical Bayes: the random-effects
    meta-analysis model); with the scale's own prior this is the scale's marginal posterior,
    whose mode in the scale's value coordinates is returned, a free ``loc`` at its weighted
    mean. Exact for a Gaussian likelihood. Costs two full-data passes (a gradient and a
    Hessian-vector product) and prior evaluations.

    Parameters
    ----------
    effect
        The effect (read only as ``a[g]``).
    theta
        A point in the model's coordinates.
    loglik_grad, loglik_hvp, prior_logp
        The model's full-data log-likelihood with its gradient, its Hessian-vector product,
        and its log prior (in the value coordinates, transforms' Jacobians included).
    """
    kappa = group_curvature(effect, theta, loglik_hvp)
    scale, loc = scale_at(effect, theta), _loc_at(effect, theta)
    t = theta[effect.effect_slice]
    grad_t = np.asarray(loglik_grad(theta)[1])[effect.effect_slice]
    a, grad_a = (t, grad_t) if effect.centred else (loc + scale * t, grad_t / scale)
    seen = kappa > 0.0
    estimate = np.where(seen, a + grad_a / np.where(seen, kappa, 1.0), loc)
    return _bulk_fit(effect, theta, kappa, estimate, _scale_prior(effect, theta, prior_logp))


def fit_parent(
    effect: LocScaleEffect,
    theta: np.ndarray,
    children: LocScaleEffect,
    children_fit: GroupFit,
    prior_logp: Callable[[np.ndarray], float],
    descendants: Sequence[LocScaleEffect] = (),
) -> GroupFit:
    """:func:`fit_groups` for the parents' effect ``b`` of nested groups (``effect.children``):
    what the data say about ``b_k`` is what its groups say, each group's estimate
    ``a_j^ ~ Normal(b_k, scale_a^2 + 1 / kappa_j)`` once ``a_j`` is integrated out (at the
    groups' bulk scale ``scale_a``), so ``kappa_k = sum_j 1 / (scale_a^2 + 1 / kappa_j)`` and
    ``b_k^`` their precision-weighted mean over the groups ``j`` of parent ``k``. The
    scale's fit is then :func:`fit_groups`'s. No data pass.

    Parameters
    ----------
    effect
        The parents' effect (``effect.children`` names ``children``).
    theta
        A point in the model's coordinates.
    children, children_fit
        The nested groups' effect and its :func:`fit_groups` at ``theta``.
    prior_logp
        The model's log prior in the value coordinates.
    descendants
        Three levels and up: the effects nested in ``children``, each in the one before.
    """
    index = children.parent.index
    seen = children_fit.kappa > 0.0
    variance = children_fit.scale**2 + 1.0 / np.where(seen, children_fit.kappa, 1.0)
    weight = np.where(seen, 1.0 / variance, 0.0)
    kappa = np.bincount(index, weights=weight, minlength=effect.n_groups)
    weighted = np.bincount(index, weights=weight * children_fit.estimate, minlength=effect.n_groups)
    b = effect_values(effect, theta)
    estimate = np.where(kappa > 0.0, weighted / np.where(kappa > 0.0, kappa, 1.0), b)
    scale_prior = _scale_prior(effect, theta, prior_logp, [children, *descendants])
    return _bulk_fit(effect, theta, kappa, estimate, scale_prior)


def effect_values(effect: LocScaleEffect, theta: np.ndarray) -> np.ndarray:
    """``a``, the effect's values at ``theta`` (``loc + scale z`` where it is non-centred)."""
    t = np.asarray(theta[effect.effect_slice], dtype=np.float64)
    return t if effect.centred else _loc_at(effect, theta) + scale_at(effect, theta) * t


def _bulk_fit(
    effect: LocScaleEffect,
    theta: np.ndarray,
    kappa: np.ndarray,
    estimate: np.ndarray,
    scale_prior: Callable[[float], float],
) -> GroupFit:
    """The random-effects meta-analysis of :func:`fit_groups`: the mode of the scale's
    marginal posterior given each group's estimate and precision, a free ``loc`` at its
    weighted mean."""
    scale, loc = scale_at(effect, theta), _loc_at(effect, theta)
    seen = kappa > 0.0
    if seen.sum() < 2:
        return GroupFit(kappa, estimate, scale, loc)
    x, v = estimate[seen], 1.0 / kappa[seen]
    held_loc = loc if np.ndim(loc) == 0 else loc[seen]

    regression = effect.linear_loc

    def loc_given(log_scale: float) -> float | np.ndarray:
        if regression is not None:  # its weighted least-squares fit
            return regression.value(point_given(log_scale))[seen]
        if effect.loc_slice is None:
            return held_loc
        weight = 1.0 / (np.exp(2.0 * log_scale) + v)
        return float(np.sum(weight * x) / np.sum(weight))

    def point_given(log_scale: float) -> np.ndarray:
        """``theta`` with the regression's coefficients fitted at ``log_scale``."""
        weight = 1.0 / (np.exp(2.0 * log_scale) + v)
        return regression.with_coefficients(theta, regression.fit(x, weight, seen))

    def neg_log_posterior(log_scale: float) -> float:
        total = np.exp(2.0 * log_scale) + v
        marginal = -0.5 * np.sum(np.log(total) + (x - loc_given(log_scale)) ** 2 / total)
        return -(marginal + scale_prior(log_scale))

    reference = np.log(max(float(np.std(x)) + float(np.sqrt(np.median(v))), scale, 1e-12))
    with np.errstate(all="ignore"):
        best = minimize_scalar(
            neg_log_posterior, bounds=(reference - 15.0, reference + 3.0), method="bounded"
        )
    if not np.isfinite(best.fun):
        return GroupFit(kappa, estimate, scale, loc)
    fitted_loc = loc if effect.loc_slice is None else loc_given(best.x)
    coefficients = None
    if regression is not None:
        fitted = point_given(best.x)
        fitted_loc, coefficients = regression.value(fitted), fitted[regression.coefficients]
    step = 1e-3
    with np.errstate(all="ignore"):
        around = [neg_log_posterior(best.x + k * step) for k in (-1.0, 1.0)]
    curvature = (around[0] + around[1] - 2.0 * best.fun) / step**2
    sd = float(1.0 / np.sqrt(curvature)) if np.isfinite(curvature) and curvature > 0 else 0.0
    return GroupFit(kappa, estimate, float(np.exp(best.x)), fitted_loc, sd, coefficients)


def _scale_prior(
    effect: LocScaleEffect,
    theta: np.ndarray,
    prior_logp: Callable[[np.ndarray], float],
    nested: Sequence[LocScaleEffect] = (),
) -> Callable[[float], float]:
    """The log prior density of ``log scale``, up to a constant: the model's prior at
    ``theta`` with the scale moved and each ``z_j = (a_j - loc) / scale`` held (a centred
    effect's ``a_j`` move with the scale, and the ``-J log scale`` of their density is
    added back), plus ``log scale`` where the scale's value is the scale itself. A parents'
    effect moves the centred effects ``nested`` in it (its children, then theirs) with it,
    so their prior about it stays put (what they say about it is in :func:`fit_parent`'s
    estimates)."""
    scale, loc = scale_at(effect, theta), _loc_at(effect, theta)
    z = (
        theta[effect.effect_slice]
        if not effect.centred
        else (theta[effect.effect_slice] - loc) / scale
    )

    def log_density(log_scale: float) -> float:
        moved = theta.copy()
        moved[effect.scale_slice] = (
            log_scale if effect.scale_transform == "log" else np.exp(log_scale)
        )
        if effect.centred:
            moved[effect.effect_slice] = loc + np.exp(log_scale) * z
        for below in nested:  # each reads the one before at its new point
            if below.centred:
                shift = below.parent.value(moved) - below.parent.value(theta)
                moved[below.effect_slice] += shift
        if effect.centred:
            return prior_logp(moved) + effect.n_groups * log_scale
        return prior_logp(moved) + (0.0 if effect.scale_transform == "log" else log_scale)

    return log_density


def bulk_point(effect: LocScaleEffect, theta: np.ndarray, fit: GroupFit) -> np.ndarray:
    """``theta`` moved to the bulk of :func:`fit_groups`: the scale and a free ``loc`` at the
    fit's, each ``a_j`` at its conditional mean given them,
    ``(kappa_j a_j^ + loc / scale^2) / (kappa_j + 1 / scale^2)`` (in the model's own
    variable: ``z_j = (a_j - loc) / scale`` where it is non-centred)."""
    out = np.array(theta, dtype=np.float64)
    # nested groups: about their parents at ``theta`` (which an earlier bulk_point may move)
    loc = fit.loc if effect.parent is None else _loc_at(effect, out)
    prior_precision = 1.0 / fit.scale**2
    a = (fit.kappa * fit.estimate + prior_precision * loc) / (fit.kappa + prior_precision)
    out[effect.effect_slice] = a if effect.centred else (a - loc) / fit.scale
    out[effect.scale_slice] = np.log(fit.scale) if effect.scale_transform == "log" else fit.scale
    if effect.loc_slice is not None:
        out[effect.loc_slice] = fit.loc
    if fit.coefficients is not None:
        out[effect.linear_loc.coefficients] = fit.coefficients
    return out
