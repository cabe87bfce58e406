"""Where a step samples: the model's own coordinates, or per-group whitened or centred ones.

A hierarchical model's loc-scale group effects (:mod:`pymc_bigdata.model.loc_scale`) are
written centred or non-centred, and at big-data scale neither suits every group: a
data-rich group's ``z_j`` is tied to ``(loc, scale)`` along a narrow ridge in the
non-centred form, a data-poor group makes the centred form a funnel. With
``reparameterize="auto"`` (the default) a step samples each effect in coordinates that follow
how much its rows say about each group (each group's curvature at the model's MAP and the
scale of the posterior's bulk, :func:`~pymc_bigdata.model.group_fit.fit_groups`): each group
centred at the bulk's scale (``"centre"``, the default,
:func:`~pymc_bigdata.model.reparam.choose_centredness`) or, when asked for, whitened by its
conditional posterior at every scale (``"whiten"``, :mod:`~pymc_bigdata.model.whitening`),
through a layer of the same model in those coordinates
(:meth:`~pymc_bigdata.MinibatchModel.reparameterised`); the draws are mapped back to the
model's own variables, so the user's model and the result's variables are unchanged.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import partial

import numpy as np

from pymc_bigdata.model.bulk_fit import bulk_reading
from pymc_bigdata.model.correlated_effects import find_correlated_effects
from pymc_bigdata.model.correlated_fit import correlated_bulk_point, fit_correlated_groups
from pymc_bigdata.model.correlated_reparam import CorrelatedReparam, choose_correlated_centredness
from pymc_bigdata.model.group_fit import GroupFit, bulk_point, fit_groups, fit_parent, scale_at
from pymc_bigdata.model.loc_scale import LocScaleEffect, find_loc_scale_effects
from pymc_bigdata.model.loc_scale_effect import drop_orphaned_parents
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams, choose_centredness
from pymc_bigdata.model.whitening import ChildrenReading, WhitenedLocScale

__all__ = [
    "BULK_SCALE_RATIO",
    "NON_CENTRED_BELOW",
    "PARENT_SCALE_SDS",
    "REPARAMETERIZE_AUTO",
    "REPARAM_MIN_CHANGE",
    "check_reparameterize",
    "loc_scale_effects",
    "sampling_layer",
]

#: the model's own parameterisation is kept unless some group's centredness would move by
#: more than this from it (0 or 1): below it the two coordinates differ too little to pay
#: for a second layer (its compile and its MAP search)
REPARAM_MIN_CHANGE = 0.25

#: ... and unless the scale at the model's MAP is off the bulk's (the mode of its marginal
#: posterior, :func:`~pymc_bigdata.model.group_fit.fit_groups`) by more than this factor: a
#: centred model's MAP search can end where the scale and the effects collapse together
BULK_SCALE_RATIO = 2.0

#: a group whose rule gives ``c_j`` below this is sampled non-centred (``c_j = 0``): in any
#: coordinates with ``c_j > 0`` the log density grows as ``-sum_j c_j log(scale)`` where the
#: scale and the data-poor groups' effects go to 0 together, and when every group is
#: data-poor no mode separates the bulk from that spike, so the MAP search slides into it
#: (seen on a centred model of 20 groups of 5 rows: ``c = 0.13``). Below it, ``h_j < 1/3``
#: at the bulk's scale, so across scales up to twice the bulk's the non-centred ``z_j``'s
#: conditional sd changes by less than a factor 1.6.
NON_CENTRED_BELOW = 0.25

#: A parents' effect (regions above groups) has few groups, so its scale's marginal
#: posterior is wide, and where the scale is small a partly centred parent keeps part of the
#: funnel: its information is read at the scale this many posterior sds (of ``log scale``)
#: below the fit's mode. Measured on ``sparse_regions`` (12 regions, 9 data-poor), SGHMC: at
#: 0 a chain crawled (ESS 13, 1.2 sd off); at 2 and at "all non-centred" it did not.
PARENT_SCALE_SDS = 2.0

#: what ``reparameterize="auto"`` (the default) samples in: ``"centre"``, a centredness per
#: group fixed at the bulk's scale (:func:`~pymc_bigdata.model.reparam.choose_centredness`),
#: or ``"whiten"``, each group's effect standardised by its conditional posterior at every
#: scale (:mod:`~pymc_bigdata.model.whitening`). Measured (docs/hierarchies.md): whitened,
#: ``sparse_regions``' ``log tau_b`` is no longer short over the seeds; on the crossed ratings
#: it failed (SGHMC 0.654 sd) until its groups were read at the centring's mode (3880b9c:
#: SGHMC 0.091 and 0.086, SGLD and EWSG off their bars as in the centring), and on nine other
#: hierarchies it measured no better than the centring (seed 1, every sampler: 52 quiet within
#: the bars, 5 alarmed, 6 off and silent, against 60, 1, 2), so it stays asked for.
REPARAMETERIZE_AUTO = "centre"


def check_reparameterize(value: bool | str) -> str | None:
    """The coordinates asked for: ``"auto"``/``True`` the default (``REPARAMETERIZE_AUTO``),
    ``"whiten"`` (:mod:`~pymc_bigdata.model.whitening`), ``"centre"`` (per-group
    centredness at the bulk's scale, :mod:`~pymc_bigdata.model.reparam`), ``False``/None the
    model's own coordinates."""
    if value in ("auto", True):
        return REPARAMETERIZE_AUTO
    if value in ("whiten", "centre"):
        return value
    if value is False:
        return None
    raise ValueError(
        f"reparameterize must be 'auto', 'whiten', 'centre', True or False, got {value!r}."
    )


def loc_scale_effects(layer: MinibatchModel) -> list[LocScaleEffect]:
    """The layer's loc-scale effects that the centring rule can measure (read only as
    ``a[g]``), without their row data (a step pickles them). A parents' effect whose groups
    the rule cannot measure is dropped (centred) or read from its rows (non-centred), and so
    on up the levels."""
    effects = find_loc_scale_effects(layer.model, layer.value_vars)
    usable = drop_orphaned_parents(e for e in effects if e.indexed_only)
    return [dataclasses.replace(e, group=None, group_var=None) for e in usable]


def _fit_effects(
    effects: list[LocScaleEffect], layer: MinibatchModel, theta: np.ndarray, parents_first
) -> list[GroupFit]:
    """Each effect's :func:`~pymc_bigdata.model.group_fit.fit_groups` at ``theta``, children
    first: a parents' effect is read from its groups' fit
    (:func:`~pymc_bigdata.model.group_fit.fit_parent`)."""
    fits: dict[int, GroupFit] = {}
    names = {e.name: i for i, e in enumerate(effects)}
    for i in reversed(list(parents_first)):
        effect = effects[i]
        below = _nested_in(effect, effects, names)
        if below:
            child = names[effect.children]
            fits[i] = fit_parent(
                effect, theta, effects[child], fits[child], layer.prior_logp, below[1:]
            )
        else:
            fits[i] = fit_groups(
                effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp
            )
    return [fits[i] for i in range(len(effects))]


def _nested_in(
    effect: LocScaleEffect, effects: list[LocScaleEffect], names: dict[str, int]
) -> list[LocScaleEffect]:
    """The effects nested in ``effect``: its children, theirs, and so on down."""
    out = []
    while effect.children is not None and effect.children in names:
        effect = effects[names[effect.children]]
        out.append(effect)
    return out


def _whitened(effects: list[LocScaleEffect], fits: list[GroupFit]) -> list[WhitenedLocScale]:
    """Each effect whitened by its fit; a parents' effect read through its nested groups
    (:func:`_fit_effects`) by their fit, at the groups' scale wherever it goes
    (:class:`~pymc_bigdata.model.whitening.ChildrenReading`)."""
    names = {e.name: i for i, e in enumerate(effects)}
    out = []
    for effect, fit in zip(effects, fits):
        child = names.get(effect.children) if effect.children is not None else None
        children = None
        if child is not None:
            groups, groups_fit = effects[child], fits[child]
            children = ChildrenReading(
                groups.parent.index,
                groups_fit.kappa,
                groups_fit.estimate,
                groups.scale_slice,
                groups.scale_transform,
                effect.n_groups,
            )
        out.append(WhitenedLocScale(effect, fit.kappa, fit.estimate, fit.scale, children))
    return out


def _snapped(centredness: np.ndarray) -> np.ndarray:
    """``c_j`` below ``NON_CENTRED_BELOW`` set to 0 (see there)."""
    return np.where(centredness < NON_CENTRED_BELOW, 0.0, centredness)


def sampling_layer(layer: MinibatchModel, coordinates: str | None) -> MinibatchModel:
    """The layer a step samples in (see the module docstring).

    ``layer`` itself unless ``coordinates`` (``"whiten"`` or ``"centre"``) and the
    (continuous, held-variable free) model has loc-scale effects. From the model's MAP,
    :func:`~pymc_bigdata.model.group_fit.fit_groups` reads each group's curvature and data
    estimate and the scale of the posterior's bulk (a joint MAP's scale is inflated when the
    model is written non-centred and can collapse when centred), and
    :func:`~pymc_bigdata.model.reparam.choose_centredness` gives ``c_j``. The model's
    coordinates are kept where no group moves by more than ``REPARAM_MIN_CHANGE`` and the
    MAP's scale is within ``BULK_SCALE_RATIO`` of the bulk's; otherwise the layer moves to
    the coordinates asked for, ``"centre"``: ``c_j``; ``"whiten"``: each group standardised
    by its conditional posterior given ``(loc, scale)``
    (:class:`~pymc_bigdata.model.whitening.WhitenedLocScale`, from the same fit), and its MAP
    is searched from the bulk's point (:func:`~pymc_bigdata.model.group_fit.bulk_point`).
    Costs, once per ``layer`` and ``coordinates`` (later steps on it share the result,
    :meth:`~pymc_bigdata.MinibatchModel.derived`): one compile of the new layer's graphs
    (``"centre"`` compiles it before the decision, as its MAP is searched there); two
    full-data passes per effect and, where the coordinates change, a second MAP search.
    """
    if coordinates is None or layer.reparam is not None or layer.held_vars or layer.discrete:
        return layer
    return layer.derived("sampling-" + coordinates, lambda: _moved_layer(layer, coordinates))


def _moved_layer(layer: MinibatchModel, coordinates: str) -> MinibatchModel:
    """:func:`sampling_layer`'s layer for a layer in the model's own coordinates. A
    correlated effect (:mod:`~pymc_bigdata.model.correlated_effects`) has its data-rich
    groups centred and its data-poor ones non-centred, in either coordinates (the rule,
    :func:`~pymc_bigdata.model.correlated_reparam.choose_correlated_centredness`, read at
    the bulk's ``(mu, L)``: :func:`~pymc_bigdata.model.correlated_fit.fit_correlated_groups`)."""
    effects = loc_scale_effects(layer)
    correlated = find_correlated_effects(layer.model, layer.value_vars)
    if not effects and not correlated:
        return layer
    identity = LocScaleReparams(
        [LocScaleReparam(e, e.model_centredness) for e in effects]
        + [CorrelatedReparam(e, e.model_centredness) for e in correlated]
    )
    # "centre" moves this layer's shared centredness; "whiten" builds its own layer below
    whiten = coordinates == "whiten" and bool(effects)
    searched = layer if whiten else layer.reparameterised(identity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the step's own start reports on its fit
        theta = searched.map_estimate().theta  # the model's own coordinates still
    if not np.all(np.isfinite(theta)):
        return searched
    scalar_order = [i for i in identity.parents_first if i < len(effects)]
    with np.errstate(all="ignore"):
        fits = _fit_effects(effects, searched, theta, scalar_order)
        correlated_fits = [
            fit_correlated_groups(
                e, theta, searched.full_loglik_grad, searched.full_loglik_hvp, searched.prior_logp
            )
            for e in correlated
        ]
    chosen_correlated = [
        choose_correlated_centredness(f.information(e)) for e, f in zip(correlated, correlated_fits)
    ]
    chosen = [
        _snapped(choose_centredness(f.information_below(PARENT_SCALE_SDS if e.children else 0)))
        for e, f in zip(effects, fits)
    ]
    moves = [np.max(np.abs(c - e.model_centredness)) for e, c in zip(effects, chosen)]
    moves += [
        np.max(np.abs(c - e.model_centredness)) for e, c in zip(correlated, chosen_correlated)
    ]
    off_bulk = [abs(np.log(scale_at(e, theta) / f.scale)) for e, f in zip(effects, fits)]
    start = theta
    for i in scalar_order:  # a nested effect's bulk is about its parents' new point
        start = bulk_point(effects[i], start, fits[i])
    for effect, fit in zip(correlated, correlated_fits):
        start = correlated_bulk_point(effect, start, fit)
    reading = partial(bulk_reading, blocks=_hyper_blocks(effects, fits, correlated_fits))
    if max(moves) <= REPARAM_MIN_CHANGE and max(off_bulk, default=0.0) <= np.log(BULK_SCALE_RATIO):
        searched.bulk = reading(identity.from_model(start))
        return searched
    for reparam, c in zip(identity.reparams, chosen + chosen_correlated):
        reparam.set_centredness(c)
    if whiten:
        return _whitened_layer(layer, effects, identity, start)
    searched.map_estimate(identity.from_model(start))  # cached for the step's start
    searched.bulk = reading(identity.from_model(start))
    return searched


def _hyper_blocks(
    effects: list[LocScaleEffect], fits: list[GroupFit], correlated_fits: list
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each fit's hyperparameters and their marginal precision, for
    :func:`~pymc_bigdata.model.bulk_fit.bulk_reading`: a scale's (``1 / sd^2`` of its
    ``log scale``, in the scale's value coordinate), a correlated effect's ``L`` and free
    ``mu``; fits without a marginal precision are left out."""
    blocks = []
    for effect, fit in zip(effects, fits):
        if fit.log_scale_sd > 0.0:
            sd = fit.log_scale_sd * (1.0 if effect.scale_transform == "log" else fit.scale)
            blocks.append((np.arange(effect.scale_slice.start, effect.scale_slice.stop), sd**-2))
    correlated = [f for f in correlated_fits if f.hyper_precision is not None]
    return blocks + [(f.hyper, f.hyper_precision) for f in correlated]


def _whitened_layer(
    layer: MinibatchModel,
    effects: list[LocScaleEffect],
    centring: LocScaleReparams,
    start: np.ndarray,
) -> MinibatchModel:
    """The whitened layer, its groups read at the mode of the per-group centring.

    The whitening's ``kappa_j`` and ``a_j^`` are read at a mode of the joint posterior in
    coordinates where it has one: the per-group centring's (``centring``, from the bulk's
    point ``start``), not the model's own MAP, which on a centred model with many groups is
    where the scales collapse (the crossed ratings: ``log s`` at -21, the residual sd 2.2
    times its posterior's, so ``kappa_j`` 5 times too small and every ``a_j^`` off by the
    intercept's shift; whitened by those, the scales and the intercept coupled with a
    correlation of 0.64 and SGHMC's step fell 5-fold). Where that mode is not usable either,
    the groups are read at ``start``, the bulk's point."""
    centred = layer.reparameterised(centring)
    mode = centred.map_estimate(centring.from_model(start))
    if mode.problem is None and np.all(np.isfinite(mode.theta)):
        start = centring.to_model(mode.theta)
    n_scalar = len(effects)
    with np.errstate(all="ignore"):
        order = [i for i in centring.parents_first if i < n_scalar]
        fits = _fit_effects(effects, layer, start, order)
    moved = LocScaleReparams(_whitened(effects, fits) + centring.reparams[n_scalar:])
    searched = layer.reparameterised(moved)
    searched.map_estimate(moved.from_model(start))  # cached for the step's start
    return searched
