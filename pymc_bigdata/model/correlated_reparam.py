"""Sampling coordinates for correlated group effects: data-rich groups centred, data-poor
ones non-centred.

For a non-centred correlated effect (:mod:`pymc_bigdata.model.correlated_effects`), group
``j``'s effects are ``ab_j = mu + L z_j`` with ``z_j`` (a column of the ``K x J`` matrix
``z``) standard normal a priori. The sampler's vector ``phi`` holds ``w_j`` in ``z_j``'s
slots, with a centredness ``c_j`` in {0, 1} per group (the matrix form of
:mod:`pymc_bigdata.model.reparam`'s, at its two ends; a matrix power of ``L`` between them
is not built)::

    z_j = c_j L^-1 (w_j - mu) + (1 - c_j) w_j                                 (1)
    w_j = c_j (mu + L z_j) + (1 - c_j) z_j                                     (2)
    log |det dtheta/dphi| = -(sum_j c_j) sum_k log L_kk                        (3)

so ``w_j = ab_j ~ MvNormal(mu, L L')`` for a centred group and ``w_j = z_j`` otherwise.
``mu`` and ``L`` are shared coordinates, so the Jacobian is block triangular and (3) is the
log determinant of its ``z`` block, ``L^-1`` once per centred group. The density of ``phi``
is ``p(theta(phi)) |det dtheta/dphi|``, which is the model written with ``w``.

A model that writes the effect centred, ``ab ~ MvNormal(mu, chol=L)`` (the effect's
``centred`` flag), holds ``ab_j`` in those slots instead, and the same ``w_j`` give::

    ab_j = c_j w_j + (1 - c_j) (mu + L w_j)                                     (1c)
    w_j = c_j ab_j + (1 - c_j) L^-1 (ab_j - mu)                                 (2c)
    log |det dtheta/dphi| = (sum_j (1 - c_j)) sum_k log L_kk                    (3c)

In both, (3) and (3c) are ``sum_j (m - c_j)`` times ``sum_k log L_kk``, ``m`` the model's
own centredness (0 or 1).

:class:`CorrelatedReparam` is the map in numpy (draws back to the model's variables) and in
PyTensor (the layer's graphs in ``phi``), with the same interface as
:class:`~pymc_bigdata.model.reparam.LocScaleReparam`, so
:class:`~pymc_bigdata.model.reparam.LocScaleReparams` composes both kinds;
:func:`choose_correlated_centredness` is the rule for ``c_j``, from each group's information
(:func:`group_information`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytensor
import pytensor.tensor as pt

from pymc_bigdata.model.correlated_effects import CorrelatedEffect

__all__ = [
    "CENTRE_ABOVE",
    "CorrelatedReparam",
    "choose_correlated_centredness",
    "group_information",
]

#: a group is sampled centred where the geometric mean over its ``K`` directions of
#: ``1 + h`` exceeds ``1 + CENTRE_ABOVE`` (``h`` the eigenvalues of its rows' information
#: about ``z_j``): for ``K = 1`` this is ``h_j > 1``, where the scalar rule's
#: ``c_j = h_j / (1 + h_j)`` passes 1/2
CENTRE_ABOVE = 1.0


def group_information(
    effect: CorrelatedEffect,
    theta: np.ndarray,
    loglik_hvp: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """``H_j = -d^2 loglik / dt_j^2``, shape (J, K, K), at ``theta`` (the model's
    coordinates), ``t_j`` group ``j``'s own variable in the model: ``L' K_j L`` about ``z_j``
    (non-centred), ``K_j`` about ``ab_j`` (centred), with ``K_j`` group ``j``'s rows'
    precision about ``ab_j``.

    ``K`` full-data Hessian-vector products, one along each row of ``z`` (column of ``ab``),
    give the blocks where each row of data reads one group's effects; otherwise each block
    also sums in the group's coupling to the others (a block row sum of a fuller Hessian),
    which moves the choice of coordinates, never the target. Non-finite entries count as 0.
    """
    k, j = effect.n_effects, effect.n_groups
    columns = []
    for row in range(k):
        unit = np.zeros((k, j))
        unit[row] = 1.0
        direction = effect.with_matrix(np.zeros_like(theta), unit)
        columns.append(effect.matrix(-np.asarray(loglik_hvp(theta, direction))))
    blocks = np.stack(columns, axis=-1).transpose(1, 0, 2)  # [j, k', k]
    return np.nan_to_num(0.5 * (blocks + blocks.transpose(0, 2, 1)))


def choose_correlated_centredness(information: np.ndarray) -> np.ndarray:
    """``c_j`` in {0, 1} from each group's information ``H_j`` (shape (J, K, K),
    :func:`group_information`): 1 where its rows pin its effects down (see
    :data:`CENTRE_ABOVE`)."""
    eigenvalues = np.clip(np.linalg.eigvalsh(information), 0.0, None)
    mean_log = np.mean(np.log1p(eigenvalues), axis=-1)
    return (mean_log > np.log1p(CENTRE_ABOVE)).astype(np.float64)


class CorrelatedReparam:
    """Eqs. (1)-(3) for one correlated effect: the sampler's ``phi`` (``w`` in ``z``'s slots)
    and the model's ``theta``, all other entries shared. Vectors may carry leading batch
    axes (``phi[..., d]``).

    Parameters
    ----------
    effect
        The effect (from :func:`~pymc_bigdata.model.correlated_effects.
        find_correlated_effects`).
    centredness
        ``c_j`` in {0, 1}, one per group or one for all.
    """

    def __init__(self, effect: CorrelatedEffect, centredness: float | np.ndarray):
        self.effect = effect
        #: ``c_j`` in the symbolic map (a shared vector: compiled functions follow
        #: :meth:`set_centredness`)
        self.shared_centredness = pytensor.shared(np.zeros(effect.n_groups), effect.name + "_c")
        self.set_centredness(centredness)

    def set_centredness(self, centredness: float | np.ndarray) -> None:
        """Move to centredness ``c_j`` (0 or 1; one per group, or one for all)."""
        c = np.broadcast_to(np.asarray(centredness, dtype=np.float64), (self.effect.n_groups,))
        if not np.all((c == 0.0) | (c == 1.0)):
            raise ValueError(f"{self.effect.name}: centredness must be 0 or 1, got {c}.")
        self.centredness = c.copy()
        self.shared_centredness.set_value(self.centredness.copy())

    @property
    def moves_coordinates(self) -> bool:
        """Whether some group is sampled in other coordinates than the model writes it in."""
        return bool(np.any(self.centredness != self.effect.model_centredness))

    def key(self) -> bytes:
        """A key of the current centredness."""
        return self.centredness.tobytes()

    # ------------------------------------------------------------------ parts of a vector
    def _factor(self, x: np.ndarray) -> np.ndarray:
        """``L`` at ``x``, shape (..., K, K)."""
        return self.effect.factor(x)

    def _loc(self, x: np.ndarray) -> np.ndarray:
        """``mu`` at ``x``, shape (..., K, 1)."""
        return self.effect.loc(x)[..., None]

    # ------------------------------------------------------------------ the map
    def to_model(self, phi: np.ndarray) -> np.ndarray:
        """``theta`` at ``phi`` (Eq. 1; Eq. 1c for a centred model)."""
        phi = np.asarray(phi, dtype=np.float64)
        e, c = self.effect, self.centredness
        w = e.matrix(phi)
        if e.centred:
            effects = self._loc(phi) + self._factor(phi) @ w
            return e.with_matrix(phi, c * w + (1.0 - c) * effects)
        centred = np.linalg.solve(self._factor(phi), w - self._loc(phi))
        return e.with_matrix(phi, c * centred + (1.0 - c) * w)

    def from_model(self, theta: np.ndarray) -> np.ndarray:
        """``phi`` at ``theta`` (Eq. 2; Eq. 2c for a centred model)."""
        theta = np.asarray(theta, dtype=np.float64)
        e, c = self.effect, self.centredness
        if e.centred:
            ab = e.matrix(theta)
            z = np.linalg.solve(self._factor(theta), ab - self._loc(theta))
            return e.with_matrix(theta, c * ab + (1.0 - c) * z)
        z = e.matrix(theta)
        effects = self._loc(theta) + self._factor(theta) @ z
        return e.with_matrix(theta, c * effects + (1.0 - c) * z)

    def _moved_groups(self) -> float:
        """``sum_j (m - c_j)``: groups sampled non-centred in a centred model count +1,
        centred in a non-centred one -1 (Eqs. 3, 3c)."""
        return float(np.sum(self.effect.model_centredness - self.centredness))

    def log_jacobian(self, phi: np.ndarray) -> float | np.ndarray:
        """``log |det dtheta/dphi|`` at ``phi`` (Eq. 3); an array over leading batch axes."""
        phi = np.asarray(phi, dtype=np.float64)
        log_diagonal = phi[..., self.effect.scale_slice][..., self.effect.log_entries]
        out = self._moved_groups() * log_diagonal.sum(axis=-1)
        return float(out) if np.ndim(out) == 0 else out

    def pullback(self, phi: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        """The gradient in ``phi`` of ``f(to_model(phi)) + log_jacobian(phi)`` from
        ``grad_theta``, the gradient of ``f`` at ``to_model(phi)``."""
        phi = np.asarray(phi, dtype=np.float64)
        g = np.asarray(grad_theta, dtype=np.float64)
        e, c = self.effect, self.centredness
        chol = self._factor(phi)
        g_effect = e.matrix(g)
        if e.centred:  # theta_j = mu + L w_j on the groups with c_j = 0
            moved = (1.0 - c) * g_effect
            out = e.with_matrix(g, c * g_effect + np.swapaxes(chol, -1, -2) @ moved)
            grad_loc = moved.sum(axis=-1)
            grad_chol = moved @ np.swapaxes(e.matrix(phi), -1, -2)
        else:  # theta_j = L^-1 (w_j - mu) on the groups with c_j = 1
            # v = L^-T (c g_z): the cotangent of L^-1 (w - mu) on the centred groups
            v = np.linalg.solve(np.swapaxes(chol, -1, -2), c * g_effect)
            out = e.with_matrix(g, (1.0 - c) * g_effect + v)
            grad_loc = -v.sum(axis=-1)
            u = np.linalg.solve(chol, e.matrix(phi) - self._loc(phi))
            grad_chol = -v @ np.swapaxes(c * u, -1, -2)  # d/dL of <c g_z, L^-1 (w - mu)>
        if e.loc_slice is not None:
            out[..., e.loc_slice] += grad_loc
        grad_packed = grad_chol[..., e.rows, e.cols]
        diagonal = chol[..., e.rows, e.cols][..., e.log_entries]
        grad_packed[..., e.log_entries] *= diagonal  # the value is log L_kk there
        grad_packed[..., e.log_entries] += self._moved_groups()  # Eq. (3)
        out[..., e.scale_slice] += grad_packed
        return out

    # ------------------------------------------------------------------ in PyTensor
    def _symbolic_parts(self, phi: pt.TensorVariable) -> tuple:
        """``L`` and ``mu`` at the symbolic ``phi``, from basic indexing and elementwise
        operations only (see :func:`_forward_substitution`)."""
        e = self.effect
        packed = phi[e.scale_slice]
        logs = set(e.log_entries.tolist())
        chol = pt.zeros((e.n_effects, e.n_effects), dtype="float64")
        for entry, (row, col) in enumerate(zip(e.rows.tolist(), e.cols.tolist())):
            value = pt.exp(packed[entry]) if entry in logs else packed[entry]
            chol = pt.set_subtensor(chol[row, col], value)
        mu = pt.as_tensor(e.loc_value) if e.loc_slice is None else phi[e.loc_slice]
        return chol, mu

    def symbolic_effect(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """The model's ``z`` (shape (K, J)), or a centred model's ``ab`` (shape (J, K)), at
        the symbolic vector ``phi`` (Eqs. 1, 1c)."""
        e, c = self.effect, self.shared_centredness[None, :]
        chol, mu = self._symbolic_parts(phi)
        if e.centred:
            w = phi[e.effect_slice].reshape((e.n_groups, e.n_effects)).T
            effects = mu[:, None] + _lower_product(chol, w, e.n_effects)
            return (c * w + (1.0 - c) * effects).T
        w = phi[e.effect_slice].reshape((e.n_effects, e.n_groups))
        centred = _forward_substitution(chol, w - mu[:, None], e.n_effects)
        return c * centred + (1.0 - c) * w

    def symbolic_log_jacobian(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """``log |det dtheta/dphi|`` at the symbolic ``phi`` (Eq. 3)."""
        log_diagonal = phi[self.effect.scale_slice][self.effect.log_entries]
        moved = pt.sum(self.effect.model_centredness - self.shared_centredness)
        return moved * pt.sum(log_diagonal)


def _lower_product(chol: pt.TensorVariable, rhs: pt.TensorVariable, k: int):
    """``L rhs`` for a lower-triangular ``K x K`` ``chol``, row by row in elementwise
    operations (as :func:`_forward_substitution`, for the same reason)."""
    rows = []
    for i in range(k):
        value = chol[i, 0] * rhs[0]
        for j in range(1, i + 1):
            value = value + chol[i, j] * rhs[j]
        rows.append(value)
    return pt.stack(rows)


def _forward_substitution(chol: pt.TensorVariable, rhs: pt.TensorVariable, k: int):
    """``L^-1 rhs`` for a lower-triangular ``K x K`` ``chol``, row by row in elementwise
    operations: ``u_i = (rhs_i - sum_{l < i} L_il u_l) / L_ii``.

    Built, as ``L`` is, from elementwise operations and basic indexing only: with ``L`` built
    by advanced ``set_subtensor`` (as ``pm.expand_packed_triangular`` and the
    ``CholeskyCovPacked`` transform build the model's own) and solved by
    ``solve_triangular``, PyTensor 3.3's default rewrites miscompiled the second
    directional derivative of the row log-likelihood (the control variates'
    ``delta' H_k delta``): on a Gaussian likelihood, exactly quadratic in ``w``, AusterityMH's
    second-order residuals came out at 0.9 instead of 0 (right without rewrites, and right
    with ``L`` set entry by entry), and its chains diverged on every draw.
    ``tests/model/test_correlated_reparam.py`` checks those residuals."""
    rows = []
    for i in range(k):
        value = rhs[i]
        for j in range(i):
            value = value - chol[i, j] * rows[j]
        rows.append(value / chol[i, i])
    return pt.stack(rows)
