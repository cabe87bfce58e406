"""Loc-scale group effects: find them in a model's graph, and move them between centrings.

A hierarchical model's group effects ``a_j`` (``j = 1 .. J``) are written either *centred*,
``a ~ Normal(loc, scale)``, or *non-centred*, ``z ~ Normal(0, 1)`` and ``a = loc + scale * z``.
At big-data scale neither is right for every group: the rows of a data-rich group pin ``a_j``
down, so its ``z_j`` is tied to ``(loc, scale)`` along a narrow ridge, while a data-poor group
makes the centred form a funnel in ``(scale, a_j)``. A sampler does better in coordinates
``w_j`` centred per group (Gorinova, Moore & Hoffman 2020, "Automatic reparameterisation of
probabilistic programs"; NumPyro's ``LocScaleReparam``), with centredness ``c_j`` in [0, 1]::

    a_j = loc + scale**(1 - c_j) * (w_j - c_j * loc),    w_j ~ Normal(c_j * loc, scale**c_j)

(``c_j = 1``: ``w_j = a_j``; ``c_j = 0``: ``w_j = z_j``). The model's own variable is the case
``c_j = m`` with ``m = 1`` for a centred model (``t = a``) and ``m = 0`` for a non-centred one
(``t = z``), so both directions are one map from the sampler's ``w`` to the model's ``t``::

    t_j = m * loc + scale**(m - c_j) * (w_j - c_j * loc)                        (1)
    w_j = c_j * loc + scale**(c_j - m) * (t_j - m * loc)                        (2)
    log |det dtheta/dphi| = log(scale) * sum_j (m - c_j)                         (3)

Every other coordinate (``loc`` and ``scale`` included) is the same in both vectors, so the
Jacobian is block triangular and (3) is the product of its diagonal ``dt_j / dw_j``.

This module reads a PyMC model's graph: :func:`find_loc_scale_effects` returns a
:class:`~pymc_bigdata.model.loc_scale_effect.LocScaleEffect` record per effect it is sure
of (never a guess: anything else is simply not reported). The bijection (1)-(3) is in
:mod:`pymc_bigdata.model.reparam`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pymc as pm
from pymc.logprob.transforms import LogTransform
from pytensor.graph.basic import Variable
from pytensor.scalar import Add, Mul
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.basic import NormalRV, StudentTRV
from pytensor.tensor.subtensor import AdvancedSubtensor

from pymc_bigdata.model.group_index import (
    GroupIndex,
    group_index,
    other_uses,
    peel,
    row_index,
    view_name,
    walk,
)
from pymc_bigdata.model.group_index import constant_value as _constant
from pymc_bigdata.model.linear_loc import LinearLoc, linear_loc
from pymc_bigdata.model.loc_scale_effect import LocScaleEffect, drop_orphaned_parents
from pymc_bigdata.model.nested_loc import ParentLoc

__all__ = ["LocScaleEffect", "find_loc_scale_effects"]


# ---------------------------------------------------------------------------------------------
# detection


def find_loc_scale_effects(
    model: pm.Model,
    value_vars: Sequence[Variable] | None = None,
    point: Mapping[str, np.ndarray] | None = None,
) -> list[LocScaleEffect]:
    """The loc-scale group effects of ``model`` that its likelihood reads.

    Reported, and nothing else:

    * non-centred: a free vector ``z ~ Normal(0, 1)`` (constant mu 0 and sigma 1, no
      transform) entering the likelihood only through ``loc + scale * z`` (either order of
      either operation, ``pm.Deterministic`` wrappers allowed, or ``scale * z`` alone);
    * centred: a free vector ``a ~ Normal(loc, scale)`` (no transform) that the likelihood
      reads;
    * either of them with ``StudentT(nu, ...)`` in place of ``Normal(...)``, ``nu`` a
      constant or sampled (heavy-tailed effects: the same loc-scale maps);

    where ``scale`` is a sampled free variable of size 1, untransformed or log-transformed
    (``HalfNormal``, ``Exponential``, ``HalfCauchy`` ...), and ``loc`` a sampled,
    untransformed free variable of size 1, a constant, or another effect read at each
    group's parent, ``b[k]`` with a constant integer vector ``k`` of one entry per group
    (two levels: ``b`` a sampled untransformed free vector, or ``loc_b + scale_b * z_b`` as
    above; three levels and up: ``loc_b`` in turn a grandparents' effect ``c[m]``). Other
    shapes, priors, transforms or held variables give no record. A parents' ``b`` read only
    through the groups' ``loc`` is reported with ``children`` set: the non-centred one
    above, or a free vector ``b ~ Normal(loc_b, scale_b)`` (centred), whose ``loc_b`` may be
    a grandparents' effect, reported in the same way.

    Parameters
    ----------
    model
        The PyMC model.
    value_vars
        The value variables raveled into ``theta``, in order (default ``model.value_vars``,
        the order of ``DictToArrayBijection`` and of the layer's ``theta``).
    point
        A point giving each value variable's shape (default ``model.initial_point()``).

    Returns
    -------
    list of LocScaleEffect
        In the order of the effect variables in ``value_vars``.
    """
    value_vars = list(model.value_vars if value_vars is None else value_vars)
    point = model.initial_point() if point is None else point
    layout = _Layout(model, value_vars, point)
    free = set(model.free_RVs)
    read = walk(list(model.observed_RVs), blockers=free)
    found: dict[Variable, LocScaleEffect] = {}
    for var in _candidates(read):
        match = _match_noncentred(var, layout)
        if match is None or match[0] in found:
            continue
        z_rv, loc, scale, index = match
        if z_rv in walk(other_uses(model, z_rv), blockers=free | {var}):
            continue  # z reaches the model other than through this expression
        name = view_name(var, read) or z_rv.name
        group = group_index(var, read) if index is None else row_index(index)
        record = layout.record(name, False, z_rv, loc, scale, group)
        if record is not None:
            found[z_rv] = record
    for rv in model.free_RVs:
        match = _match_centred(rv, layout)
        if match is None or rv not in read:
            continue
        record = layout.record(rv.name, True, rv, *match, group_index(rv, read))
        if record is not None:
            found[rv] = record
    _mark_parents(found, layout, read)
    _drop_regressions_on_effects(found)
    order = {v: i for i, v in enumerate(value_vars)}
    effects = sorted(found.values(), key=lambda e: order[layout.value_of[e.effect]])
    return drop_orphaned_parents(effects)


def _mark_parents(found: dict[Variable, LocScaleEffect], layout: _Layout, read: set) -> None:
    """Mark each found effect's parents' effect ``b`` with ``children``: a non-centred ``b``
    found above (read only through its children's ``loc``), or a free vector
    ``b ~ Normal(loc, scale)`` the likelihood does not read (centred), whose own ``loc`` may
    be a grandparents' effect, marked in turn (three levels and up). A ``b`` that two
    effects nest in is left as it was found."""
    before, claimed = dict(found), set()
    pending = list(before.values())
    while pending:
        child = pending.pop(0)
        parent = child.parent
        rv = None if parent is None else layout.rv_at(parent.values_slice)
        if rv in claimed:
            found.pop(rv, None)
            found.update({rv: before[rv]} if rv in before else {})
        if rv is None or rv in claimed:
            continue
        claimed.add(rv)
        if rv in found:
            record = found[rv]
            if record.indexed_only and len(getattr(record.group, "shape", ())) == 1:
                if len(record.group) == len(parent.index):
                    found[rv] = replace(record, group=parent.index, children=child.name)
            continue
        match = _match_centred(rv, layout) if parent.scale_slice is None else None
        if match is None or rv in read or isinstance(match[0], LinearLoc):
            continue
        record = layout.record(rv.name, True, rv, *match, GroupIndex(parent.index, None, True))
        if record is not None:
            found[rv] = replace(record, children=child.name)
            pending.append(found[rv])


def _drop_regressions_on_effects(found: dict[Variable, LocScaleEffect]) -> None:
    """Drop the effects whose ``loc`` is a regression on another found effect's entries (the
    maps would then have to run in order, as for nested groups; not built)."""
    effects = {k for e in found.values() for k in range(e.effect_slice.start, e.effect_slice.stop)}
    for rv, record in list(found.items()):
        if record.linear_loc is not None and record.linear_loc.slots() & effects:
            del found[rv]


class _Layout:
    """Where each free variable's value sits in ``theta``, and what may be an effect's part."""

    def __init__(
        self, model: pm.Model, value_vars: list[Variable], point: Mapping[str, np.ndarray]
    ):
        self.model = model
        self.slices: dict[Variable, slice] = {}
        self.value_of: dict[str, Variable] = {}
        start = 0
        for var in value_vars:
            size = int(np.prod(np.shape(point[var.name])))
            self.slices[var] = slice(start, start + size)
            self.value_of[var.name] = var
            start += size

    def rv_at(self, values_slice: slice) -> Variable | None:
        """The free variable whose value fills ``values_slice`` of ``theta``."""
        for value, sl in self.slices.items():
            if sl == values_slice:
                return self.model.values_to_rvs[value]
        return None

    def transform(self, rv: Variable):
        return self.model.rvs_to_transforms.get(rv)

    def sampled(self, rv: Variable) -> slice | None:
        """``rv``'s slice of ``theta`` where it is a sampled free variable, else None."""
        value = self.model.rvs_to_values.get(rv)
        if rv not in self.model.free_RVs or value not in self.slices:
            return None
        return self.slices[value]

    def scalar(self, var: Variable) -> Variable | None:
        """The free variable of size 1 behind ``var`` (broadcasts and views peeled)."""
        rv = peel(var, broadcasts=True)
        sl = self.sampled(rv)
        if sl is None or sl.stop - sl.start != 1 or not rv.dtype.startswith("float"):
            return None
        return rv

    def loc(
        self, var: Variable, n_groups: int, rows: np.ndarray | None = None
    ) -> Variable | float | ParentLoc | LinearLoc | None:
        """An untransformed sampled scalar free variable, a constant (its float), another
        effect read at each group's parent (:meth:`parent`), or a regression on group-level
        covariates of ``n_groups`` entries, or written per row with the group of each row
        ``rows`` (:func:`~pymc_bigdata.model.linear_loc.linear_loc`)."""
        value = _constant(var)
        if value is not None:
            return float(value.ravel()[0]) if value.size == 1 else None
        rv = self.scalar(var)
        if rv is not None:
            return rv if self.transform(rv) is None else None
        free = set(self.model.free_RVs)
        return self.parent(var) or linear_loc(var, n_groups, free, self.untransformed, rows)

    def untransformed(self, rv: Variable) -> slice | None:
        """``rv``'s slice of ``theta`` where it is sampled, float and untransformed."""
        sl = self.sampled(rv)
        ok = sl is not None and rv.dtype.startswith("float") and self.transform(rv) is None
        return sl if ok else None

    def parent(self, var: Variable) -> ParentLoc | None:
        """``b[k]`` with a constant integer vector ``k``, where ``b`` is a sampled
        untransformed free vector or ``loc_b + scale_b * z_b`` (a non-centred effect whose
        own ``loc_b`` is a scalar, a constant, or the grandparents' effect ``c[m]`` with one
        entry per parent: three levels and up)."""
        indexing = peel(var)
        b, k = _indexed(indexing)
        k = None if k is None else _constant(k)
        if k is None or k.ndim != 1:
            return None
        k = k.astype(np.int64)
        if self.vector(b):
            return ParentLoc(b.name, self.sampled(b), k)
        name = indexing.owner.inputs[0].name  # a pm.Deterministic's, before peeling
        match = _match_noncentred(b, self)
        if match is None or match[3] is not None or isinstance(match[1], LinearLoc):
            return None
        z, loc, scale, _ = match
        grandparents = loc if isinstance(loc, ParentLoc) else None
        if grandparents is not None and not self._fits(grandparents, z, scale):
            return None
        loc_free = isinstance(loc, Variable)
        return ParentLoc(
            name=name or z.name,
            values_slice=self.sampled(z),
            index=k,
            loc_slice=self.sampled(loc) if loc_free else None,
            loc_value=float(loc) if isinstance(loc, float) else 0.0,
            scale_slice=self.sampled(scale),
            scale_transform="log" if self.transform(scale) is not None else None,
            loc_parent=grandparents,
        )

    def _fits(self, parents: ParentLoc, effect: Variable, scale: Variable) -> bool:
        """``parents`` can be ``effect``'s ``loc``: one entry per group, reading neither
        the effect's entries nor its scale's."""
        own = self.sampled(effect)
        used = parents.slots()
        return (
            len(parents.index) == own.stop - own.start
            and not used & set(range(own.start, own.stop))
            and self.sampled(scale).start not in used
        )

    def scale(self, var: Variable) -> Variable | None:
        """A sampled scalar free variable, untransformed or log-transformed."""
        rv = self.scalar(var)
        if rv is None:
            return None
        transform = self.transform(rv)
        return rv if transform is None or isinstance(transform, LogTransform) else None

    def vector(self, rv: Variable) -> bool:
        """``rv`` is a sampled, untransformed, float vector free variable."""
        return (
            self.sampled(rv) is not None
            and rv.ndim == 1
            and rv.dtype.startswith("float")
            and self.transform(rv) is None
        )

    def record(
        self,
        name: str,
        centred: bool,
        effect: Variable,
        loc: Variable | float | ParentLoc | LinearLoc,
        scale: Variable,
        group: GroupIndex,
    ) -> LocScaleEffect | None:
        """The record; None where a vector ``loc`` does not fit the effect (not one entry
        per group, or reading the effect or its scale)."""
        values = self.model.rvs_to_values
        effect_slice = self.sampled(effect)
        parent = loc if isinstance(loc, ParentLoc) else None
        regression = loc if isinstance(loc, LinearLoc) else None
        if parent is not None and not self._fits(parent, effect, scale):
            return None
        if regression is not None:
            own = set(range(effect_slice.start, effect_slice.stop))
            used = regression.slots()
            if regression.n_groups != len(own) or own & used or self.sampled(scale).start in used:
                return None
        if parent is not None or regression is not None:
            loc = 0.0
        loc_free = isinstance(loc, Variable)
        return LocScaleEffect(
            name=name,
            centred=centred,
            effect=values[effect].name,
            effect_slice=effect_slice,
            loc=values[loc].name if loc_free else None,
            loc_slice=self.sampled(loc) if loc_free else None,
            loc_value=0.0 if loc_free else float(loc),
            scale=values[scale].name,
            scale_slice=self.sampled(scale),
            scale_transform="log" if self.transform(scale) is not None else None,
            group=group.rows,
            group_var=group.var,
            indexed_only=group.indexed_only,
            parent=parent,
            linear_loc=regression,
        )


def _elemwise(var: Variable, scalar_op: type) -> list[Variable] | None:
    """The two inputs of ``var`` where it is an elementwise binary ``scalar_op``."""
    node = var.owner
    if node is None or not isinstance(node.op, Elemwise) or len(node.inputs) != 2:
        return None
    return list(node.inputs) if isinstance(node.op.scalar_op, scalar_op) else None


def _candidates(read: set[Variable]) -> list[Variable]:
    """The sums and products the likelihood reads, sums first (``loc + scale * z`` before
    its ``scale * z``), in a fixed order."""
    sums = [v for v in read if _elemwise(v, Add) is not None]
    products = [v for v in read if _elemwise(v, Mul) is not None]
    return sorted(sums, key=id) + sorted(products, key=id)


def _match_noncentred(
    var: Variable, layout: _Layout
) -> tuple[Variable, Variable | float, Variable, Variable | None] | None:
    """``(z, loc, scale, g)`` where ``var`` is ``loc + scale * z`` (or ``scale * z``), or the
    same per row, ``loc + scale * z[g]`` (then ``g``, else None)."""
    if var.ndim != 1:
        return None
    terms = _elemwise(var, Add)
    if terms is None:
        match = _match_product(var, layout)
        return None if match is None else (match[0], 0.0, match[1], match[2])
    for loc_term, product in (terms, terms[::-1]):
        match = _match_product(peel(product), layout)
        if match is None:
            continue
        rows = None if match[2] is None else row_index(match[2]).rows
        loc = layout.loc(loc_term, _size(match[0], layout), rows)
        if loc is not None and all(loc is not v for v in match[:2]):
            return match[0], loc, match[1], match[2]
    return None


def _match_product(
    var: Variable, layout: _Layout
) -> tuple[Variable, Variable, Variable | None] | None:
    """``(z, scale, g)`` where ``var`` is ``scale * z`` with ``z ~ Normal(0, 1)`` (``g``
    None), or ``scale * z[g]`` with a 1-d integer index ``g``."""
    factors = _elemwise(var, Mul)
    if factors is None or var.ndim != 1:
        return None
    for scale_factor, z_factor in (factors, factors[::-1]):
        z_rv, index = _indexed(peel(z_factor))
        scale = layout.scale(scale_factor)
        if scale is not None and scale is not z_rv and _standard_normal(z_rv, layout):
            return z_rv, scale, index
    return None


def _indexed(var: Variable) -> tuple[Variable, Variable | None]:
    """``(z, g)`` where ``var`` is ``z[g]`` with a 1-d integer index, else ``(var, None)``."""
    node = var.owner
    if node is None or not isinstance(node.op, AdvancedSubtensor) or len(node.inputs) != 2:
        return var, None
    index = node.inputs[1]
    if index.ndim != 1 or not index.dtype.startswith(("int", "uint")):
        return var, None
    return peel(node.inputs[0]), index


def _loc_scale_params(rv: Variable, layout: _Layout) -> tuple[Variable, Variable] | None:
    """``(mu, sigma)`` of a sampled untransformed vector ``rv`` of a loc-scale family:
    ``Normal(mu, sigma)``, or ``StudentT(nu, mu, sigma)`` with ``nu`` constant or sampled.

    The maps of :mod:`~pymc_bigdata.model.reparam` and :mod:`~pymc_bigdata.model.whitening`
    hold for any loc-scale prior (the prior, ``nu`` included, stays the model's); only the
    centring rule's reading of the groups is Gaussian."""
    if rv.owner is None or not layout.vector(rv):
        return None
    op = rv.owner.op
    if type(op) is NormalRV:
        return tuple(op.dist_params(rv.owner))
    if type(op) is StudentTRV:
        _, mu, sigma = op.dist_params(rv.owner)  # nu: a constant or sampled, either way
        return mu, sigma
    return None


def _standard_normal(rv: Variable, layout: _Layout) -> bool:
    """``rv`` is a sampled untransformed vector ``Normal(0, 1)`` (or standard Student-t:
    :func:`_loc_scale_params`)."""
    params = _loc_scale_params(rv, layout)
    if params is None:
        return False
    mu, sigma = (_constant(p) for p in params)
    return mu is not None and sigma is not None and np.all(mu == 0.0) and np.all(sigma == 1.0)


def _match_centred(rv: Variable, layout: _Layout) -> tuple[Variable | float, Variable] | None:
    """``(loc, scale)`` where the free variable ``rv`` is a vector ``Normal(loc, scale)``
    (or ``StudentT(nu, loc, scale)``: :func:`_loc_scale_params`)."""
    params = _loc_scale_params(rv, layout)
    if params is None:
        return None
    mu, sigma = params
    loc, scale = layout.loc(mu, _size(rv, layout)), layout.scale(sigma)
    if loc is None or scale is None or loc is scale:
        return None
    return loc, scale


def _size(rv: Variable, layout: _Layout) -> int:
    """The number of entries of the sampled vector ``rv``."""
    sl = layout.sampled(rv)
    return sl.stop - sl.start
