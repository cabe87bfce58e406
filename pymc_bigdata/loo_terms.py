"""Per-row log-likelihood terms of a model at posterior draws, read through its layer.

:class:`RowTerms` maps a posterior's draws to the model's value variables
(:meth:`~RowTerms.value_draws`), computes ``l_i(theta_s)`` of given rows at every draw
(:meth:`~RowTerms.terms`) or of every row at one point (:meth:`~RowTerms.all_rows_at`), and
gives ``arviz_stats.loo_subsample`` its ``log_lik_fn``. :func:`model_and_layer` resolves the
``model``/``layer`` arguments of :mod:`pymc_bigdata.loo`; :func:`row_dim` names the row
dimension as PyMC's ``log_likelihood`` group does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import xarray as xr
from pytensor.graph.replace import graph_replace, vectorize_graph

from pymc_bigdata.errors import ModelNotSupportedError, StaleDataError
from pymc_bigdata.loo_checks import SAMPLE_DIMS, as_dataset, check_budget, checked_rows
from pymc_bigdata.model.compiled import strict_floats
from pymc_bigdata.model.layer_cache import cached_layer
from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = ["TRANSFORM_MODE", "RowTerms", "model_and_layer", "row_dim"]

#: compile mode of the (small, once per posterior) constrained -> value-space transform
TRANSFORM_MODE = "FAST_COMPILE"


class RowTerms:
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
        self.model, self.layer = model_and_layer(model, layer)
        if not self.layer.data_is_current():
            raise StaleDataError(
                "The `layer`'s rows are stale: pm.set_data replaced a row array after the layer "
                "read it. Pass layer=None (a fresh layer) or rebuild the step."
            )
        observed = [rv.name for rv in self.model.observed_RVs]
        self.observed_names = observed
        self.var_name = str(var_name) if var_name is not None else "+".join(observed)
        self.row_dim = row_dim(self.model, observed)
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
        blocks, sample_shape = self._draw_blocks(posterior, argument)
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

    def _draw_blocks(
        self, posterior: xr.Dataset, argument: str
    ) -> tuple[list[np.ndarray], tuple[int, ...]]:
        """Each free variable's constrained draws, ``(S, *shape)``, and the sample shape."""
        sample_shape: tuple[int, ...] | None = None
        blocks = []
        for rv, shape in zip(self.rvs, self.rv_shapes):
            draws = posterior[rv.name]
            values, this_sample = self._variable_draws(draws, rv.name, shape, argument)
            if sample_shape is None:
                sample_shape = this_sample
            elif this_sample != sample_shape:
                raise ValueError(
                    f"`{argument}`'s posterior variables have different sample shapes "
                    f"({sample_shape} and {this_sample} for {rv.name!r})."
                )
            blocks.append(values.reshape(-1, *shape))
        return blocks, sample_shape if sample_shape is not None else ()

    def _variable_draws(
        self, draws: xr.DataArray, name: str, shape: tuple[int, ...], argument: str
    ) -> tuple[np.ndarray, tuple[int, ...]]:
        """One variable's draws, sample dims first then its own in the model's order, and
        the sample shape; refuses draws whose own shape is not the model's."""
        sample = [d for d in SAMPLE_DIMS if d in draws.dims]
        own = [d for d in draws.dims if d not in SAMPLE_DIMS]
        dims = self.model.named_vars_to_dims.get(name)
        if dims is not None and sorted(map(str, dims)) == sorted(map(str, own)):
            own = list(dims)
        values = np.asarray(draws.transpose(*sample, *own).values)
        this_sample, this_shape = values.shape[: len(sample)], values.shape[len(sample) :]
        if tuple(this_shape) != shape:
            raise ValueError(
                f"The `model`'s free variable {name!r} has shape {shape} but "
                f"`{argument}`'s posterior draws of it have shape {tuple(this_shape)}: the "
                "model does not match the posterior."
            )
        return values, tuple(this_sample)

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
        with strict_floats():
            return pytensor.function(
                list(batched.values()), flat, mode=TRANSFORM_MODE, on_unused_input="ignore"
            )

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
        :func:`~pymc_bigdata.loo.loo_subsample_inputs`): all ``N`` of them (then one chunked
        pass over the rows, without reading the index array) or a selection.  With a
        posterior point (no ``chain``/``draw``, ``method="plpd"``) the result has the row
        dimension only; with draws it has ``(chain, draw, row)``.
        """

        def log_lik_fn(observed: xr.DataArray, data: Any) -> xr.DataArray:
            posterior = as_dataset(data.posterior)
            theta, sample_shape = self.value_draws(posterior, argument="data")
            has_rows = self.row_dim in observed.dims
            every_row = has_rows and observed.sizes[self.row_dim] == self.n_rows
            n = self.n_rows if every_row else int(np.size(observed))
            check_budget(len(theta) * n, max_values, "log_lik_fn")
            if not sample_shape and every_row:
                values = self.all_rows_at(theta[0])
            else:
                rows = np.arange(self.n_rows) if every_row else np.asarray(observed.values)
                rows = checked_rows(np.atleast_1d(rows), self.n_rows, "observed", unique=False)
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
        """Attributes every group :mod:`pymc_bigdata.loo` writes carries."""
        return {
            "n_rows": self.n_rows,
            "row_dim": self.row_dim,
            "observed_vars": ",".join(self.observed_names),
            "terms": (
                "unscaled per-row log-likelihood l_i(theta) (no total_size or N/n scaling), "
                "summed over the observed variables and each row's trailing axes"
            ),
        }


def model_and_layer(
    model: pm.Model | None, layer: MinibatchModel | None
) -> tuple[pm.Model, MinibatchModel]:
    """The model and its layer from the ``model``/``layer`` arguments.

    Parameters
    ----------
    model
        The model, or None (``layer.model``, or the model in context).
    layer
        Its :class:`~pymc_bigdata.MinibatchModel`, or None: the model's kept layer
        (:mod:`~pymc_bigdata.model.layer_cache`) or a new one, its discrete variables held
        (or a discrete layer when every variable is discrete).

    Returns
    -------
    tuple
        ``(model, layer)``.

    Raises
    ------
    TypeError
        If ``layer`` is not a :class:`~pymc_bigdata.MinibatchModel`.
    ValueError
        If ``layer`` was built on another model, or there is no model.
    """
    if layer is not None:
        if not isinstance(layer, MinibatchModel):
            raise TypeError(
                f"`layer` must be a pymc_bigdata.MinibatchModel, got {type(layer).__name__}."
            )
        if model is not None and layer.model is not model:
            raise ValueError("`layer` was built on another model than `model`.")
        return layer.model, layer.model_layer  # the model's own coordinates
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
            return model, cached_layer(model, None, None, discrete=True)
        return model, cached_layer(model, continuous, None)  # discrete variables held
    return model, cached_layer(model, None, None)


def row_dim(model: pm.Model, observed: list[str]) -> str:
    """The row dimension's name as PyMC's ``log_likelihood`` group names it.

    Parameters
    ----------
    model
        The model.
    observed
        Its observed variables' names.

    Returns
    -------
    str
        Their shared first dimension (its ``dims=`` entry or ``"<name>_dim_0"``), else
        ``"row"``.
    """
    firsts = []
    for name in observed:
        dims = model.named_vars_to_dims.get(name)
        firsts.append(dims[0] if dims and dims[0] is not None else f"{name}_dim_0")
    if len(set(firsts)) == 1:
        return str(firsts[0])
    return "row"
