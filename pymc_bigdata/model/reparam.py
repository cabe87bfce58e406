"""Sampling coordinates for loc-scale group effects: per-group (partial) centring.

For an effect found by :func:`~pymc_bigdata.model.loc_scale.find_loc_scale_effects`, the
sampler's vector ``phi`` holds ``w_j`` where the model's ``theta`` holds ``t_j`` (``z_j`` of a
non-centred model, ``m = 0``; ``a_j`` of a centred one, ``m = 1``), with centredness ``c_j``
in [0, 1] (Gorinova, Moore & Hoffman 2020; Papaspiliopoulos, Roberts & Skold 2007)::

    a_j = loc + scale**(1 - c_j) * (w_j - c_j * loc),    w_j ~ Normal(c_j * loc, scale**c_j)
    t_j = m * loc + scale**(m - c_j) * (w_j - c_j * loc)                        (1)
    w_j = c_j * loc + scale**(c_j - m) * (t_j - m * loc)                        (2)
    log |det dtheta/dphi| = log(scale) * sum_j (m - c_j)                         (3)

Every other coordinate (``loc`` and ``scale`` included) is shared, so the Jacobian is block
triangular and (3) is the product of its diagonal ``dt_j / dw_j``. The density of ``phi`` is
``p(theta(phi)) |det dtheta/dphi|``, which is what the model written with ``w`` gives.

:class:`LocScaleReparam` is the map in numpy (draws back to the model's variables) and in
PyTensor (:meth:`~LocScaleReparam.symbolic_effect`: the layer's graphs in ``phi``);
:func:`choose_centredness` is the rule for ``c_j`` (the Gaussian optimum, which makes ``w_j``
and ``loc`` independent a posteriori given the scale).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.optimize import minimize_scalar

from pymc_bigdata.model.loc_scale import LocScaleEffect
from pymc_bigdata.model.nested_loc import log_scale_of

__all__ = [
    "LocScaleReparam",
    "LocScaleReparams",
    "choose_centredness",
    "group_curvature",
    "GroupFit",
    "bulk_point",
    "fit_groups",
    "group_information",
    "scale_at",
]


def scale_at(effect: LocScaleEffect, theta: np.ndarray) -> float:
    """The effect's ``scale`` at ``theta`` (the model's coordinates)."""
    value = float(theta[effect.scale_slice][0])
    return float(np.exp(value)) if effect.scale_transform == "log" else abs(value)


def _loc_at(effect: LocScaleEffect, theta: np.ndarray) -> float | np.ndarray:
    """The effect's ``loc`` at ``theta``: a float, or one per group where the groups are
    nested in parents (``effect.parent``)."""
    if effect.parent is not None:
        return effect.parent.value(np.asarray(theta, dtype=np.float64))
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
    #: the groups are nested in parents, held at the point's)
    loc: float | np.ndarray

    @property
    def information(self) -> np.ndarray:
        """``h_j = kappa_j scale^2`` at the bulk's scale."""
        return self.kappa * self.scale**2


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
    if seen.sum() < 2:
        return GroupFit(kappa, estimate, scale, loc)
    scale_prior = _scale_prior(effect, theta, prior_logp)
    x, v = estimate[seen], 1.0 / kappa[seen]
    held_loc = loc if np.ndim(loc) == 0 else loc[seen]

    def loc_given(log_scale: float) -> float | np.ndarray:
        if effect.loc_slice is None:
            return held_loc
        weight = 1.0 / (np.exp(2.0 * log_scale) + v)
        return float(np.sum(weight * x) / np.sum(weight))

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
    return GroupFit(kappa, estimate, float(np.exp(best.x)), fitted_loc)


def _scale_prior(
    effect: LocScaleEffect, theta: np.ndarray, prior_logp: Callable[[np.ndarray], float]
) -> Callable[[float], float]:
    """The log prior density of ``log scale``, up to a constant: the model's prior at
    ``theta`` with the scale moved and each ``z_j = (a_j - loc) / scale`` held (a centred
    effect's ``a_j`` move with the scale, and the ``-J log scale`` of their density is
    added back), plus ``log scale`` where the scale's value is the scale itself."""
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
    return out


