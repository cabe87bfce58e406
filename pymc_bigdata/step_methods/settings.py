"""Checks of the settings every step method shares: clear errors before the MAP search."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pymc as pm

from pymc_bigdata.errors import StaleDataError
from pymc_bigdata.index_samplers import check_batch_size
from pymc_bigdata.model.layer_cache import cached_layer
from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = [
    "EXTENSIONS_OFF",
    "check_adapt",
    "DENSE_PRECONDITIONER_MAX_DIM",
    "SharedSettings",
    "check_shared_settings",
    "check_data_current",
    "check_control_variates",
    "check_independent_rows",
    "check_inner_steps",
    "LOW_RANK_AUTO",
    "check_low_rank",
    "check_noise_bound",
    "check_noise_shift_bound",
    "check_positive",
    "check_preconditioner",
    "check_step_size",
    "step_layer",
]

#: above this many parameters the automatic preconditioner is diagonal rather than dense
DENSE_PRECONDITIONER_MAX_DIM = 200


def check_positive(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a finite positive (or, with
    ``allow_zero``, non-negative) number."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {kind} finite number, got {value!r}.")


def check_step_size(step_size: Any) -> float:
    """A given step size: a positive finite number."""
    if not (isinstance(step_size, int | float) and math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"step_size must be a positive finite number, got {step_size!r}.")
    return float(step_size)


def check_inner_steps(inner_steps: Any) -> int:
    """Given transitions per draw: a positive integer."""
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
        raise ValueError(f"inner_steps must be a positive integer, got {inner_steps!r}.")
    return int(inner_steps)


def check_independent_rows(layer: MinibatchModel, sampler: str, reason: str) -> None:
    """Refuse data read by block gathers (a chunked zarr or dask array) for a sampler whose
    theory needs independent minibatches (``reason`` says which result)."""
    if layer.rows.gather == "blocks":
        raise ValueError(
            f"{sampler} needs independent minibatches ({reason}), but this model's data are "
            "read by block gathers (a chunked zarr or dask array): minibatches drawn from the "
            "same cached blocks have correlated noise, and the noise estimates then "
            "understate it. Read them as uniform rows with "
            'pmbd.Data(name, store, gather="rows") (slower: about one decoded chunk per '
            "row), or use another sampler (SGHMC)."
        )


def check_noise_bound(noise_bound: Any) -> float:
    """The noise share's bound: a number in (0, 1)."""
    if not (isinstance(noise_bound, int | float) and 0 < noise_bound < 1):
        raise ValueError(f"noise_bound must be a number in (0, 1), got {noise_bound!r}.")
    return float(noise_bound)


#: every extension of the base step switched off: plain minibatch gradients of rows drawn
#: independently and uniformly (no window gathers), no preconditioner, no census rows, the
#: model's own coordinates, no tuning (the samplers' ``PAPER_SETTINGS`` start from it)
EXTENSIONS_OFF: dict[str, Any] = {
    "control_variates": False,
    "preconditioner": "identity",
    "census": False,
    "reshuffle": False,
    "window_gathers": False,
    "reparameterize": False,
    "low_rank": 0,
    "adapt": False,
    "local_batch": False,
}


def check_adapt(adapt: Any) -> bool | str:
    """``adapt``: True, False (numpy's booleans too) or ``"step_size"``."""
    if isinstance(adapt, bool | np.bool_):
        return bool(adapt)
    if isinstance(adapt, str) and adapt == "step_size":
        return adapt
    raise ValueError(f"adapt must be True, False or 'step_size', got {adapt!r}.")


def check_noise_shift_bound(noise_shift_bound: Any) -> float | None:
    """The bound on the noise's total log-density shift: None or a positive number."""
    if noise_shift_bound is None:
        return None
    check_positive("noise_shift_bound", noise_shift_bound)
    return float(noise_shift_bound)


def check_preconditioner(kind: str, dim: int) -> str:
    """``"auto"`` resolved by the dimension, or one of the kinds."""
    if kind == "auto":
        return "dense" if dim <= DENSE_PRECONDITIONER_MAX_DIM else "diag"
    if kind not in ("dense", "diag", "identity"):
        raise ValueError(
            f"preconditioner must be 'auto', 'dense', 'diag' or 'identity', got {kind!r}."
        )
    return kind


#: ``low_rank="auto"``: directions at each end of the spectrum a diagonal preconditioner
#: is corrected along (chosen on the crossed ratings, :mod:`.low_rank`)
LOW_RANK_AUTO = 2


