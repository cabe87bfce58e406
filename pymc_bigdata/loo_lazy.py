"""Lazily indexed arrays for :func:`pymc_bigdata.loo.loo_subsample_inputs`: values on read.

* :class:`LazyTerms` -- the ``(chain, draw, N)`` per-row terms, computed for the rows and
  draws a read selects (through :class:`~pymc_bigdata.loo_terms.RowTerms`), within a budget;
* :class:`RowIndices` -- the row indices ``0..N-1``, produced on read;
* :func:`axis_index` -- one axis of xarray's outer indexer as positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xarray.backends import BackendArray
from xarray.core import indexing

from pymc_bigdata.loo_checks import check_budget
from pymc_bigdata.loo_terms import RowTerms

__all__ = ["LazyTerms", "RowIndices", "axis_index"]


class LazyTerms(BackendArray):
    """``(chain, draw, N)`` per-row terms computed on read (xarray's lazy indexing).

    Parameters
    ----------
    terms
        The model's per-row terms.
    theta
        The posterior's draws in the value variables' space, ``(chains * draws, d + h)``.
    sample_shape
        ``(chains, draws)``.
    max_values
        Most draws x rows one read may compute.
    """

    def __init__(
        self, terms: RowTerms, theta: np.ndarray, sample_shape: tuple[int, ...], max_values: int
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
        chains, draws, rows = (axis_index(k, n) for k, n in zip(key, self.shape))
        n_values = len(chains[0]) * len(draws[0]) * len(rows[0])
        check_budget(n_values, self.max_values, "the lazy log_likelihood group")
        n_draws = self.shape[1]
        flat = (np.asarray(chains[0])[:, None] * n_draws + np.asarray(draws[0])[None, :]).ravel()
        values = self.terms.terms(self.theta[flat], np.asarray(rows[0]))
        values = values.reshape(len(chains[0]), len(draws[0]), len(rows[0]))
        drop = tuple(i for i, (_, scalar) in enumerate((chains, draws, rows)) if scalar)
        return values.squeeze(axis=drop) if drop else values

    def __deepcopy__(self, memo: dict) -> LazyTerms:
        return self  # a function of the posterior and the data: nothing to copy


class RowIndices(BackendArray):
    """The row indices ``0..N-1``, produced on read.

    Parameters
    ----------
    n_rows
        ``N``.
    """

    def __init__(self, n_rows: int):
        self.shape = (n_rows,)
        self.dtype = np.dtype(np.int64)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._read
        )

    def _read(self, key: tuple) -> np.ndarray:
        index, scalar = axis_index(key[0], self.shape[0])
        values = np.asarray(index, dtype=np.int64)
        return values[0] if scalar else values

    def __deepcopy__(self, memo: dict) -> RowIndices:
        return self


def axis_index(key: Any, n: int) -> tuple[range | np.ndarray, bool]:
    """One axis of an outer indexer as positions, and whether the key was a scalar.

    Parameters
    ----------
    key
        A slice, an integer, or an integer or boolean array.
    n
        The axis' length.

    Returns
    -------
    tuple
        The positions (a ``range`` for a slice or a scalar, so no array of ``N`` is made)
        and whether ``key`` was a scalar.
    """
    if isinstance(key, slice):
        return range(n)[key], False
    if np.ndim(key) == 0:
        i = range(n)[int(key)]
        return range(i, i + 1), True
    key = np.asarray(key)
    if key.dtype == bool:
        return np.flatnonzero(key), False
    return np.where(key < 0, key + n, key).astype(np.int64), False
