"""``pmbd.Data``: declare a big per-row array once, in an otherwise ordinary PyMC model.

``pm.Data`` puts the whole array into the model's graph (and into the result's
``constant_data`` / ``observed_data`` groups). ``pmbd.Data`` puts a zero-row stand-in of the
same dtype and row shape there instead and attaches the array itself, opened lazily, for
the model layer (:class:`pymc_bigdata.MinibatchModel`): every sampler, the MAP search, the
adaptation and the control-variate sums then read its rows through the row source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.sources import Column, as_column
from pymc_bigdata.sources_arrow import is_table_source, open_table

__all__ = ["Data", "row_column"]

GATHERS = ("rows", "blocks", "windows")


def Data(  # noqa: N802 - named like pm.Data, which it stands in for
    name: str,
    source: Any,
    *,
    columns: str | Sequence[str] | None = None,
    dims: Sequence[str] | str | None = None,
    gather: str | None = None,
    block_rows: int | None = None,
    active_blocks: int | None = None,
    reuse: float = 1.0,
    model: pm.Model | None = None,
) -> TensorSharedVariable:
    """A per-row data array that stays where it is (memory, ``.npy``, zarr, dask, Parquet).

    Use it like ``pm.Data`` for covariates and as ``observed=`` values; its leading axis is
    the row axis, shared by every row array of the model.

    Parameters
    ----------
    name
        Name of the data variable in the model.
    source
        A numpy array, an ``np.memmap`` or the path of a ``.npy`` file (read through the
        page cache), a zarr array or the path of a zarr array's store (read chunk by chunk;
        the ``zarr`` extra), a dask array with known chunk sizes (the ``dask`` extra;
        full-data passes run as dask reductions), or columns of a table (the ``parquet``
        extra): a Parquet file, a directory or glob of them or a list of paths (read row
        group by row group), a ``pyarrow.dataset`` of Parquet files, a ``pyarrow.Table``,
        a polars ``DataFrame`` or ``LazyFrame``; see ``columns``.
    columns
        For a table source: the column to read (a name: rows of scalars) or the columns (a
        list of names: rows of that many values, in that order). Default: the column called
        ``name``, or the table's only column.
    dims
        Dimension names, as for ``pm.Data``. The row dimension gets no coordinate values
        (a stand-in with zero rows is what the model's graph holds); do not give
        coordinates for it.
    gather
        How minibatches read rows. ``"windows"`` (the default for in-memory rows of at most
        :data:`pymc_bigdata.rows.WINDOW_COPY_BYTES`, 1 GiB, holding 100 minibatches, whose
        copy takes at most half the available memory; asked for here, at any size, refused
        where the copy would not fit): minibatches drawn without replacement are contiguous
        windows of a copy of the rows in a fixed random order, made once per process
        (:mod:`pymc_bigdata.row_windows`). ``"rows"``: uniform rows (the default for
        ``.npy``, memmap and other in-memory rows; given to any array, it keeps all on
        uniform rows). ``"blocks"``: uniform rows inside a cache of random storage blocks
        (the default for zarr and dask, where reading one row decodes its whole chunk;
        :class:`pymc_bigdata.rows.BlockIndexSampler`); not with ``"windows"``.
    block_rows
        Rows per block for memory and ``.npy`` data (default about 1 MiB); zarr and dask use
        their own chunks.
    active_blocks
        Blocks a block gather holds at once (at least enough for two minibatches). Default:
        16, fewer (at least 2) where 16 blocks of all the row arrays would take more than
        :data:`pymc_bigdata.rows.ACTIVE_BYTES` of decoded rows (large Parquet row groups or
        zarr chunks).
    reuse
        Mean number of times a block gather draws a row while its block is held.
    model
        The model (default: the one in context).

    Returns
    -------
    TensorSharedVariable
        The model's data variable (a zero-row stand-in).

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        A missing or unreadable store, a non-numeric dtype, a scalar, a dask array with
        unknown chunk sizes, or settings out of range, each naming the array.
    """
    if gather is not None and gather not in GATHERS:
        raise ValueError(f"Data {name!r}: gather must be one of {GATHERS}, got {gather!r}.")
    if block_rows is not None and not (
        isinstance(block_rows, int | np.integer)
        and not isinstance(block_rows, bool)
        and block_rows >= 1
    ):
        raise ValueError(
            f"Data {name!r}: block_rows must be a positive integer, got {block_rows!r}."
        )
    if active_blocks is not None and not (
        isinstance(active_blocks, int | np.integer) and active_blocks >= 1
    ):
        raise ValueError(
            f"Data {name!r}: active_blocks must be a positive integer, got {active_blocks!r}."
        )
    if not (isinstance(reuse, int | float) and np.isfinite(reuse) and reuse > 0):
        raise ValueError(f"Data {name!r}: reuse must be a positive number, got {reuse!r}.")
    if isinstance(columns, tuple):
        columns = list(columns)
    column = _open_column(source, name, columns, block_rows)
    column.gather = gather  # None: the row source's default (RowSource's notes)
    column.active_blocks = None if active_blocks is None else int(active_blocks)
    column.reuse = float(reuse)
    stand_in = np.zeros((0, *column.trailing_shape), dtype=column.dtype)
    var = pm.Data(name, stand_in, dims=dims, model=model)
    var.tag.row_column = column
    return var


def _open_column(source: Any, name: str, columns: Any, block_rows: int | None) -> Column:
    """The row column of ``source``: a table's named columns, or an array-like's rows."""
    if is_table_source(source):
        return open_table(source, name, columns)
    if columns is not None:
        raise TypeError(
            f"Data {name!r}: columns= selects columns of a table (Parquet, Arrow, polars); "
            f"a {type(source).__name__} source has none."
        )
    return as_column(source, name, block_rows)


def row_column(var: Any) -> Column | None:
    """The row column a :func:`Data` variable stands for, or None for any other variable."""
    tag = getattr(var, "tag", None)
    return getattr(tag, "row_column", None)