def choose_centredness(information: np.ndarray) -> np.ndarray:
    """``c_j = h_j / (1 + h_j)``: centred (``c = 1``) where the data pin the group down
    (``h_j >> 1``), non-centred (``c = 0``) where the prior does. For a Gaussian likelihood
    this is the partially non-centred parameterisation under which ``w_j`` and ``loc`` are
    independent a posteriori given the scale (Papaspiliopoulos et al. 2007)."""
    h = np.asarray(information, dtype=np.float64)
    return h / (1.0 + h)


class LocScaleReparam:
    """Eqs. (1)-(3) for one effect: the sampler's ``phi`` (``w`` in the effect's slots) and
    the model's ``theta`` (``z`` or ``a`` there), all other entries shared.

    Vectors are raveled value vectors (the layout of the effect's slices); leading batch axes
    are allowed (``phi[..., d]``). A log-transformed scale is ``exp(value)``; an
    untransformed one enters Eqs. (1)-(3) as ``|value|``.

    Parameters
    ----------
    effect
        The effect (from :func:`find_loc_scale_effects`).
    centredness
        ``c_j`` in [0, 1], one per group or one for all: 1 samples the group centred, 0
        non-centred, in between partially (Gorinova et al. 2020).
    """

    def __init__(self, effect: LocScaleEffect, centredness: float | np.ndarray):
        self.effect = effect
        #: ``c_j`` in the symbolic map: a shared vector, so that a layer's compiled
        #: functions follow :meth:`set_centredness` without a new compile
        self.shared_centredness = pytensor.shared(np.zeros(effect.n_groups), effect.name + "_c")
        self.set_centredness(centredness)

    def set_centredness(self, centredness: float | np.ndarray) -> None:
        """Move to centredness ``c_j`` (one per group, or one for all), numpy and symbolic."""
        effect = self.effect
        c = np.broadcast_to(np.asarray(centredness, dtype=np.float64), (effect.n_groups,))
        if not np.all((c >= 0.0) & (c <= 1.0)):
            raise ValueError(f"{effect.name}: centredness must lie in [0, 1], got {c}.")
        self.centredness = c.copy()
        self.power = effect.model_centredness - self.centredness  # m - c_j of Eq. (1)
        self.shared_centredness.set_value(self.centredness.copy())

    # ------------------------------------------------------------------ parts of a vector
    def _loc(self, x: np.ndarray) -> np.ndarray:
        """``loc``, shape (..., 1), or (..., J) for groups nested in parents."""
        e = self.effect
        if e.parent is not None:
            return e.parent.value(x)
        if e.loc_slice is None:
            return np.full(x.shape[:-1] + (1,), e.loc_value)
        return x[..., e.loc_slice]

    def _log_scale(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``log(scale)`` and its derivative in the scale's value, shape (..., 1) each."""
        return log_scale_of(x[..., self.effect.scale_slice], self.effect.scale_transform)

    def _factor(self, x: np.ndarray) -> np.ndarray:
        """``scale**(m - c_j)``, shape (..., J)."""
        return np.exp(self._log_scale(x)[0] * self.power)

    # ------------------------------------------------------------------ the map
    def to_model(self, phi: np.ndarray) -> np.ndarray:
        """``theta`` at ``phi`` (Eq. 1)."""
        phi = np.asarray(phi, dtype=np.float64)
        sl, loc, c = self.effect.effect_slice, self._loc(phi), self.centredness
        theta = phi.copy()
        m = self.effect.model_centredness
        theta[..., sl] = m * loc + self._factor(phi) * (phi[..., sl] - c * loc)
        return theta

    def from_model(self, theta: np.ndarray) -> np.ndarray:
        """``phi`` at ``theta`` (Eq. 2)."""
        theta = np.asarray(theta, dtype=np.float64)
        sl, loc, c = self.effect.effect_slice, self._loc(theta), self.centredness
        phi = theta.copy()
        m = self.effect.model_centredness
        phi[..., sl] = c * loc + (theta[..., sl] - m * loc) / self._factor(theta)
        return phi

    def log_jacobian(self, phi: np.ndarray) -> float | np.ndarray:
        """``log |det dtheta/dphi|`` at ``phi`` (Eq. 3); an array over leading batch axes."""
        log_scale = self._log_scale(np.asarray(phi, dtype=np.float64))[0][..., 0]
        out = log_scale * self.power.sum()
        return float(out) if np.ndim(out) == 0 else out

    # ------------------------------------------------------------------ in PyTensor
    def symbolic_effect(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """The model's effect variable ``t`` (shape (J,)) at the symbolic vector ``phi``
        (Eq. 1)."""
        e, c, m = self.effect, self.shared_centredness, self.effect.model_centredness
        if e.parent is not None:
            loc = e.parent.symbolic(phi)
        else:
            loc = e.loc_value if e.loc_slice is None else phi[e.loc_slice][0]
        factor = pt.exp(self._symbolic_log_scale(phi) * (m - c))
        return m * loc + factor * (phi[e.effect_slice] - c * loc)

    def symbolic_log_jacobian(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """``log |det dtheta/dphi|`` at the symbolic ``phi`` (Eq. 3)."""
        power = self.effect.model_centredness - self.shared_centredness
        return self._symbolic_log_scale(phi) * pt.sum(power)

    def _symbolic_log_scale(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        value = phi[self.effect.scale_slice][0]
        return value if self.effect.scale_transform == "log" else pt.log(pt.abs(value))

    def pullback(self, phi: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        """The gradient in ``phi`` of ``f(to_model(phi)) + log_jacobian(phi)`` from
        ``grad_theta``, the gradient of ``f`` at ``to_model(phi)``:
        ``J' grad_theta + grad log|J|``."""
        phi = np.asarray(phi, dtype=np.float64)
        g = np.asarray(grad_theta, dtype=np.float64)
        e, c, m = self.effect, self.centredness, self.effect.model_centredness
        sl, ssl = e.effect_slice, e.scale_slice
        loc = self._loc(phi)
        factor = self._factor(phi)
        d_log_scale = self._log_scale(phi)[1]
        g_t = g[..., sl]
        out = g.copy()
        out[..., sl] = factor * g_t  # dt_j / dw_j
        through_loc = g_t * (m - c * factor)  # dt_j / dloc_j = m - c_j scale**(m - c_j)
        if e.parent is not None:
            e.parent.add_pullback(phi, through_loc, out)
        elif e.loc_slice is not None:
            out[..., e.loc_slice] += np.sum(through_loc, axis=-1, keepdims=True)
        # dt_j / dlog(scale) = (m - c_j) t_j-part, and d log|J| / dlog(scale) = sum (m - c_j)
        shift = self.power * factor * (phi[..., sl] - c * loc)
        through = np.sum(g_t * shift, axis=-1, keepdims=True) + self.power.sum()
        out[..., ssl] += d_log_scale * through
        return out


class LocScaleReparams:
    """Several :class:`LocScaleReparam` at once: the effects on disjoint slots, no effect's
    slots another's ``loc`` or ``scale``, but an effect may be the parents that another's
    groups are nested in (``effect.parent``). The maps then run parents first (``to_model``;
    ``from_model`` children first), so that each reads its ``loc`` in the model's
    coordinates; the Jacobian stays block triangular and the log-Jacobians add up.

    Parameters
    ----------
    reparams
        One per effect.

    Raises
    ------
    ValueError
        Where one effect's slots overlap another's effect, loc or scale slots, or parents
        nest in a cycle.
    """

    def __init__(self, reparams: Sequence[LocScaleReparam]):
        self.reparams = list(reparams)
        slots = [_slots(r.effect.effect_slice) for r in self.reparams]
        for i, r in enumerate(self.reparams):
            for j, other in enumerate(self.reparams):
                e = other.effect
                used = [e.scale_slice, e.loc_slice] + ([e.effect_slice] if i != j else [])
                if slots[i] & set().union(*(_slots(s) for s in used if s is not None)):
                    raise ValueError(
                        f"Effects {r.effect.name!r} and {e.name!r} share entries of theta."
                    )
        #: ``feeds[i]``: the effects nested in effect ``i`` (whose ``loc`` reads its slots)
        self._feeds = [
            {
                j
                for j, o in enumerate(self.reparams)
                if o.effect.parent is not None and slots[i] & o.effect.parent.slots()
            }
            for i in range(len(self.reparams))
        ]
        self._order = _parents_first(self._feeds)

    @property
    def moves_coordinates(self) -> bool:
        """Whether some group is sampled at another centredness than the model's own."""
        return any(np.any(r.centredness != r.effect.model_centredness) for r in self.reparams)

    @property
    def parents_first(self) -> list[int]:
        """Indices of :attr:`reparams`, each effect before those nested in it."""
        return list(self._order)

    def key(self) -> bytes:
        """A key of the current centredness (a layer's MAP and fits depend on it)."""
        return b"".join(r.centredness.tobytes() for r in self.reparams)

    def to_model(self, phi: np.ndarray) -> np.ndarray:
        """``theta`` at ``phi``."""
        out = np.asarray(phi, dtype=np.float64)
        for i in self._order:
            out = self.reparams[i].to_model(out)
        return out

    def from_model(self, theta: np.ndarray) -> np.ndarray:
        """``phi`` at ``theta``."""
        out = np.asarray(theta, dtype=np.float64)
        for i in reversed(self._order):
            out = self.reparams[i].from_model(out)
        return out

    def log_jacobian(self, phi: np.ndarray) -> float | np.ndarray:
        """``log |det dtheta/dphi|``: the sum over effects."""
        return sum((r.log_jacobian(phi) for r in self.reparams), 0.0)

    def symbolic_effects(self, phi: pt.TensorVariable) -> dict[str, pt.TensorVariable]:
        """Each effect's value variable name: its value at the symbolic ``phi`` (parents
        first; a parent's value is written into the vector its children read)."""
        out, x = {}, phi
        for i in self._order:
            r = self.reparams[i]
            out[r.effect.effect] = r.symbolic_effect(x)
            if self._feeds[i]:
                x = pt.set_subtensor(x[r.effect.effect_slice], out[r.effect.effect])
        return out

    def symbolic_log_jacobian(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """``log |det dtheta/dphi|`` at the symbolic ``phi``: the sum over effects."""
        total = pt.constant(0.0, dtype="float64")
        for r in self.reparams:
            total = total + r.symbolic_log_jacobian(phi)
        return total

    def pullback(self, phi: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        """``J' grad_theta + grad log|J|``: the maps' pullbacks in the reverse of
        :meth:`to_model`'s order, each at the vector its map was applied to."""
        inputs = [np.asarray(phi, dtype=np.float64)]
        for i in self._order[:-1]:
            inputs.append(self.reparams[i].to_model(inputs[-1]))
        out = np.asarray(grad_theta, dtype=np.float64)
        for i, x in reversed(list(zip(self._order, inputs))):
            out = self.reparams[i].pullback(x, out)
        return out


def _slots(sl: slice) -> set[int]:
    return set(range(sl.start, sl.stop))


def _parents_first(feeds: list[set[int]]) -> list[int]:
    """An order of the effects with each before those nested in it (``feeds``)."""
    order, placed = [], set()
    while len(order) < len(feeds):
        ready = [
            i
            for i in range(len(feeds))
            if i not in placed
            and not any(i in feeds[p] for p in range(len(feeds)) if p not in placed)
        ]
        if not ready:
            raise ValueError("The effects' parents nest in a cycle.")
        order.extend(ready)
        placed.update(ready)
    return order
