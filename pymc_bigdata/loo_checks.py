"""The argument checks of :mod:`pymc_bigdata.loo`: the posterior, row indices, the read budget.

* :func:`posterior_of` -- the ``posterior`` group of pm.sample's result, with its draw dims;
* :func:`as_dataset` -- a posterior group (``DataTree`` node or ``Dataset``) as a Dataset;
* :func:`checked_rows` -- row indices as ``int64``, 1-D, within ``[0, N)`` (and distinct);
* :func:`check_budget` -- refuse a read of more draws x rows than ``max_values``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

__all__ = ["SAMPLE_DIMS", "as_dataset", "check_budget", "checked_rows", "posterior_of"]

#: the draws' dimensions of a posterior group, in their order
SAMPLE_DIMS = ("chain", "draw")


def posterior_of(idata: Any) -> xr.Dataset:
    """The ``posterior`` group of ``idata`` as a Dataset with ``chain`` and ``draw`` dims.

    Parameters
    ----------
    idata
        pm.sample's result.

    Returns
    -------
    xarray.Dataset
        The posterior group.

    Raises
    ------
    TypeError
        If ``idata`` is not a ``DataTree``.
    ValueError
        If it has no posterior group, or the group lacks a draw dimension.
    """
    if not isinstance(idata, xr.DataTree):
        raise TypeError(
            f"`idata` must be an xarray.DataTree (pm.sample's result), got {type(idata).__name__}."
        )
    if "posterior" not in idata.children:
        raise ValueError("`idata` has no posterior group: pass pm.sample's result.")
    posterior = as_dataset(idata["posterior"])
    missing = [d for d in SAMPLE_DIMS if d not in posterior.dims]
    if missing:
        raise ValueError(f"`idata`'s posterior has no {missing} dimension.")
    return posterior


def as_dataset(group: Any) -> xr.Dataset:
    """A posterior group, given as a ``DataTree`` node or a ``Dataset``, as a Dataset.

    Parameters
    ----------
    group
        The group.

    Returns
    -------
    xarray.Dataset
        Its variables and coordinates.

    Raises
    ------
    TypeError
        If ``group`` is neither.
    """
    if isinstance(group, xr.DataTree):
        return group.to_dataset()
    if isinstance(group, xr.Dataset):
        return group
    raise TypeError(f"expected a posterior Dataset or DataTree, got {type(group).__name__}")


def checked_rows(rows: Any, n_rows: int, argument: str, unique: bool = True) -> np.ndarray:
    """Row indices as int64, checked: 1-D, integers, within ``[0, N)`` (and distinct).

    Parameters
    ----------
    rows
        The row indices.
    n_rows
        ``N``, the data's rows.
    argument
        The argument's name, for the messages.
    unique
        Refuse repeated indices.

    Returns
    -------
    numpy.ndarray
        The indices, ``int64``, in the given order.

    Raises
    ------
    ValueError
        If any check fails.
    """
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


def check_budget(n_values: int, max_values: int, what: str) -> None:
    """Refuse a read of ``n_values`` draws x rows above ``max_values``.

    Parameters
    ----------
    n_values
        Values the read would compute.
    max_values
        The most one read may compute.
    what
        What is reading, for the message.

    Raises
    ------
    ValueError
        If ``n_values > max_values``.
    """
    if n_values > max_values:
        raise ValueError(
            f"{what} was asked for {n_values:,} values (draws x rows, "
            f"{n_values * 8 / 2**30:.1f} GiB), above max_values = {max_values:,}: something "
            "read every row at every draw. Use arviz_stats.loo_subsample with "
            "method='plpd' and the log_lik_fn of loo_subsample_inputs (not arviz_stats.loo, "
            "not method='lpd'), thin the posterior, or raise max_values."
        )
