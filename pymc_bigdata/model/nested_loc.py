"""A group effect's ``loc`` that is another group effect: groups nested in parents.

In a two-level hierarchy the group effects' ``loc`` is a vector read through each group's
parent ``k_j``::

    a_j ~ Normal(b[k_j], scale)            (centred)
    a = b[k] + scale * z                    (non-centred)

where the parents' effects ``b`` are a free vector (``b ~ Normal(mu, tau_b)``, the centred
form) or ``b = loc_b + scale_b * z_b`` with a standard-normal free vector ``z_b`` (the
non-centred form). In three levels the parents' own ``loc_b`` is in turn an effect read at
each parent's parent, ``c[m_k]`` (countries above regions above groups): ``loc_b`` is then a
:class:`ParentLoc` itself (:attr:`ParentLoc.loc_parent`), and so on up. :class:`ParentLoc`
is that ``loc_j = b[k_j]`` as a function of the raveled value vector ``x``, in numpy (with
its vector-Jacobian product) and in PyTensor, so that
:class:`~pymc_bigdata.model.reparam.LocScaleReparam` can centre the groups about their
parents as it centres one-level groups about a scalar ``loc``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt

__all__ = [
    "ParentLoc",
    "Written",
    "add_loc_pullback",
    "effect_loc",
    "effect_log_scale",
    "loc_slots",
    "log_scale_of",
    "symbolic_loc_scale",
]


#: the model's values of effects the sampler holds in other coordinates, by first entry
Written = Mapping[int, pt.TensorVariable]


def log_scale_of(value: np.ndarray, transform: str | None) -> tuple[np.ndarray, np.ndarray]:
    """``log(scale)`` and its derivative in the scale's value: the value itself (``"log"``,
    derivative 1) or ``log |value|`` (no transform, derivative ``1 / value``)."""
    if transform == "log":
        return value, np.ones_like(value)
    return np.log(np.abs(value)), 1.0 / value


def _vector_loc(effect):
    """The effect's vector ``loc`` (a :class:`ParentLoc` or a
    :class:`~pymc_bigdata.model.linear_loc.LinearLoc`), or None."""
    return effect.parent if effect.parent is not None else effect.linear_loc


def effect_loc(effect, x: np.ndarray) -> np.ndarray:
    """A loc-scale effect's ``loc`` at ``x`` (shape ``(..., d)``): shape (..., 1), or
    (..., J) for groups nested in parents (``effect.parent``) or a regression on group-level
    covariates (``effect.linear_loc``)."""
    vector = _vector_loc(effect)
    if vector is not None:
        return vector.value(x)
    if effect.loc_slice is None:
        return np.full(x.shape[:-1] + (1,), effect.loc_value)
    return x[..., effect.loc_slice]


def effect_log_scale(effect, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A loc-scale effect's ``log(scale)`` at ``x`` and its derivative in the scale's value,
    shape (..., 1) each."""
    return log_scale_of(x[..., effect.scale_slice], effect.scale_transform)


def symbolic_loc_scale(effect, x: pt.TensorVariable, written: Written | None = None) -> tuple:
    """A loc-scale effect's ``loc`` (a scalar, or (J,) for a vector ``loc``) and
    ``log(scale)`` at the symbolic vector ``x``; a parents' effect's values are read from
    ``written`` where it holds them (:class:`ParentLoc`)."""
    if effect.parent is not None:
        loc = effect.parent.symbolic(x, written)
    elif effect.linear_loc is not None:
        loc = effect.linear_loc.symbolic(x)
    else:
        loc = effect.loc_value if effect.loc_slice is None else x[effect.loc_slice][0]
    value = x[effect.scale_slice][0]
    log_scale = value if effect.scale_transform == "log" else pt.log(pt.abs(value))
    return loc, log_scale


def add_loc_pullback(effect, x: np.ndarray, cotangent: np.ndarray, out: np.ndarray) -> None:
    """Add ``(d loc / d x)' cotangent`` to ``out`` (both ``(..., d)``; ``cotangent`` one per
    group, ``(..., J)``)."""
    vector = _vector_loc(effect)
    if vector is not None:
        vector.add_pullback(x, cotangent, out)
    elif effect.loc_slice is not None:
        out[..., effect.loc_slice] += np.sum(cotangent, axis=-1, keepdims=True)


def loc_slots(effect) -> set[int]:
    """The entries of ``x`` that the effect's ``loc`` reads."""
    vector = _vector_loc(effect)
    if vector is not None:
        return vector.slots()
    sl = effect.loc_slice
    return set() if sl is None else set(range(sl.start, sl.stop))


