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

from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt

from pymc_bigdata.model.loc_scale import LocScaleEffect
from pymc_bigdata.model.nested_loc import (
    Written,
    add_loc_pullback,
    effect_loc,
    effect_log_scale,
    loc_slots,
    symbolic_loc_scale,
)
from pymc_bigdata.model.whitening import WhitenedLocScale

__all__ = ["LocScaleReparam", "LocScaleReparams", "choose_centredness"]


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

    @property
    def moves_coordinates(self) -> bool:
        """Whether some group is sampled at another centredness than the model's own."""
        return bool(np.any(self.centredness != self.effect.model_centredness))

    def key(self) -> bytes:
        """A key of the current centredness (a layer's MAP and fits depend on it)."""
        return self.centredness.tobytes()

    # ------------------------------------------------------------------ parts of a vector
    def _loc(self, x: np.ndarray) -> np.ndarray:
        return effect_loc(self.effect, x)

    def _log_scale(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return effect_log_scale(self.effect, x)

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
    def symbolic_effect(
        self, phi: pt.TensorVariable, written: Written | None = None
    ) -> pt.TensorVariable:
        """The model's effect variable ``t`` (shape (J,)) at the symbolic vector ``phi``
        (Eq. 1), its parents' values read from ``written`` where it holds them."""
        e, c, m = self.effect, self.shared_centredness, self.effect.model_centredness
        loc, log_scale = symbolic_loc_scale(e, phi, written)
        factor = pt.exp(log_scale * (m - c))
        return m * loc + factor * (phi[e.effect_slice] - c * loc)

    def symbolic_log_jacobian(self, phi: pt.TensorVariable) -> pt.TensorVariable:
        """``log |det dtheta/dphi|`` at the symbolic ``phi`` (Eq. 3)."""
        power = self.effect.model_centredness - self.shared_centredness
        return symbolic_loc_scale(self.effect, phi)[1] * pt.sum(power)

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
        add_loc_pullback(e, phi, through_loc, out)
        # dt_j / dlog(scale) = (m - c_j) t_j-part, and d log|J| / dlog(scale) = sum (m - c_j)
        shift = self.power * factor * (phi[..., sl] - c * loc)
        through = np.sum(g_t * shift, axis=-1, keepdims=True) + self.power.sum()
        out[..., ssl] += d_log_scale * through
        return out


class LocScaleReparams:
    """Several :class:`LocScaleReparam` (or :class:`~pymc_bigdata.model.whitening.
    WhitenedLocScale`) at once: the effects on disjoint slots, no effect's
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

    def __init__(self, reparams: Sequence[LocScaleReparam | WhitenedLocScale]):
        self.reparams = list(reparams)
        slots = [_slots(r.effect.effect_slice) for r in self.reparams]
        for i, r in enumerate(self.reparams):
            for j, other in enumerate(self.reparams):
                e = other.effect
                used = [e.scale_slice] + ([e.effect_slice] if i != j else [])
                taken = set().union(loc_slots(e) - _parent_slots(e), *map(_slots, used))
                if slots[i] & taken:
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
        return any(r.moves_coordinates for r in self.reparams)

    @property
    def parents_first(self) -> list[int]:
        """Indices of :attr:`reparams`, each effect before those nested in it."""
        return list(self._order)

    def key(self) -> bytes:
        """A key of the current maps (a layer's MAP and fits depend on it)."""
        return b"".join(r.key() for r in self.reparams)

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
        first; a parent's value is what its children read as their ``loc``)."""
        out, written = {}, {}
        for i in self._order:
            r = self.reparams[i]
            nested = r.effect.parent is not None
            value = r.symbolic_effect(phi, written) if nested else r.symbolic_effect(phi)
            out[r.effect.effect] = value
            if self._feeds[i]:
                written[r.effect.effect_slice.start] = value
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


def _parent_slots(effect: LocScaleEffect) -> set[int]:
    """The entries a nested effect's ``loc`` reads (its parents': ordered, not shared)."""
    return set() if effect.parent is None else effect.parent.slots()


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
