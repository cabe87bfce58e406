"""Where a step samples: the model's own coordinates, or per-group centred ones.

A hierarchical model's loc-scale group effects (:mod:`pymc_bigdata.model.loc_scale`) are
written centred or non-centred, and at big-data scale neither suits every group: a
data-rich group's ``z_j`` is tied to ``(loc, scale)`` along a narrow ridge in the
non-centred form, a data-poor group makes the centred form a funnel. With
``reparameterize="auto"`` (the default) a step samples each effect in coordinates centred
per group by how much its rows say about it (:func:`~pymc_bigdata.model.reparam.
choose_centredness`, measured at the model's MAP by one full-data Hessian-vector product per
effect), through a layer of the same model in those coordinates
(:meth:`~pymc_bigdata.MinibatchModel.reparameterised`); the draws are mapped back to the
model's own variables, so the user's model and the result's variables are unchanged.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from pymc_bigdata.model.loc_scale import LocScaleEffect, find_loc_scale_effects
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import (
    LocScaleReparam,
    LocScaleReparams,
    choose_centredness,
    group_information,
)

__all__ = [
    "REPARAM_MIN_CHANGE",
    "check_reparameterize",
    "loc_scale_effects",
    "sampling_layer",
]

#: the model's own parameterisation is kept unless some group's centredness would move by
#: more than this from it (0 or 1): below it the two coordinates differ too little to pay
#: for a second layer (its compile and its MAP search)
REPARAM_MIN_CHANGE = 0.25


def check_reparameterize(value: bool | str) -> bool:
    """``"auto"``/``True``: per-group centring where it differs from the model's own;
    ``False``: the model's own coordinates."""
    if value in ("auto", True):
        return True
    if value is False:
        return False
    raise ValueError(f"reparameterize must be 'auto', True or False, got {value!r}.")


def loc_scale_effects(layer: MinibatchModel) -> list[LocScaleEffect]:
    """The layer's loc-scale effects that the centring rule can measure (read only as
    ``a[g]``), without their row data (a step pickles them)."""
    effects = find_loc_scale_effects(layer.model, layer.value_vars)
    return [dataclasses.replace(e, group=None, group_var=None) for e in effects if e.indexed_only]


def sampling_layer(layer: MinibatchModel, reparameterize: bool) -> MinibatchModel:
    """The layer a step samples in (see the module docstring).

    ``layer`` itself unless ``reparameterize`` and the (continuous, held-variable free)
    model has loc-scale effects. Then a layer of the model in per-group centred coordinates,
    built once, its centredness a shared input: first the model's own (its MAP is the
    model's), then, from the information about each group at that MAP
    (:func:`~pymc_bigdata.model.reparam.group_information`: one Hessian-vector product per
    effect), :func:`~pymc_bigdata.model.reparam.choose_centredness` where it moves some group
    by more than ``REPARAM_MIN_CHANGE``, and the MAP again in those coordinates, started from
    the first. Costs: no second compile; one full-data pass per effect and a second MAP
    search (a few passes from a close start) where the coordinates change.
    """
    if not reparameterize or layer.reparam is not None or layer.held_vars or layer.discrete:
        return layer
    effects = loc_scale_effects(layer)
    if not effects:
        return layer
    reparams = [LocScaleReparam(e, e.model_centredness) for e in effects]
    reparam = LocScaleReparams(reparams)
    centred = layer.reparameterised(reparam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the step's own start reports on its fit
        theta = centred.map_estimate().theta  # the model's own coordinates still
    if not np.all(np.isfinite(theta)):
        return centred
    with np.errstate(all="ignore"):
        chosen = [
            choose_centredness(group_information(e, theta, centred.full_loglik_hvp))
            for e in effects
        ]
    moves = [np.max(np.abs(c - e.model_centredness)) for e, c in zip(effects, chosen)]
    if max(moves) <= REPARAM_MIN_CHANGE:
        return centred
    for r, c in zip(reparams, chosen):
        r.set_centredness(c)
    centred.map_estimate(reparam.from_model(theta))  # cached for the step's start
    return centred
