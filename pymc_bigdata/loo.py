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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pymc as pm
import pytensor
import pytensor.tensor as pt
import xarray as xr
from pytensor.graph.replace import graph_replace, vectorize_graph
from xarray.backends import BackendArray
from xarray.core import indexing

from pymc_bigdata.errors import ModelNotSupportedError, StaleDataError
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

#: compile mode of the (small, once per posterior) constrained -> value-space transform
TRANSFORM_MODE = "FAST_COMPILE"

SAMPLE_DIMS = ("chain", "draw")


class _RowTerms:
    """Per-row log-likelihood terms of a model at posterior draws, through its layer.

    Parameters
    ----------
    model, layer
        The model and its :class:`~pymc_bigdata.MinibatchModel` (either may be None).
    var_name
        Name of the joint per-row term (default: the observed variables' names joined by
        ``+``).
    """

    def __init__(
        self,
        model: pm.Model | None,
        layer: MinibatchModel | None,
        var_name: str | None = None,
    ):
        self.model, self.layer = _model_and_layer(model, layer)
        if not self.layer.data_is_current():
            raise StaleDataError(
                "The `layer`'s rows are stale: pm.set_data replaced a row array after the layer "
                "read it. Pass layer=None (a fresh layer) or rebuild the step."
            )
        observed = [rv.name for rv in self.model.observed_RVs]
        self.observed_names = observed
        self.var_name = str(var_name) if var_name is not None else "+".join(observed)
        self.row_dim = _row_dim(self.model, observed)
        self.n_rows = int(self.layer.n_rows)
        layer = self.layer
        self.value_vars = [*layer.value_vars, *layer.held_vars]
        self.n_sampled = int(layer.dim)
        self.rvs = [self.model.values_to_rvs[v] for v in self.value_vars]
        shapes = self.model.eval_rv_shapes()
        self.rv_shapes = [tuple(int(s) for s in shapes[rv.name]) for rv in self.rvs]
        self.transformed = any(self.model.rvs_to_transforms.get(rv) is not None for rv in self.rvs)
        self._to_values: Callable[..., np.ndarray] | None = None

    # ------------------------------------------------------------------ draws -> theta
    def value_draws(
        self, posterior: xr.Dataset, argument: str = "idata"
    ) -> tuple[np.ndarray, tuple[int, ...]]:
        """The draws of ``posterior`` in the value variables' space, raveled.

        Returns the ``(S, d + h)`` matrix (sampled value variables in the layer's order, then
        the held ones) and the sample shape (``(chains, draws)``, or ``()`` for a point).
        """
        present = set(posterior.data_vars)
        missing = [rv.name for rv in self.rvs if rv.name not in present]
        if missing:
            raise ValueError(
                f"`{argument}`'s posterior has no draws of the model's free variables {missing} "
                f"(it holds {sorted(map(str, present))}): pass the `model` these draws come from."
            )
        named_dims = self.model.named_vars_to_dims
        sample_shape: tuple[int, ...] | None = None
        blocks = []
        for rv, shape in zip(self.rvs, self.rv_shapes):
            draws = posterior[rv.name]
            sample = [d for d in SAMPLE_DIMS if d in draws.dims]
            own = [d for d in draws.dims if d not in SAMPLE_DIMS]
            dims = named_dims.get(rv.name)
            if dims is not None and sorted(map(str, dims)) == sorted(map(str, own)):
                own = list(dims)
            values = np.asarray(draws.transpose(*sample, *own).values)
            this_sample, this_shape = values.shape[: len(sample)], values.shape[len(sample) :]
            if tuple(this_shape) != shape:
                raise ValueError(
                    f"The `model`'s free variable {rv.name!r} has shape {shape} but "
                    f"`{argument}`'s posterior draws of it have shape {tuple(this_shape)}: the "
                    "model does not match the posterior."
                )
            if sample_shape is None:
                sample_shape = tuple(this_sample)
            elif tuple(this_sample) != sample_shape:
                raise ValueError(
                    f"`{argument}`'s posterior variables have different sample shapes "
                    f"({sample_shape} and {tuple(this_sample)} for {rv.name!r})."
                )
            blocks.append(values.reshape(-1, *shape))
        sample_shape = sample_shape if sample_shape is not None else ()
        if not blocks:
            return np.zeros((int(np.prod(sample_shape)), 0)), sample_shape
        if not self.transformed:
            flat = [b.reshape(len(b), -1).astype(np.float64) for b in blocks]
            return np.ascontiguousarray(np.concatenate(flat, axis=1)), sample_shape
        if self._to_values is None:
            self._to_values = self._compile_to_values()
        inputs = [np.asarray(b, dtype=rv.dtype) for b, rv in zip(blocks, self.rvs)]
        theta = np.ascontiguousarray(self._to_values(*inputs), dtype=np.float64)
        return theta, sample_shape

    def _compile_to_values(self) -> Callable[..., np.ndarray]:
        """Compile constrained draws (a leading draw axis) -> raveled value variables.

        Each variable's forward transform is applied with the other free variables it
        depends on (e.g. an interval's bounds) replaced by their constrained draws.
        """
        model = self.model
        constrained = {rv: rv.type() for rv in self.rvs}
        outputs = []
        for rv in self.rvs:
            transform = model.rvs_to_transforms.get(rv)
            value = constrained[rv]
            if transform is not None:
                value = transform.forward(value, *rv.owner.inputs)
            outputs.append(value)
        outputs = graph_replace(outputs, constrained, strict=False)
        batched = {
            c: pt.tensor(f"{rv.name}_draws", dtype=c.dtype, shape=(None, *c.type.shape))
            for rv, c in constrained.items()
        }
        outputs = vectorize_graph(outputs, replace=batched)
        flat = pt.concatenate(
            [pt.cast(o.reshape((o.shape[0], -1)), "float64") for o in outputs], axis=1
        )
        fn = pytensor.function(
            list(batched.values()), flat, mode=TRANSFORM_MODE, on_unused_input="ignore"
        )
        return fn

    # ------------------------------------------------------------------ terms
    def terms(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``l_i(theta_s)`` for every draw (rows of ``theta``) and row index: ``(S, n)``.

        Each distinct row is read once (sorted, in blocks of the layer's ``chunk_rows``);
        duplicates and the given order are restored afterwards.
        """
        layer = self.layer
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        unique, inverse = np.unique(rows, return_inverse=True)
        theta = np.ascontiguousarray(theta, dtype=np.float64)
        sampled, held = theta[:, : self.n_sampled], theta[:, self.n_sampled :]
        out = np.empty((len(theta), len(unique)))
        saved = layer.held_values.get_value() if held.shape[1] else None
        try:
            for start in range(0, len(unique), layer.chunk_rows):
                block = slice(start, start + layer.chunk_rows)
                data = layer.take_rows(unique[block])
                for s in range(len(theta)):
                    if saved is not None:
                        layer.hold(held[s])
                    out[s, block] = layer.row_logp(sampled[s], data)
        finally:
            if saved is not None:
                layer.hold(saved)
        return out[:, inverse]

    def all_rows_at(self, theta: np.ndarray) -> np.ndarray:
        """``l_i(theta)`` of every row at one point, in one chunked pass: ``(N,)``."""
        layer = self.layer
        theta = np.ascontiguousarray(theta, dtype=np.float64).reshape(-1)
        if len(theta) > self.n_sampled:
            raise ModelNotSupportedError(
                "method='plpd' evaluates the rows at the posterior mean, which is no value of "
                f"the discrete variables {[v.name for v in layer.held_vars]}; use "
                "method='lpd' (every draw) or add_log_likelihood's subsample instead."
            )
        out = np.empty(self.n_rows)
        start = 0
        for data in layer.rows.chunks(layer.chunk_rows):
            stop = start + len(data[0])
            out[start:stop] = layer.row_logp(theta, data)
            start = stop
        return out

    # ------------------------------------------------------------------ arviz-stats hook
    def log_lik_fn(self, max_values: int) -> Callable[[xr.DataArray, Any], xr.DataArray]:
        """The ``log_lik_fn(observed, data)`` of ``arviz_stats.loo_subsample``.

        ``observed`` holds row indices (the ``observed_data`` of
        :func:`loo_subsample_inputs`): all ``N`` of them (then one chunked pass over the rows,
        without reading the index array) or a selection.  With a posterior point (no
        ``chain``/``draw``, ``method="plpd"``) the result has the row dimension only; with
        draws it has ``(chain, draw, row)``.
        """

        def log_lik_fn(observed: xr.DataArray, data: Any) -> xr.DataArray:
            posterior = _as_dataset(data.posterior)
            theta, sample_shape = self.value_draws(posterior, argument="data")
            has_rows = self.row_dim in observed.dims
            every_row = has_rows and observed.sizes[self.row_dim] == self.n_rows
            n = self.n_rows if every_row else int(np.size(observed))
            _check_budget(len(theta) * n, max_values, "log_lik_fn")
            if not sample_shape and every_row:
                values = self.all_rows_at(theta[0])
            else:
                rows = np.arange(self.n_rows) if every_row else np.asarray(observed.values)
                rows = _checked_rows(np.atleast_1d(rows), self.n_rows, "observed", unique=False)
                values = self.terms(theta, rows)
            sample = [d for d in SAMPLE_DIMS if d in posterior.dims]
            dims = [*sample, self.row_dim] if has_rows else sample
            coords = {d: posterior[d] for d in sample if d in posterior.coords}
            if has_rows and self.row_dim in observed.coords:
                coords[self.row_dim] = observed.coords[self.row_dim]
            shape = [*sample_shape, n] if has_rows else list(sample_shape)
            return xr.DataArray(values.reshape(shape), dims=dims, coords=coords, name=self.var_name)

        return log_lik_fn

    def attrs(self) -> dict[str, Any]:
        """Attributes every group this module writes carries."""
        return {
            "n_rows": self.n_rows,
            "row_dim": self.row_dim,
            "observed_vars": ",".join(self.observed_names),
            "terms": (
                "unscaled per-row log-likelihood l_i(theta) (no total_size or N/n scaling), "
                "summed over the observed variables and each row's trailing axes"
            ),
        }


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
        values, as ``pm.sample`` stores them), e.g. from ``pm.sample(step=pmb.SGHMC())``.
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
    posterior = _posterior(idata)
    terms = _RowTerms(model, layer, var_name)
    indices = _checked_rows(rows, terms.n_rows, "rows", unique=False)
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
    posterior = _posterior(idata)
    if "log_likelihood" in idata.children and not overwrite:
        raise ValueError(
            "`idata` already has a log_likelihood group; pass overwrite=True to replace it."
        )
    terms = _RowTerms(model, layer, var_name)
    n = terms.n_rows
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
    else:
        indices = _checked_rows(rows, n, "rows")
        sampling = "given row indices"
    values = _terms_array(terms, posterior, indices)
    attrs = terms.attrs()
    attrs.update(
        {
            "subsample_size": len(indices),
            "is_subsample": int(len(indices) < n),
            "row_indices": indices,
            "row_sampling": sampling,
        }
    )
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        attrs["seed"] = int(seed)
    values.attrs.update(attrs)
    group = values.to_dataset()
    group.attrs.update(attrs)
    idata["log_likelihood"] = group
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
    posterior = _posterior(idata)
    terms = _RowTerms(model, layer, var_name)
    theta, sample_shape = terms.value_draws(posterior)
    if len(sample_shape) != 2:
        raise ValueError("`idata`'s posterior must have 'chain' and 'draw' dimensions.")
    backend = _LazyTerms(terms, theta, sample_shape, int(max_values))
    attrs = terms.attrs()
    attrs["lazy"] = "values computed on read for the selected rows and draws (not stored)"
    # the row indices as a pandas RangeIndex coordinate: O(1) memory, and update_subsample
    # and compare select rows by this coordinate
    rows = pd.RangeIndex(terms.n_rows, name=terms.row_dim)
    coords = {d: posterior[d] for d in SAMPLE_DIMS if d in posterior.coords}
    coords[terms.row_dim] = rows
    log_lik = xr.Dataset(
        {
            terms.var_name: xr.Variable(
                (*SAMPLE_DIMS, terms.row_dim), indexing.LazilyIndexedArray(backend)
            )
        },
        coords=coords,
        attrs=attrs,
    )
    observed = xr.Dataset(
        {
            terms.var_name: xr.Variable(
                (terms.row_dim,), indexing.LazilyIndexedArray(_RowIndices(terms.n_rows))
            )
        },
        coords={terms.row_dim: rows},
        attrs={
            **attrs,
            "lazy": "row indices 0..N-1: log_lik_fn reads the rows through the layer",
        },
    )
    data = idata.copy()
    data["log_likelihood"] = log_lik
    data["observed_data"] = observed
    return {
        "data": data,
        "var_name": terms.var_name,
        "method": "plpd",
        "log_lik_fn": terms.log_lik_fn(int(max_values)),
    }


# ---------------------------------------------------------------------- lazy arrays
class _LazyTerms(BackendArray):
    """``(chain, draw, N)`` per-row terms computed on read (xarray's lazy indexing)."""

    def __init__(
        self, terms: _RowTerms, theta: np.ndarray, sample_shape: tuple[int, ...], max_values: int
    ):
        self.terms = terms
        self.theta = theta
        self.shape = (*sample_shape, terms.n_rows)
        self.dtype = np.dtype(np.float64)
        self.max_values = max_values

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._read
        )

    def _read(self, key: tuple) -> np.ndarray:
        chains, draws, rows = (_axis_index(k, n) for k, n in zip(key, self.shape))
        n_values = len(chains[0]) * len(draws[0]) * len(rows[0])
        _check_budget(n_values, self.max_values, "the lazy log_likelihood group")
        n_draws = self.shape[1]
        flat = (np.asarray(chains[0])[:, None] * n_draws + np.asarray(draws[0])[None, :]).ravel()
        values = self.terms.terms(self.theta[flat], np.asarray(rows[0]))
        values = values.reshape(len(chains[0]), len(draws[0]), len(rows[0]))
        drop = tuple(i for i, (_, scalar) in enumerate((chains, draws, rows)) if scalar)
        return values.squeeze(axis=drop) if drop else values

    def __deepcopy__(self, memo: dict) -> _LazyTerms:
        return self  # a function of the posterior and the data: nothing to copy


class _RowIndices(BackendArray):
    """The row indices ``0..N-1``, produced on read."""

    def __init__(self, n_rows: int):
        self.shape = (n_rows,)
        self.dtype = np.dtype(np.int64)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._read
        )

    def _read(self, key: tuple) -> np.ndarray:
        index, scalar = _axis_index(key[0], self.shape[0])
        values = np.asarray(index, dtype=np.int64)
        return values[0] if scalar else values

    def __deepcopy__(self, memo: dict) -> _RowIndices:
        return self


def _axis_index(key: Any, n: int) -> tuple[range | np.ndarray, bool]:
    """One axis of an outer indexer as positions (a ``range`` for a slice, so no array of
    ``N`` is made) and whether the key was a scalar."""
    if isinstance(key, slice):
        return range(n)[key], False
    if np.ndim(key) == 0:
        i = range(n)[int(key)]
        return range(i, i + 1), True
    key = np.asarray(key)
    if key.dtype == bool:
        return np.flatnonzero(key), False
    return np.where(key < 0, key + n, key).astype(np.int64), False


def _check_budget(n_values: int, max_values: int, what: str) -> None:
    if n_values > max_values:
        raise ValueError(
            f"{what} was asked for {n_values:,} values (draws x rows, "
            f"{n_values * 8 / 2**30:.1f} GiB), above max_values = {max_values:,}: something "
            "read every row at every draw. Use arviz_stats.loo_subsample with "
            "method='plpd' and the log_lik_fn of loo_subsample_inputs (not arviz_stats.loo, "
            "not method='lpd'), thin the posterior, or raise max_values."
        )


# ---------------------------------------------------------------------- helpers
def _model_and_layer(
    model: pm.Model | None, layer: MinibatchModel | None
) -> tuple[pm.Model, MinibatchModel]:
    if layer is not None:
        if not isinstance(layer, MinibatchModel):
            raise TypeError(
                f"`layer` must be a pymc_bigdata.MinibatchModel, got {type(layer).__name__}."
            )
        if model is not None and layer.model is not model:
            raise ValueError("`layer` was built on another model than `model`.")
        return layer.model, layer
    try:
        model = pm.modelcontext(model)
    except TypeError as exc:
        raise ValueError(
            "No `model` given and no model in context: pass model= (or layer=)."
        ) from exc
    discrete = [v for v in model.value_vars if v.dtype.startswith(("int", "uint", "bool"))]
    if discrete:
        continuous = [v for v in model.value_vars if v not in discrete]
        if not continuous:
            return model, MinibatchModel(model, discrete=True)
        return model, MinibatchModel(model, vars=continuous)  # discrete variables held
    return model, MinibatchModel(model)


def _row_dim(model: pm.Model, observed: list[str]) -> str:
    """The row dimension's name as PyMC's ``log_likelihood`` group names it."""
    firsts = []
    for name in observed:
        dims = model.named_vars_to_dims.get(name)
        firsts.append(dims[0] if dims and dims[0] is not None else f"{name}_dim_0")
    if len(set(firsts)) == 1:
        return str(firsts[0])
    return "row"


def _posterior(idata: Any) -> xr.Dataset:
    if not isinstance(idata, xr.DataTree):
        raise TypeError(
            f"`idata` must be an xarray.DataTree (pm.sample's result), got {type(idata).__name__}."
        )
    if "posterior" not in idata.children:
        raise ValueError("`idata` has no posterior group: pass pm.sample's result.")
    posterior = _as_dataset(idata["posterior"])
    missing = [d for d in SAMPLE_DIMS if d not in posterior.dims]
    if missing:
        raise ValueError(f"`idata`'s posterior has no {missing} dimension.")
    return posterior


def _as_dataset(group: Any) -> xr.Dataset:
    if isinstance(group, xr.DataTree):
        return group.to_dataset()
    if isinstance(group, xr.Dataset):
        return group
    raise TypeError(f"expected a posterior Dataset or DataTree, got {type(group).__name__}")


def _checked_rows(rows: Any, n_rows: int, argument: str, unique: bool = True) -> np.ndarray:
    """Row indices as int64, checked: 1-D, integers, within ``[0, N)`` (and distinct)."""
    indices = np.asarray(rows)
    if indices.ndim != 1 or indices.size == 0:
        raise ValueError(
            f"`{argument}` must be a non-empty 1-D array of row indices, got shape {indices.shape}."
        )
    if not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"`{argument}` must hold integer row indices, got {indices.dtype}.")
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= n_rows:
        raise ValueError(
            f"`{argument}` must index rows 0 to N - 1 = {n_rows - 1}, got [{low}, {high}]."
        )
    if unique and len(np.unique(indices)) != len(indices):
        raise ValueError(f"`{argument}` repeats row indices.")
    return indices.astype(np.int64)


def _terms_array(terms: _RowTerms, posterior: xr.Dataset, indices: np.ndarray) -> xr.DataArray:
    theta, sample_shape = terms.value_draws(posterior)
    values = terms.terms(theta, indices).reshape(*sample_shape, len(indices))
    coords = {d: posterior[d] for d in SAMPLE_DIMS if d in posterior.coords}
    coords[terms.row_dim] = indices
    return xr.DataArray(
        values, dims=(*SAMPLE_DIMS, terms.row_dim), coords=coords, name=terms.var_name
    )
