"""PSIS-LOO model comparison for models with many rows, the rows read through the layer.

A ``log_likelihood`` group over all ``N`` rows (``chain x draw x N`` values) cannot be built
for 10⁷ rows, and the rows themselves may not be in memory.  This module computes per-row
log-likelihood terms ``l_i(theta_s)`` only for the rows asked for, reading them with
:meth:`pymc_bigdata.MinibatchModel.take_rows` (or the row source's chunked pass), at the
posterior draws mapped to the model's value variables:

* :func:`pointwise_log_likelihood`: the terms of given rows at every draw, a DataArray;
* :func:`add_log_likelihood`: a ``log_likelihood`` group over a uniform random subsample of
  rows (without replacement), the row indices as the row coordinate, for ``arviz_stats.loo``
  and ``arviz_stats.compare`` on that subsample;
* :func:`loo_subsample_inputs`: the arguments ``arviz_stats.loo_subsample`` (and
  ``update_subsample``) need to estimate the elpd of all ``N`` rows from a subsample: a copy
  of the results whose ``log_likelihood`` group covers all rows *lazily* (values computed
  only for the rows and draws read), an ``observed_data`` group holding the row indices, and
  a ``log_lik_fn`` for the cheap point approximation (``method="plpd"``, one chunked pass
  over the rows at the posterior mean).

The terms are the *unscaled* per-row log-likelihoods: a model written with ``pm.Minibatch``
and ``total_size`` is read at its full data (the layer strips the minibatch), so no term is
multiplied by ``N/n`` (``pm.compute_log_likelihood`` on such a model returns the minibatch's
terms scaled by ``N/n``; pymc issue 8300).  With several observed variables the term of a
row is the sum of their terms (one joint variable, named ``"y+z"`` after them): leave-one-
row-out.  Trailing axes of a row (a multivariate or a 2-D observation) are summed likewise.

The terms themselves come from :class:`~pymc_bigdata.loo_terms.RowTerms`, the lazy group's
arrays from :mod:`pymc_bigdata.loo_lazy`, the argument checks from
:mod:`pymc_bigdata.loo_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pymc as pm
import xarray as xr
from xarray.core import indexing

from pymc_bigdata.loo_checks import SAMPLE_DIMS, checked_rows, posterior_of
from pymc_bigdata.loo_lazy import LazyTerms, RowIndices
from pymc_bigdata.loo_terms import RowTerms
from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = ["add_log_likelihood", "loo_subsample_inputs", "pointwise_log_likelihood"]

#: rows in the ``log_likelihood`` group by default: SE of the subsample elpd ~ N sd / sqrt(m)
DEFAULT_ROWS = 1_000

#: default seed of the row subsample: groups added to two models fitted to the same rows
#: then share their rows, so a comparison is paired
DEFAULT_SEED = 0

#: most values (draws x rows) one read of the lazy ``log_likelihood`` group may compute
#: (2**27 float64 values are 1 GiB)
DEFAULT_MAX_VALUES = 2**27


# ---------------------------------------------------------------------- public functions
def pointwise_log_likelihood(
    idata: xr.DataTree,
    rows: Sequence[int] | np.ndarray,
    model: pm.Model | None = None,
    layer: MinibatchModel | None = None,
    var_name: str | None = None,
) -> xr.DataArray:
    """Per-row log-likelihood of given rows at every posterior draw.

    Parameters
    ----------
    idata
        Results with a ``posterior`` group holding the model's free variables (constrained
        values, as ``pm.sample`` stores them), e.g. from ``pm.sample(step=pmbd.SGHMC())``.
    rows
        Row indices (0 to ``N - 1``; repeats allowed).
    model
        The model the draws come from (default: ``layer.model``, or the model in context).
    layer
        Its :class:`~pymc_bigdata.MinibatchModel`, e.g. ``step.layer`` (default: a new one;
        compiling its per-row function takes a few seconds the first time).
    var_name
        Name of the result (default: the observed variables' names joined by ``+``).

    Returns
    -------
    xarray.DataArray
        ``l_i(theta_s)``, dims ``("chain", "draw", row_dim)``, the row indices as the
        coordinate of ``row_dim`` (the observed variable's row dimension as PyMC names it:
        its first ``dims=`` entry or ``"<name>_dim_0"``; ``"row"`` for several observed
        variables without a shared named dimension).

    Raises
    ------
    ValueError
        If ``idata`` has no posterior, the posterior does not hold the model's free
        variables with their shapes, or ``rows`` are not integer indices below ``N``.
    """
    posterior = posterior_of(idata)
    terms = RowTerms(model, layer, var_name)
    indices = checked_rows(rows, terms.n_rows, "rows", unique=False)
    return _terms_array(terms, posterior, indices)


def add_log_likelihood(
    idata: xr.DataTree,
    model: pm.Model | None = None,
    rows: int | Sequence[int] | np.ndarray | None = None,
    seed: int | np.random.SeedSequence | None = DEFAULT_SEED,
    layer: MinibatchModel | None = None,
    var_name: str | None = None,
    overwrite: bool = False,
) -> xr.DataTree:
    """Add a ``log_likelihood`` group over a uniform random subsample of rows.

    The ``rows`` row indices are drawn uniformly without replacement,
    ``np.random.default_rng(seed).choice(N, rows, replace=False)``, and sorted; every draw's
    per-row terms ``l_i(theta_s)`` are computed for them only, reading only those rows
    through the layer.  ``arviz_stats.loo`` on the group then estimates the elpd *of these
    rows* (multiply by ``N / rows`` for all rows, see ``docs/loo.md``), and
    ``arviz_stats.compare`` of models given the same ``rows`` and ``seed`` compares them on
    the same rows.  ``rows=N`` gives every row (what ``pm.compute_log_likelihood`` gives on a
    model without ``total_size``).

    Parameters
    ----------
    idata
        Results with a ``posterior`` group (``pm.sample``'s ``DataTree``); changed in place.
    model
        The model the draws come from (default: ``layer.model``, or the model in context).
    rows
        How many rows to draw (1 to ``N``; default ``min(1000, N)``), or the row indices
        themselves (e.g. another group's ``attrs["row_indices"]``).
    seed
        Seed of the row draw's own generator (default 0: two models of the same data get the
        same rows, so their comparison is paired). ``None`` draws fresh rows.
    layer
        The model's :class:`~pymc_bigdata.MinibatchModel`, e.g. ``step.layer`` (default: a
        new one).
    var_name
        Name of the per-row variable (default: the observed variable's name; with several
        observed variables one joint term, their names joined by ``+``, e.g. ``"y+z"``).
    overwrite
        Replace an existing ``log_likelihood`` group (else refuse).

    Returns
    -------
    xarray.DataTree
        ``idata``, with a ``log_likelihood`` group of one variable, dims
        ``("chain", "draw", row_dim)``, the row indices the coordinate of ``row_dim``.  Its
        attributes: ``n_rows`` (N), ``subsample_size``, ``is_subsample`` (1 when fewer than N
        rows), ``row_indices``, ``row_dim``, ``row_sampling``, ``seed`` (when an int),
        ``observed_vars`` and ``terms``.

    Raises
    ------
    ValueError
        If ``rows`` is below 1 or above ``N`` (or not valid indices), ``idata`` has no
        posterior or already a ``log_likelihood`` group (without ``overwrite``), or the
        model's free variables are not in the posterior with their shapes.

    Notes
    -----
    The terms are unscaled even for a model written with ``pm.Minibatch``/``total_size``:
    the layer reads the full data behind the minibatch, and ``l_i`` is the term of row
    ``i`` itself (``pm.compute_log_likelihood`` returns the minibatch's terms times
    ``N/n``, pymc issue 8300). Cost: one compiled call per draw on ``rows`` rows (4,000
    draws x 1,000 rows of a 3-parameter regression: about 0.1 s on a 2-core machine).
    """
    posterior = _posterior_to_extend(idata, overwrite)
    terms = RowTerms(model, layer, var_name)
    indices, sampling = _row_subsample(rows, terms.n_rows, seed)
    attrs = _subsample_attrs(terms, indices, sampling, seed)
    idata["log_likelihood"] = _with_attrs(_terms_array(terms, posterior, indices), attrs)
    return idata


def loo_subsample_inputs(
    idata: xr.DataTree,
    model: pm.Model | None = None,
    layer: MinibatchModel | None = None,
    var_name: str | None = None,
    max_values: int = DEFAULT_MAX_VALUES,
) -> dict[str, Any]:
    """Arguments for ``arviz_stats.loo_subsample`` that read only the rows it evaluates.

    ``loo_subsample`` takes the total number of rows ``N`` and the exact per-row values of
    its subsample from a ``log_likelihood`` group over all ``N`` rows, and its cheap
    approximation of every row from ``log_lik_fn``.  This returns:

    * ``data``: a shallow copy of ``idata`` whose ``log_likelihood`` group covers all ``N``
      rows *lazily* (an xarray lazily indexed array: a read computes the terms of the rows
      and draws it selects, reading those rows through the layer; nothing is stored), and
      whose ``observed_data`` group holds the row indices ``0..N-1`` under ``var_name``
      (lazy too), which is what ``log_lik_fn`` receives as ``observed``;
    * ``log_lik_fn``: for ``method="plpd"`` the point log predictive density of every row at
      the posterior mean (one chunked pass over the rows, an ``(N,)`` array); with draws
      the terms of the rows in ``observed``;
    * ``var_name`` and ``method="plpd"``.

    Parameters
    ----------
    idata
        Results with a ``posterior`` group (not changed).
    model
        The model the draws come from (default: ``layer.model``, or the model in context).
    layer
        The model's :class:`~pymc_bigdata.MinibatchModel`, e.g. ``step.layer`` (default: a
        new one).
    var_name
        Name of the per-row variable (default: the observed variables' names joined by
        ``+``).
    max_values
        Most draws x rows one read may compute (default ``2**27``, 1 GiB): a read of the
        whole group (``arviz_stats.loo`` on ``data``, or ``loo_subsample``'s default
        ``method="lpd"`` without ``log_lik_fn``) raises instead of filling the memory.

    Returns
    -------
    dict
        ``{"data", "var_name", "method", "log_lik_fn"}``: pass as
        ``arviz_stats.loo_subsample(**inputs, observations=1000, pointwise=True)`` and
        ``arviz_stats.update_subsample(loo, **inputs, observations=500)``.

    Raises
    ------
    ValueError
        If ``idata`` has no posterior or the posterior does not match the model.

    Notes
    -----
    What ``loo_subsample`` cannot avoid: ``N``-long arrays (the approximation of every row,
    and with ``pointwise=True`` ``elpd_i`` and ``pareto_k``, NaN outside the subsample), a
    full pass over the rows for the approximation (``method="plpd"``; ``method="lpd"``
    would evaluate every row at every draw), and the ESS of the posterior for its relative
    efficiency. The subsample's rows are evaluated twice (PSIS and the lpd), not stored.
    """
    posterior = posterior_of(idata)
    terms = RowTerms(model, layer, var_name)
    theta, sample_shape = terms.value_draws(posterior)
    if len(sample_shape) != 2:
        raise ValueError("`idata`'s posterior must have 'chain' and 'draw' dimensions.")
    backend = LazyTerms(terms, theta, sample_shape, int(max_values))
    attrs = terms.attrs()
    attrs["lazy"] = "values computed on read for the selected rows and draws (not stored)"
    rows = _row_coordinate(terms)
    data = idata.copy()
    data["log_likelihood"] = _lazy_log_likelihood(terms, backend, posterior, rows, attrs)
    data["observed_data"] = _lazy_row_indices(terms, rows, attrs)
    return {
        "data": data,
        "var_name": terms.var_name,
        "method": "plpd",
        "log_lik_fn": terms.log_lik_fn(int(max_values)),
    }


# ---------------------------------------------------------------------- helpers
def _terms_array(terms: RowTerms, posterior: xr.Dataset, indices: np.ndarray) -> xr.DataArray:
    """The terms of rows ``indices`` at every draw, dims ``(chain, draw, row_dim)``."""
    theta, sample_shape = terms.value_draws(posterior)
    values = terms.terms(theta, indices).reshape(*sample_shape, len(indices))
    coords = {d: posterior[d] for d in SAMPLE_DIMS if d in posterior.coords}
    coords[terms.row_dim] = indices
    return xr.DataArray(
        values, dims=(*SAMPLE_DIMS, terms.row_dim), coords=coords, name=terms.var_name
    )


def _posterior_to_extend(idata: Any, overwrite: bool) -> xr.Dataset:
    """The posterior of ``idata``, which gets a ``log_likelihood`` group (refused if it has
    one, unless ``overwrite``)."""
    posterior = posterior_of(idata)
    if "log_likelihood" in idata.children and not overwrite:
        raise ValueError(
            "`idata` already has a log_likelihood group; pass overwrite=True to replace it."
        )
    return posterior


def _row_subsample(
    rows: int | Sequence[int] | np.ndarray | None,
    n: int,
    seed: int | np.random.SeedSequence | None,
) -> tuple[np.ndarray, str]:
    """The row indices of add_log_likelihood's ``rows`` (drawn, or given and checked), and
    how they were chosen."""
    if rows is None:
        rows = min(DEFAULT_ROWS, n)
    if isinstance(rows, int | np.integer) and not isinstance(rows, bool):
        if not 1 <= int(rows) <= n:
            raise ValueError(f"`rows` must be between 1 and N = {n} (the data's rows), got {rows}.")
        rng = np.random.default_rng(seed)
        indices = np.sort(rng.choice(n, size=int(rows), replace=False)).astype(np.int64)
        sampling = (
            f"uniform without replacement: np.random.default_rng({seed!r}).choice(N, "
            f"{int(rows)}, replace=False), sorted"
        )
        return indices, sampling
    return checked_rows(rows, n, "rows"), "given row indices"


def _subsample_attrs(
    terms: RowTerms, indices: np.ndarray, sampling: str, seed: Any
) -> dict[str, Any]:
    """The attributes of add_log_likelihood's group and variable."""
    attrs = terms.attrs()
    attrs.update(
        {
            "subsample_size": len(indices),
            "is_subsample": int(len(indices) < terms.n_rows),
            "row_indices": indices,
            "row_sampling": sampling,
        }
    )
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        attrs["seed"] = int(seed)
    return attrs