def check_low_rank(low_rank: Any, kind: str, compiled_maps: bool, held: bool = False) -> int:
    """Directions at each end of the spectrum a diagonal preconditioner is corrected along
    (:mod:`.low_rank`): an int >= 0, above 0 only with ``kind`` ``"diag"`` and a sampler
    whose coordinates are not mapped in compiled code (``compiled_maps``); ``"auto"``:
    :data:`LOW_RANK_AUTO` where that holds and the step holds no variables (``held``: a
    reading at every switch of their values), else 0."""
    if isinstance(low_rank, str) and low_rank == "auto":
        return LOW_RANK_AUTO if kind == "diag" and not compiled_maps and not held else 0
    if isinstance(low_rank, bool) or not isinstance(low_rank, int | np.integer) or low_rank < 0:
        raise ValueError(f"low_rank must be 'auto' or an int >= 0, got {low_rank!r}.")
    if low_rank and kind != "diag":
        raise ValueError(
            f"low_rank corrects a diagonal preconditioner; this step's is {kind!r} "
            "(preconditioner='auto' is dense up to 200 parameters: pass preconditioner='diag')."
        )
    if low_rank and compiled_maps:
        raise ValueError(
            "low_rank needs the coordinates mapped in Python; this step maps them in compiled "
            "code (HMC-ECS's estimates, SGHMC's compiled_loop=True), for a dense or diagonal "
            "preconditioner only."
        )
    return int(low_rank)


def check_control_variates(value: bool | str) -> str:
    """The control-variate mode: ``"auto"``, ``"none"``, ``"first"`` or ``"second"``."""
    if value is True or value == "auto":
        return "auto"
    if value is False or value == "none":
        return "none"
    if value in ("first", "second"):
        return value
    raise ValueError(
        f"control_variates must be True, False, 'auto', 'first' or 'second', got {value!r}."
    )


def step_layer(
    model: pm.Model | None,
    vars,
    layer: MinibatchModel | None,
    mode=None,
    compile_kwargs: dict | None = None,
) -> MinibatchModel:
    """The model layer a step uses: ``layer`` when given (built on the same model), else the
    layer kept from an earlier step on the model, ``vars`` and ``mode`` where it is current,
    else a new one, kept (:mod:`~pymc_bigdata.model.layer_cache`; PyMC's
    ``compile_kwargs["mode"]`` stands for ``mode``)."""
    model = pm.modelcontext(model)
    if mode is None and compile_kwargs:
        mode = compile_kwargs.get("mode")
    if layer is not None and layer.model is not model:
        raise ValueError(
            "The layer= given was built on a different model; build it with "
            "MinibatchModel(model) for this model, or leave layer out."
        )
    layer = layer if layer is not None else cached_layer(model, vars, mode)
    check_data_current(layer)
    return layer


def check_data_current(layer: MinibatchModel) -> None:
    """Refuse a layer whose model's data changed (``pm.set_data``) after it read them."""
    if not layer.data_is_current():
        raise StaleDataError(
            "The model's data changed (pm.set_data) after this step's layer read it: its "
            "rows, N, MAP and control-variate anchor would be stale. Build a new step "
            "(and layer) after pm.set_data."
        )


class SharedSettings(NamedTuple):
    """The shared settings of a step, checked and resolved (see
    :class:`~pymc_bigdata.step_methods.base.SubsamplingStep`); ``step_size`` and
    ``inner_steps`` are None where tuning chooses them."""

    batch_size: int
    fixed_batch: bool
    step_size: float | None
    inner_steps: int | None
    preconditioner_kind: str
    cv_mode: str
    noise_bound: float
    noise_shift_bound: float | None
    low_rank: int = 0


def check_shared_settings(
    layer: MinibatchModel,
    *,
    batch_size: int | None,
    default_batch_size: int,
    step_size: Any,
    inner_steps: Any,
    preconditioner: str,
    control_variates: bool | str,
    noise_bound: Any,
    noise_shift_bound: Any = None,
    low_rank: Any = "auto",
    compiled_maps: bool = False,
) -> SharedSettings:
    """Check the shared settings against the layer (``N``, ``d``) before the MAP search."""
    fixed_batch = batch_size is not None
    batch_size = default_batch_size if batch_size is None else batch_size
    check_batch_size(batch_size, layer.n_rows)
    kind = check_preconditioner(preconditioner, layer.dim)
    return SharedSettings(
        batch_size=int(batch_size),
        fixed_batch=fixed_batch,
        step_size=None if step_size is None else check_step_size(step_size),
        inner_steps=None if inner_steps is None else check_inner_steps(inner_steps),
        preconditioner_kind=kind,
        cv_mode=check_control_variates(control_variates),
        noise_bound=check_noise_bound(noise_bound),
        noise_shift_bound=check_noise_shift_bound(noise_shift_bound),
        low_rank=check_low_rank(low_rank, kind, compiled_maps, bool(layer.held_vars)),
    )
