"""Sampling coordinates for loc-scale group effects that follow the scale: conditional whitening.

The per-group centring of :mod:`pymc_bigdata.model.reparam` fixes each group's centredness
``c_j`` at the bulk's scale. Away from it the coordinates stiffen: the conditional prior
sd of ``w_j`` is ``scale**c_j``, so where the posterior reaches scales far below the bulk's
(a heavy left tail of ``log scale``, e.g. few parents of which most are data-poor) a
partly centred group is a funnel again, ``(scale_bulk / scale)**(2 c_j)`` times stiffer.

Here each group's coordinate is its effect standardised by its conditional posterior given
``(loc, scale)`` under a Gaussian reading of its rows (precision ``kappa_j`` about the data
estimate ``a_j^``, :func:`~pymc_bigdata.model.group_fit.fit_groups`), with
``h_j = kappa_j scale^2``::

    a_j = (h_j a_j^ + loc) / (1 + h_j) + scale * w_j / sqrt(1 + h_j)                (1)

that is ``a_j = m_j + s_j w_j`` with ``s_j^-2 = kappa_j + scale^-2`` and ``m_j`` the
conditional mean. Given ``(loc, scale)`` and a Gaussian likelihood, ``w_j ~ Normal(0, 1)``
at every scale: no funnel where the scale is small (``h_j -> 0``: ``a_j = loc + scale w_j``,
non-centred) and no ridge where it is large (``h_j >> 1``: ``a_j = a_j^ + w_j / sqrt(kappa_j)``,
centred). For other likelihoods it is the same map with the rows' Laplace reading; any
``kappa_j >= 0`` and ``a_j^`` give a bijection, so the target is exact either way. The model's
own variable ``t_j`` is ``a_j`` (centred model) or ``z_j = (a_j - loc) / scale``::

    z_j = h_j (a_j^ - loc) / (scale (1 + h_j)) + w_j / sqrt(1 + h_j)                 (2)
    log |det dtheta/dphi| = sum_j [log scale] - 1/2 log(1 + h_j)    (centred model)     (3)
    log |det dtheta/dphi| = sum_j - 1/2 log(1 + h_j)                 (non-centred model)

(``[log scale]`` only for a centred model). ``loc``, ``scale`` and every other coordinate are
shared, so the Jacobian is block triangular. This is Papaspiliopoulos, Roberts & Skold's
(2007) partially non-centred parameterisation made exact at every scale rather than at one:
their ``c_j = h_j / (1 + h_j)`` at the bulk's scale is :func:`~pymc_bigdata.model.reparam.
choose_centredness`; here ``h_j`` moves with the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt

from pymc_bigdata.model.loc_scale import LocScaleEffect
from pymc_bigdata.model.nested_loc import (
    Written,
    add_loc_pullback,
    effect_loc,
    effect_log_scale,
    log_scale_of,
    symbolic_loc_scale,
)

__all__ = ["ChildrenReading", "WhitenedLocScale"]


@dataclass(frozen=True, eq=False)
class ChildrenReading:
    """What the rows say about a parents' effect ``b_k`` through its nested groups, at the
    groups' scale ``scale_a`` of the point: once each ``a_j`` is integrated out, the group's
    estimate is ``a_j^ ~ Normal(b_k, scale_a^2 + 1/kappa_j)``, so::

        kappa_k = sum_j u_j,   b_k^ = sum_j u_j a_j^ / kappa_k,
        u_j = kappa_j / (1 + kappa_j scale_a^2)

    over the groups ``j`` of parent ``k`` (:func:`~pymc_bigdata.model.group_fit.fit_parent`
    at one ``scale_a``; here at every one, so that Eq. (1) stays exact for a Gaussian
    likelihood wherever ``scale_a`` goes).

    Attributes
    ----------
    index : ndarray of int, shape (J,)
        Each group's parent ``k_j``.
    kappa, estimate : ndarray, shape (J,)
        The groups' ``kappa_j`` and ``a_j^``.
    scale_slice : slice
        ``scale_a``'s entry of the vector.
    scale_transform : str or None
        ``"log"`` where ``scale_a``'s value is its log.
    n_parents : int
        ``K``.
    """

    index: np.ndarray
    kappa: np.ndarray
    estimate: np.ndarray
    scale_slice: slice
    scale_transform: str | None
    n_parents: int

    @property
    def _one_hot(self) -> np.ndarray:
        """``M[j, k] = 1`` where group ``j``'s parent is ``k``."""
        return np.eye(self.n_parents)[self.index]

    def at(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``kappa_k``, ``b_k^`` and their derivatives in ``scale_a``'s value at ``x``
        (shape ``(..., d)``), each ``(..., K)``."""
        log_scale, d_log_scale = log_scale_of(x[..., self.scale_slice], self.scale_transform)
        scale2 = np.exp(2.0 * log_scale)
        u = self.kappa / (1.0 + self.kappa * scale2)
        du = -2.0 * scale2 * u**2 * d_log_scale
        one_hot = self._one_hot
        kappa = u @ one_hot
        seen = kappa > 0.0
        safe = np.where(seen, kappa, 1.0)
        estimate = np.where(seen, (u * self.estimate) @ one_hot / safe, 0.0)
        d_kappa = du @ one_hot
        spread = du * (self.estimate - estimate[..., self.index])
        d_estimate = np.where(seen, spread @ one_hot / safe, 0.0)
        return kappa, estimate, d_kappa, d_estimate

    def symbolic(self, x: pt.TensorVariable) -> tuple[pt.TensorVariable, pt.TensorVariable]:
        """``kappa_k`` and ``b_k^`` at the symbolic ``x``."""
        value = x[self.scale_slice][0]
        log_scale = value if self.scale_transform == "log" else pt.log(pt.abs(value))
        u = self.kappa / (1.0 + self.kappa * pt.exp(2.0 * log_scale))
        one_hot = pt.constant(self._one_hot)
        kappa = pt.dot(u, one_hot)
        seen = pt.gt(kappa, 0.0)
        weighted = pt.dot(u * self.estimate, one_hot)
        estimate = pt.switch(seen, weighted / pt.switch(seen, kappa, 1.0), 0.0)
        return kappa, estimate


class WhitenedLocScale:
    """Eqs. (1)-(3) for one effect: the sampler's ``phi`` (``w`` in the effect's slots) and
    the model's ``theta`` (``z`` or ``a`` there), all other entries shared. The same
    interface as :class:`~pymc_bigdata.model.reparam.LocScaleReparam`, so that
    :class:`~pymc_bigdata.model.reparam.LocScaleReparams` holds either.

    Parameters
    ----------
    effect
        The effect (from :func:`~pymc_bigdata.model.loc_scale.find_loc_scale_effects`).
    kappa
        ``kappa_j >= 0``, what each group's rows say about ``a_j``, as a precision (0: no rows).
    estimate
        ``a_j^``, the rows' estimate of ``a_j`` (unused where ``kappa_j = 0``).
    bulk_scale
        The scale of the posterior's bulk, for :attr:`centredness` only (it does not enter
        the map).
    children
        For a parents' effect read through its nested groups: ``kappa_k`` and ``b_k^`` at
        the groups' scale of the point (:class:`ChildrenReading`) instead of ``kappa`` and
        ``estimate``, which then serve :attr:`centredness` only.
    """

    def __init__(
        self,
        effect: LocScaleEffect,
        kappa: np.ndarray,
        estimate: np.ndarray,
        bulk_scale: float = 1.0,
        children: ChildrenReading | None = None,
    ):
        self.effect, self.bulk_scale, self.children = effect, float(bulk_scale), children
        #: ``kappa_j`` and ``a_j^`` in the symbolic map: shared vectors, so that a layer's
        #: compiled functions follow :meth:`set_fit` without a new compile
        self.shared_kappa = pytensor.shared(np.zeros(effect.n_groups), effect.name + "_kappa")
        self.shared_estimate = pytensor.shared(np.zeros(effect.n_groups), effect.name + "_ahat")
        self.set_fit(kappa, estimate)

    def set_fit(self, kappa: np.ndarray, estimate: np.ndarray) -> None:
        """Move to the groups' precisions ``kappa_j`` and estimates ``a_j^``."""
        n = self.effect.n_groups
        kappa = np.broadcast_to(np.asarray(kappa, dtype=np.float64), (n,)).copy()
        estimate = np.broadcast_to(np.asarray(estimate, dtype=np.float64), (n,)).copy()
        if not (np.all(np.isfinite(kappa)) and np.all(kappa >= 0.0)):
            raise ValueError(f"{self.effect.name}: kappa must be finite and >= 0, got {kappa}.")
        if not np.all(np.isfinite(estimate)):
            raise ValueError(f"{self.effect.name}: the estimates must be finite, got {estimate}.")
        self.kappa, self.estimate = kappa, np.where(kappa > 0.0, estimate, 0.0)
        self.shared_kappa.set_value(self.kappa.copy())
        self.shared_estimate.set_value(self.estimate.copy())

    @property
    def centredness(self) -> np.ndarray:
        """``h_j / (1 + h_j)`` at :attr:`bulk_scale`: how centred each group is there (1:
        like ``a_j``, 0: like ``z_j``), the per-group centring's ``c_j`` at that scale."""
        h = self.kappa * self.bulk_scale**2
        return h / (1.0 + h)

    @property
    def moves_coordinates(self) -> bool:
        """Always: no ``kappa`` makes Eq. (1) a centred model's own coordinates."""
        return True

    def key(self) -> bytes:
        """A key of the current map (a layer's MAP and fits depend on it)."""
        return self.kappa.tobytes() + self.estimate.tobytes()

    # ------------------------------------------------------------------ parts of a vector
    def _fit_at(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``kappa_j``, ``a_j^`` and their derivatives in the children's scale's value (0
        without :attr:`children`)."""
        if self.children is not None:
            return self.children.at(x)
        zero = np.zeros(self.effect.n_groups)
        return self.kappa, self.estimate, zero, zero

    def _parts(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``loc``, ``scale``, ``h_j`` and ``a_j^ - loc`` at ``x``."""
        loc = effect_loc(self.effect, x)
        scale = np.exp(effect_log_scale(self.effect, x)[0])
        kappa, estimate, _, _ = self._fit_at(x)
        return loc, scale, kappa * scale**2, estimate - loc

    # ------------------------------------------------------------------ the map
    def to_model(self, phi: np.ndarray) -> np.ndarray:
        """``theta`` at ``phi`` (Eqs. 1-2)."""
        phi = np.asarray(phi, dtype=np.float64)
        sl = self.effect.effect_slice
        loc, scale, h, offset = self._parts(phi)
        w = phi[..., sl]
        shift = scale * (h * offset / (scale * (1.0 + h)) + w / np.sqrt(1.0 + h))  # a - loc
        theta = phi.copy()
        theta[..., sl] = loc + shift if self.effect.centred else shift / scale
        return theta

    def from_model(self, theta: np.ndarray) -> np.ndarray:
        """``phi`` at ``theta`` (Eqs. 1-2 solved for ``w``)."""
        theta = np.asarray(theta, dtype=np.float64)
        sl = self.effect.effect_slice
        loc, scale, h, offset = self._parts(theta)
        t = theta[..., sl]
        z = (t - loc) / scale if self.effect.centred else t
        phi = theta.copy()
        phi[..., sl] = np.sqrt(1.0 + h) * (z - h * offset / (scale * (1.0 + h)))
        return phi

    def log_jacobian(self, phi: np.ndarray) -> float | np.ndarray:
        """``log |det dtheta/dphi|`` at ``phi`` (Eq. 3); an array over leading batch axes."""
        _, scale, h, _ = self._parts(np.asarray(phi, dtype=np.float64))
        out = -0.5 * np.sum(np.log1p(h), axis=-1)
        if self.effect.centred:
            out = out + self.effect.n_groups * np.log(scale[..., 0])
        return float(out) if np.ndim(out) == 0 else out

    # ------------------------------------------------------------------ in PyTensor
    def _symbolic_parts(self, phi: pt.TensorVariable, written: Written | None = None):
        loc, log_scale = symbolic_loc_scale(self.effect, phi, written)
        kappa, estimate = (
            (self.shared_kappa, self.shared_estimate)
            if self.children is None
            else self.children.symbolic(phi)
        )
        return loc, log_scale, kappa * pt.exp(2.0 * log_scale), estimate

    def symbolic_effect(
        self, phi: pt.TensorVariable, written: Written | None = None
    ) -> pt.TensorVariable:
        """The model's effect variable ``t`` (shape (J,)) at the symbolic ``phi`` (Eqs. 1-2),
        its parents' values read from ``written`` where it holds them."""
        loc, log_scale, h, estimate = self._symbolic_parts(phi, written)
        offset = estimate - loc
        z = h * offset * pt.exp(-log_scale) / (1.0 + h) + phi[self.effect.effect_slice] / pt.sqrt(
            1.0 + h
        )
        return loc + pt.exp(log_scale) * z if self.effect.centred else z

    def symbolic_log_jacobian(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """``log |det dtheta/dphi|`` at the symbolic ``phi`` (Eq. 3)."""
        _, log_scale, h, _ = self._symbolic_parts(phi)
        out = -0.5 * pt.sum(pt.log1p(h))
        return out + self.effect.n_groups * log_scale if self.effect.centred else out

    def pullback(self, phi: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        """The gradient in ``phi`` of ``f(to_model(phi)) + log_jacobian(phi)`` from
        ``grad_theta``, the gradient of ``f`` at ``to_model(phi)``:
        ``J' grad_theta + grad log|J|``.

        ``t_j`` depends on ``w_j``, ``loc``, ``scale`` directly and through ``h_j`` and the
        offset ``a_j^ - loc`` (which the children's scale moves too, where there are
        :attr:`children`); ``log|J|`` through ``h_j`` and, centred, ``log scale``."""
        phi = np.asarray(phi, dtype=np.float64)
        g = np.asarray(grad_theta, dtype=np.float64)
        e = self.effect
        loc, scale, h, offset = self._parts(phi)
        _, _, d_kappa, d_estimate = self._fit_at(phi)
        w, g_t, root = phi[..., e.effect_slice], g[..., e.effect_slice], np.sqrt(1.0 + h)
        if e.centred:  # t = loc + h off / (1 + h) + scale w / root
            d_h = offset / (1.0 + h) ** 2 - scale * w / (2.0 * root**3)
            d_offset, d_scale, d_w = h / (1.0 + h), w / root, scale / root
            d_loc = 1.0 - d_offset
        else:  # t = h off / (scale (1 + h)) + w / root
            d_h = offset / (scale * (1.0 + h) ** 2) - w / (2.0 * root**3)
            d_offset, d_w = h / (scale * (1.0 + h)), 1.0 / root
            d_scale, d_loc = -h * offset / (scale**2 * (1.0 + h)), -d_offset
        jac_h = -0.5 / (1.0 + h)  # d log|J| / d h_j
        out = g.copy()
        out[..., e.effect_slice] = d_w * g_t
        through_loc = g_t * d_loc
        add_loc_pullback(e, phi, through_loc, out)
        # own scale: dh/dlog(scale) = 2 h, d scale/dlog(scale) = scale
        by_h = g_t * d_h + jac_h
        through = np.sum(by_h * 2.0 * h + g_t * d_scale * scale, axis=-1, keepdims=True)
        if e.centred:
            through = through + e.n_groups
        out[..., e.scale_slice] += effect_log_scale(e, phi)[1] * through
        if self.children is not None:  # h and the offset through the children's scale
            by_children = by_h * d_kappa * scale**2 + g_t * d_offset * d_estimate
            out[..., self.children.scale_slice] += np.sum(by_children, axis=-1, keepdims=True)
        return out