def _with_attrs(values: xr.DataArray, attrs: dict[str, Any]) -> xr.Dataset:
    """``values`` as a one-variable group, ``attrs`` on both the variable and the group."""
    values.attrs.update(attrs)
    group = values.to_dataset()
    group.attrs.update(attrs)
    return group


def _row_coordinate(terms: RowTerms) -> pd.RangeIndex:
    """The row indices as a pandas RangeIndex coordinate: O(1) memory, and update_subsample
    and compare select rows by this coordinate."""
    return pd.RangeIndex(terms.n_rows, name=terms.row_dim)


def _lazy_log_likelihood(
    terms: RowTerms,
    backend: LazyTerms,
    posterior: xr.Dataset,
    rows: pd.RangeIndex,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """The ``log_likelihood`` group over all ``N`` rows, its values read from ``backend``."""
    coords = {d: posterior[d] for d in SAMPLE_DIMS if d in posterior.coords}
    coords[terms.row_dim] = rows
    return xr.Dataset(
        {
            terms.var_name: xr.Variable(
                (*SAMPLE_DIMS, terms.row_dim), indexing.LazilyIndexedArray(backend)
            )
        },
        coords=coords,
        attrs=attrs,
    )


def _lazy_row_indices(terms: RowTerms, rows: pd.RangeIndex, attrs: dict[str, Any]) -> xr.Dataset:
    """The ``observed_data`` group: the row indices ``0..N-1``, produced on read."""
    return xr.Dataset(
        {
            terms.var_name: xr.Variable(
                (terms.row_dim,), indexing.LazilyIndexedArray(RowIndices(terms.n_rows))
            )
        },
        coords={terms.row_dim: rows},
        attrs={
            **attrs,
            "lazy": "row indices 0..N-1: log_lik_fn reads the rows through the layer",
        },
    )
