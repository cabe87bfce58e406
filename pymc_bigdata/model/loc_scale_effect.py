"""A loc-scale group effect's record: where its effect, ``loc`` and ``scale`` sit in the
raveled value vector ``theta``, how the likelihood reads it, and the effects it nests in or
that nest in it (:mod:`pymc_bigdata.model.loc_scale` finds them in a model's graph)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
from pytensor.graph.basic import Variable

from pymc_bigdata.model.linear_loc import LinearLoc
from pymc_bigdata.model.nested_loc import ParentLoc

__all__ = ["LocScaleEffect", "drop_orphaned_parents"]


@dataclass(frozen=True, eq=False)
class LocScaleEffect:
    """One loc-scale group effect of a model, located in the raveled value vector ``theta``.

    Attributes
    ----------
    name : str
        The effect's name: the ``pm.Deterministic`` holding ``loc + scale * z`` (else the
        name of ``z``) for a non-centred effect, the free variable ``a`` for a centred one.
    centred : bool
        The model samples ``a ~ Normal(loc, scale)`` itself (True) or ``z ~ Normal(0, 1)``
        with ``a = loc + scale * z`` (False).
    effect : str
        Name of the value variable of ``a`` (centred) or ``z`` (non-centred).
    effect_slice : slice
        Its ``J`` entries in ``theta``.
    loc : str or None
        Name of the (untransformed, size-1) value variable of ``loc``; None where ``loc`` is
        the constant :attr:`loc_value`, the parents' effects :attr:`parent` or a regression
        :attr:`linear_loc`.
    loc_slice : slice or None
        Its entry in ``theta`` (None for a constant or a parent's ``loc``).
    loc_value : float
        The constant ``loc`` (0.0 for ``a = scale * z``); unused where :attr:`loc` or
        :attr:`parent` is set.
    scale : str
        Name of the (size-1) value variable of ``scale``, e.g. ``tau_log__``.
    scale_slice : slice
        Its entry in ``theta``.
    scale_transform : {"log", None}
        ``"log"``: the value is ``log(scale)``; None: the value is ``scale`` itself.
    group : ndarray of int or None
        The row data ``g`` of the likelihood's only read of the effect, ``a[g]``: the group
        of each row. None where the effect is read otherwise too, through several index
        arrays, or through a ``pmbd.Data`` column (held out of memory; see
        :attr:`group_var`).
    group_var : Variable or None
        The data variable behind ``g`` (a constant, ``pm.Data`` or ``pmbd.Data``), if found.
    indexed_only : bool
        The likelihood reads the effect only as ``a[g]`` with this one index ``g`` (one entry
        per row): the log-likelihood's Hessian in the effect is then diagonal.
    parent : ParentLoc or None
        Groups nested in parents: ``loc_j = b[k_j]``, another effect read at each group's
        parent (:mod:`pymc_bigdata.model.nested_loc`); None for a scalar or constant ``loc``.
    children : str or None
        The effect of that name nests in this one (its ``loc`` is ``b[k]``, :attr:`group`
        is ``k``) and is the likelihood's only read of it (``group_fit.fit_parent``).
    linear_loc : LinearLoc or None
        ``loc_j`` a regression on group-level covariates (:mod:`~pymc_bigdata.model.
        linear_loc`); None otherwise.
    """

    name: str
    centred: bool
    effect: str
    effect_slice: slice
    loc: str | None
    loc_slice: slice | None
    loc_value: float
    scale: str
    scale_slice: slice
    scale_transform: str | None
    group: np.ndarray | None = field(default=None, repr=False)
    group_var: Variable | None = field(default=None, repr=False)
    indexed_only: bool = False
    parent: ParentLoc | None = None
    children: str | None = None
    linear_loc: LinearLoc | None = None

    @property
    def n_groups(self) -> int:
        """``J``, the number of group effects."""
        return self.effect_slice.stop - self.effect_slice.start

    @property
    def model_centredness(self) -> float:
        """``m`` of Eq. (1): 1.0 for a centred model, 0.0 for a non-centred one."""
        return 1.0 if self.centred else 0.0

    def group_counts(self) -> np.ndarray | None:
        """Rows per group, shape (J,) (None where :attr:`group` is unknown)."""
        if self.group is None:
            return None
        return np.bincount(np.ravel(self.group), minlength=self.n_groups)[: self.n_groups]


def drop_orphaned_parents(effects: Iterable[LocScaleEffect]) -> list[LocScaleEffect]:
    """``effects`` without parents' effects whose ``children`` are not among them: a centred
    one (read only through its children) dropped, a non-centred one (read from its rows)
    without ``children``; until none is left, up the levels. The order is kept."""
    kept = {e.name: e for e in effects}
    orphans = True
    while orphans:
        orphans = [e for e in kept.values() if e.children and e.children not in kept]
        for effect in orphans:
            if effect.centred:
                del kept[effect.name]
            else:
                kept[effect.name] = replace(effect, children=None)
    return list(kept.values())
