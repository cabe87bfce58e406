"""HMC-ECS's settings: clear errors for bad or mixed-up estimator settings, before the
layer is built."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.difference_terms import TAYLOR_ORDERS
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.settings import check_positive

__all__ = ["TAYLOR_SPACES", "GivenCounts", "check_count", "check_layer_settings", "check_settings"]

#: the Taylor expansion's spaces (``taylor_space``)
TAYLOR_SPACES = ("auto", "parameters", "likelihood_inputs")


class GivenCounts(NamedTuple):
    """The counts a user gave (None: tuned), as Python integers."""

    subsample_size: int | None
    blocks: int | None
    minibatch: int | None
    products: int | None
    refreshed_products: int


def check_count(name: str, value: int | None) -> int | None:
    """None, or a positive integer (a clear error otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def check_settings(
    *,
    estimator: str,
    taylor_space: str,
    taylor_order: int | None,
    subsample_size: int | None,
    blocks: int | None,
    minibatch: int | None,
    products: int | None,
    lower_bound: float | None,
    refreshed_products: int,
    trajectory_length: float,
    target_accept: float,
    loglik_var_target: float,
    sign_tolerance: float,
    base_keys: dict[str, Any],
) -> GivenCounts:
    """Check :class:`~pymc_bigdata.HMCECS`'s settings (see its docstring); the counts."""
    if estimator not in ("perturbed", "signed"):
        raise ValueError(f"estimator must be 'perturbed' or 'signed', got {estimator!r}.")
    if taylor_space not in TAYLOR_SPACES:
        raise ValueError(f"taylor_space must be one of {TAYLOR_SPACES}, got {taylor_space!r}.")
    for key in ("batch_size", "inner_steps", "replace", "reshuffle"):
        if key in base_keys:
            raise TypeError(
                f"HMCECS has no {key!r}: it draws its subsample uniformly with replacement "
                "(use subsample_size, blocks, minibatch, products)."
            )
    if taylor_order is not None and taylor_order not in TAYLOR_ORDERS:
        raise ValueError(f"taylor_order must be 0, 1 or 2, got {taylor_order!r}.")
    counts = GivenCounts(
        check_count("subsample_size", subsample_size),
        check_count("blocks", blocks),
        check_count("minibatch", minibatch),
        check_count("products", products),
        check_count("refreshed_products", refreshed_products),
    )
    _check_signed(counts, lower_bound)
    check_positive("trajectory_length", trajectory_length)
    check_positive("loglik_var_target", loglik_var_target)
    if not (isinstance(target_accept, int | float) and 0 < target_accept < 1):
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}.")
    if not (isinstance(sign_tolerance, int | float) and 0 < sign_tolerance < 1):
        raise ValueError(f"sign_tolerance must be in (0, 1), got {sign_tolerance!r}.")
    _check_estimator_keys(estimator, counts, lower_bound)
    return counts


def _check_signed(counts: GivenCounts, lower_bound: float | None) -> None:
    """``products`` and ``lower_bound`` given together; ``kappa <= lambda``."""
    if counts.products is not None and counts.refreshed_products > counts.products:
        raise ValueError(
            f"refreshed_products ({counts.refreshed_products}) must be at most products "
            f"({counts.products})."
        )
    if lower_bound is not None and not (
        isinstance(lower_bound, int | float) and math.isfinite(lower_bound)
    ):
        raise ValueError(f"lower_bound must be a finite number, got {lower_bound!r}.")
    if (counts.products is None) != (lower_bound is None):
        raise ValueError("Give both products and lower_bound (lambda and a), or neither.")


def _check_estimator_keys(estimator: str, counts: GivenCounts, lower_bound: float | None) -> None:
    """Each estimator's own settings only."""
    if estimator == "signed" and (counts.subsample_size is not None or counts.blocks is not None):
        raise ValueError(
            "subsample_size and blocks belong to the perturbed estimator; the signed one's "
            "are minibatch, products, lower_bound and refreshed_products."
        )
    signed_only = {
        "minibatch": counts.minibatch,
        "products": counts.products,
        "lower_bound": lower_bound,
    }
    given = [k for k, v in signed_only.items() if v is not None]
    if counts.refreshed_products != 1:
        given.append("refreshed_products")
    if estimator == "perturbed" and given:
        raise ValueError(
            f"{', '.join(given)} belong to the signed estimator (estimator='signed'); the "
            "perturbed one's are subsample_size and blocks."
        )


def check_layer_settings(
    counts: GivenCounts, taylor_order: int | None, taylor_space: str, layer: MinibatchModel
) -> None:
    """The settings that need the layer's N, d or likelihood inputs (before the full-data
    MAP search)."""
    n_rows, dim, inputs = layer.n_rows, layer.dim, layer.likelihood_inputs
    for name, value in (("subsample_size", counts.subsample_size), ("minibatch", counts.minibatch)):
        if value is not None and value > n_rows:
            raise ValueError(f"{name} ({value}) must be at most the N = {n_rows} rows.")
    size = counts.subsample_size if counts.subsample_size is not None else min(1000, n_rows)
    if counts.blocks is not None and counts.blocks > size:
        raise ValueError(
            f"blocks (G = {counts.blocks}) must be at most the subsample size "
            f"(m = {size}): each block holds at least one row."
        )
    if taylor_order == 2 and dim > DENSE_HESSIAN_MAX_DIM:
        raise ValueError(
            "taylor_order=2 needs the full-data Hessian B, not computed for d = "
            f"{dim} > {DENSE_HESSIAN_MAX_DIM} parameters; use taylor_order=1."
        )
    if taylor_space == "likelihood_inputs" and not inputs.available:
        raise ValueError(
            "taylor_space='likelihood_inputs' is not available for this model: "
            f"{inputs.reason}. Use taylor_space='parameters'."
        )