@dataclass(frozen=True, eq=False)
class ParentLoc:
    """``loc_j = b[k_j]``: the parents' effects ``b`` read at each group's parent ``k_j``.

    Attributes
    ----------
    name : str
        The parents' effect (the free vector ``b``, or the ``pm.Deterministic`` holding
        ``loc_b + scale_b * z_b``).
    values_slice : slice
        The entries of ``x`` the parents' effects are made of: ``b`` itself, or ``z_b``.
    index : ndarray of int, shape (J,)
        ``k_j``, each group's parent.
    loc_slice : slice or None
        ``loc_b``'s entry (size 1) where ``b = loc_b + scale_b * z_b`` with a free
        ``loc_b``; None where ``loc_b`` is :attr:`loc_value`, :attr:`loc_parent`, or ``b``
        is free.
    loc_value : float
        A constant ``loc_b``.
    scale_slice : slice or None
        ``scale_b``'s entry (size 1); None where ``b`` is the free vector itself.
    scale_transform : str or None
        ``"log"`` where ``scale_b``'s value is its log.
    loc_parent : ParentLoc or None
        Three levels: ``loc_b`` is the grandparents' effect read at each parent's parent,
        ``c[m_k]`` (one entry per parent), where ``b = c[m] + scale_b * z_b``; None
        otherwise.
    """

    name: str
    values_slice: slice
    index: np.ndarray
    loc_slice: slice | None = None
    loc_value: float = 0.0
    scale_slice: slice | None = None
    scale_transform: str | None = None
    loc_parent: ParentLoc | None = None

    def slots(self) -> set[int]:
        """The entries of ``x`` that ``loc`` reads (the grandparents' too)."""
        used = [self.values_slice, self.loc_slice, self.scale_slice]
        own = {k for s in used if s is not None for k in range(s.start, s.stop)}
        return own if self.loc_parent is None else own | self.loc_parent.slots()

    def _parent_loc(self, x: np.ndarray) -> np.ndarray:
        """``loc_b`` at ``x``: shape (..., 1), or (..., K) read from the grandparents."""
        if self.loc_parent is not None:
            return self.loc_parent.value(x)
        if self.loc_slice is None:
            return np.full(x.shape[:-1] + (1,), self.loc_value)
        return x[..., self.loc_slice]

    def value(self, x: np.ndarray) -> np.ndarray:
        """``loc_j`` at ``x`` (shape ``(..., d)``), shape ``(..., J)``."""
        values = x[..., self.values_slice]
        if self.scale_slice is not None:
            log_scale = log_scale_of(x[..., self.scale_slice], self.scale_transform)[0]
            values = self._parent_loc(x) + np.exp(log_scale) * values
        return values[..., self.index]

    def symbolic(self, x: pt.TensorVariable, written: Written | None = None) -> pt.TensorVariable:
        """``loc_j`` at the symbolic vector ``x``, shape (J,). ``written`` maps the first
        entry of an effect's slots to its values in the model's coordinates, where they are
        not ``x``'s (the sampler's ``w``, mapped parents first): the parents' values are
        read there."""
        start = self.values_slice.start
        values = x[self.values_slice] if not written or start not in written else written[start]
        if self.scale_slice is not None:
            value = x[self.scale_slice][0]
            scale = pt.exp(value) if self.scale_transform == "log" else pt.abs(value)
            if self.loc_parent is not None:
                loc = self.loc_parent.symbolic(x, written)
            else:
                loc = self.loc_value if self.loc_slice is None else x[self.loc_slice][0]
            values = loc + scale * values
        return values[self.index]

    def add_pullback(self, x: np.ndarray, cotangent: np.ndarray, out: np.ndarray) -> None:
        """Add ``(d loc / d x)' cotangent`` to ``out`` (both ``(..., d)``; ``cotangent`` is
        ``(..., J)``)."""
        per_parent = np.zeros(x.shape[:-1] + (self.values_slice.stop - self.values_slice.start,))
        np.add.at(per_parent, (..., self.index), cotangent)
        if self.scale_slice is None:
            out[..., self.values_slice] += per_parent
            return
        log_scale, d_log_scale = log_scale_of(x[..., self.scale_slice], self.scale_transform)
        scale = np.exp(log_scale)
        out[..., self.values_slice] += scale * per_parent
        through_scale = np.sum(per_parent * x[..., self.values_slice], axis=-1, keepdims=True)
        out[..., self.scale_slice] += d_log_scale * scale * through_scale
        if self.loc_parent is not None:
            self.loc_parent.add_pullback(x, per_parent, out)
        elif self.loc_slice is not None:
            out[..., self.loc_slice] += np.sum(per_parent, axis=-1, keepdims=True)
