"""SBPS's continuous-time estimates: averages along the piecewise-linear path (Eq. 19).

SBPS moves on straight lines, so the time average of a test function over a draw's travel
is an integral along each line: exact for ``theta`` and ``theta^2`` (the stats ``path_mean``
and ``path_sq_mean``, from the kernel's integrals), and by Gauss-Legendre quadrature for the
user's ``path_functions`` (:class:`PathFunctions`, the stats ``path_<name>``).
:func:`continuous_estimates` averages them over the kept draws, each weighted by its travel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from pymc_bigdata.kernels.sbps import Skeleton
from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = ["PathFunctions", "continuous_estimates"]


class PathFunctions:
    """The user's path functions: their checks, shapes, stats and line averages.

    Parameters
    ----------
    functions
        ``name -> f``, each ``f`` mapping an ``(m, d)`` array of unconstrained parameter
        vectors to an array of shape ``(m, ...)`` (None: none).
    quadrature_nodes
        Gauss-Legendre nodes per straight line.
    """

    def __init__(self, functions: Mapping[str, Callable] | None, quadrature_nodes: int):
        self.functions = _check_path_functions(functions)
        if not (isinstance(quadrature_nodes, int) and quadrature_nodes >= 1):
            raise ValueError(f"quadrature_nodes must be an integer >= 1, got {quadrature_nodes!r}.")
        self._nodes, self._weights = _gauss_legendre(quadrature_nodes)
        self.shapes: dict[str, tuple[int, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.functions)

    def check_shapes(self, initial_theta: np.ndarray) -> None:
        """The shape of one value of each function, from two copies of the model's initial
        point (before the full-data MAP search); a clear error for a wrong shape."""
        points = np.repeat(initial_theta[None, :], 2, axis=0)
        self.shapes = {}
        for name, function in self.functions.items():
            values = np.asarray(function(points), dtype=np.float64)
            if values.ndim == 0 or values.shape[0] != 2:
                raise ValueError(
                    f"path_functions[{name!r}] must map an (m, d) array of unconstrained "
                    f"parameter vectors (d = {len(initial_theta)}) to an array of shape (m, ...); "
                    f"on 2 points it returned shape {values.shape}."
                )
            self.shapes[name] = values.shape[1:]

    def stats_dtypes_shapes(self, dim: int) -> dict[str, tuple[Any, list]]:
        """The path stats: ``path_mean``, ``path_sq_mean`` and ``path_<name>``."""
        # declared object: PyMC's NDArray backend stores one scalar per draw and stat whatever
        # the shape; the DataTree then holds them as float64 (chain, draw, d)
        return {
            "path_mean": (object, [dim]),
            "path_sq_mean": (object, [dim]),
            # scalar functions as float64 (an object scalar would gain a dimension of size 1)
            **{
                f"path_{name}": (object if shape else np.float64, list(shape))
                for name, shape in self.shapes.items()
            },
        }

    def missing(self) -> dict[str, np.ndarray]:
        """NaN values of the functions' stats (a draw that travelled nowhere)."""
        return {f"path_{name}": np.full(shape, np.nan) for name, shape in self.shapes.items()}

    def means(self, skeleton: Skeleton | None, travel: float) -> dict[str, np.ndarray]:
        """Time averages of the functions along the draw's lines (Gauss-Legendre)."""
        if not self.functions:
            return {}
        nodes, weights = self._nodes, self._weights
        starts, ends, durations = skeleton
        points = starts[:, None, :] + (ends - starts)[:, None, :] * nodes[None, :, None]
        flat = points.reshape(-1, starts.shape[1])
        means = {}
        for name, function in self.functions.items():
            values = np.asarray(function(flat), dtype=np.float64)
            values = values.reshape(len(durations), len(nodes), *values.shape[1:])
            line_means = np.tensordot(values, weights, axes=([1], [0]))
            means[f"path_{name}"] = np.tensordot(durations, line_means, axes=1) / travel
        return means


def continuous_estimates(
    idata, layer: MinibatchModel, names: list[str], var_names: list[str] | None = None
) -> xr.Dataset:
    """Trajectory averages (Eq. 19) of the unconstrained parameters, over all chains.

    Uses the ``path_mean`` and ``path_sq_mean`` stats of the kept draws: each is the exact
    time average of ``theta`` (or ``theta^2``) along the straight pieces travelled since the
    previous draw, so their mean over draws is the continuous-time average of the whole
    trajectory after tuning (each draw weighted by its travel time).  Returns a Dataset with,
    per value variable (by its unconstrained name, e.g. ``sigma_log__``), ``<name>`` (mean)
    and ``<name>_sd``, and for each path function in ``names`` its trajectory average as
    ``path_<name>``.
    """
    stats = idata.sample_stats
    travel = stats["travel_time"]  # time weights: a draw stopped early travelled less
    total = travel.sum(dim=("chain", "draw"))
    means = ((stats["path_mean"] * travel).sum(dim=("chain", "draw")) / total).values
    squares = ((stats["path_sq_mean"] * travel).sum(dim=("chain", "draw")) / total).values
    sds = np.sqrt(np.maximum(squares - means * means, 0.0))
    out = {}
    for name, sl, shape in layer.value_var_slices():
        if var_names is not None and name not in var_names:
            continue
        out[name] = xr.DataArray(means[sl].reshape(shape))
        out[f"{name}_sd"] = xr.DataArray(sds[sl].reshape(shape))
    for name in names:
        key = f"path_{name}"
        if key not in stats:
            raise ValueError(
                f"the result has no stat {key!r}: was it sampled with this step's path_functions?"
            )
        out[key] = (stats[key] * travel).sum(dim=("chain", "draw")) / total
    return xr.Dataset(out)


def _check_path_functions(functions) -> dict[str, Callable]:
    """``path_functions`` as a dict of callables with names usable in a stat name."""
    if functions is None:
        return {}
    if not isinstance(functions, Mapping):
        raise ValueError(
            f"path_functions must be a dict of name -> function, got {type(functions).__name__}."
        )
    for name, function in functions.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"path_functions: {name!r} is not a valid name.")
        if not callable(function):
            raise ValueError(f"path_functions[{name!r}] is not callable.")
    return dict(functions)


def _gauss_legendre(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes on [0, 1] and weights summing to 1."""
    nodes, weights = np.polynomial.legendre.leggauss(count)
    return 0.5 * (nodes + 1.0), 0.5 * weights
