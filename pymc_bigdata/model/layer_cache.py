"""Layers kept for the next step on the same model.

A step's set-up is mostly its layer's: compiling the model's graphs, the MAP search and, for
a hierarchy, the group fits that choose its coordinates (12-28 s on the hard targets'
hierarchies, ``docs/layer.md``). The layer is a function of the model's structure, its data,
the sampled variables and the compile mode, and a step on a shared layer draws what it draws
on a fresh one (``tests/model/test_layer_cache.py``). So a step built without ``layer=``
takes the layer that an earlier step (or :func:`~pymc_bigdata.score_check`, or the LOO
tools) built on the same model, with the same variables and mode, when that model has neither
changed its variables nor replaced its data since (``pm.set_data``): re-running a notebook's
``pm.sample(step=pmbd.SGHMC())`` cell, or trying another sampler, then starts at once.

The layers of the last :data:`LAYER_CACHE_MODELS` models are kept, and keep those models
alive, until :func:`clear_layer_cache`. A layer reads its model's rows into its own memory
where it gathers windows of a shuffled copy (as large as the rows: ``docs/data.md``); pass
``layer=pmbd.MinibatchModel(model)`` for a layer of the step's own, which is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import pymc as pm

from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = ["LAYER_CACHE_MODELS", "cached_layer", "clear_layer_cache"]

#: the layers of this many models (the most recently used) are kept
LAYER_CACHE_MODELS = 2

#: model id -> (the model's structure when its layers were built, {layer key: layer})
_LAYERS: OrderedDict[int, tuple[tuple, dict[Hashable, MinibatchModel]]] = OrderedDict()


def model_structure(model: pm.Model) -> tuple:
    """What a layer read from the model besides its data: its random variables, value
    variables, potentials and their transforms (a variable added later changes it)."""
    return (
        tuple(map(id, model.free_RVs)),
        tuple(map(id, model.observed_RVs)),
        tuple(map(id, model.potentials)),
        tuple(map(id, model.value_vars)),
        tuple(map(id, model.rvs_to_transforms.values())),
    )


def cached_layer(
    model: pm.Model,
    vars: list[Any] | None,
    mode: Any,
    discrete: bool = False,
) -> MinibatchModel:
    """The kept layer ``MinibatchModel(model, vars, mode=mode, discrete=discrete)`` (``vars``
    value variables in any order, as the layer orders them as the model does; None: the
    layer's default choice) when it is current, else a new one, kept. A ``mode`` is matched
    by equality (a ``Mode`` object by identity); one that cannot be hashed is never kept."""
    try:
        hash(mode)
    except TypeError:
        return MinibatchModel(model, vars, mode=mode, discrete=discrete)
    key = (None if vars is None else frozenset(map(id, vars)), mode, bool(discrete))
    structure = model_structure(model)
    entry = _LAYERS.get(id(model))
    if entry is None or entry[0] != structure:
        entry = (structure, {})
    _LAYERS[id(model)] = entry
    _LAYERS.move_to_end(id(model))
    while len(_LAYERS) > LAYER_CACHE_MODELS:
        _LAYERS.popitem(last=False)
    layers = entry[1]
    layer = layers.get(key)
    if layer is None or layer.model is not model or not layer.data_is_current():
        layer = layers[key] = MinibatchModel(model, vars, mode=mode, discrete=discrete)
    return layer


def clear_layer_cache() -> None:
    """Drop every kept layer (and the models they keep alive); the next step on a model
    builds its layer again."""
    _LAYERS.clear()
