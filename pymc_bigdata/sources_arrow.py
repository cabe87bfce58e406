"""Row sources for tables: Parquet files, Arrow tables and datasets, polars frames.

A table source gives one :class:`~pymc_bigdata.sources.Column` made of named table columns:
one name gives a column of rows of scalars, a list of names a column of rows of
``len(names)`` values (in that order, in their common numpy dtype).

* :class:`ParquetColumn` -- Parquet files (a path, a directory, a glob, a list of paths, or
  a ``pyarrow.dataset`` of Parquet files): each row group is a storage block, decoded whole
  (minibatches use the block gather, full-data passes stream the row groups in order);
  only the named columns are read, and memory is bounded by the block cache.
* :class:`ArrowTableColumn` -- a ``pyarrow.Table`` in memory (or a polars ``DataFrame``,
  through its Arrow table, without a copy): rows are taken directly.
* :class:`PolarsLazyColumn` -- a polars ``LazyFrame`` (e.g. ``pl.scan_parquet``): blocks of
  :data:`LAZY_BLOCK_ROWS` rows, each collected as a slice of the query.

Bad input raises an error naming the file and column: a missing column, a type that is not a
number or a boolean (strings, lists, structs, dates...), nulls, files whose schemas disagree.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import numpy as np

from pymc_bigdata.sources import Column, _BlockCache, _ChunkedColumn

__all__ = [
    "LAZY_BLOCK_ROWS",
    "ArrowTableColumn",
    "ParquetColumn",
    "PolarsLazyColumn",
    "is_table_source",
    "open_table",
]

#: rows per block of a polars LazyFrame (one collected slice of the query each)
LAZY_BLOCK_ROWS = 65_536


def is_table_source(source: Any) -> bool:
    """Whether ``source`` is a table (Arrow, polars) or names Parquet files."""
    if isinstance(source, str | os.PathLike):
        text = str(source)
        path = Path(text)
        return (
            text.endswith(".parquet")
            or glob.has_magic(text)
            or (path.is_dir() and any(path.glob("*.parquet")))
        )
    if (
        isinstance(source, list | tuple)
        and source
        and all(isinstance(s, str | os.PathLike) for s in source)
    ):
        return True
    module = type(source).__module__
    return module.startswith(("pyarrow", "polars"))


def open_table(source: Any, name: str, columns: str | list[str] | None = None) -> Column:
    """The column of ``source`` (see the module's docstring) for ``pmbd.Data(name, ...)``."""
    module = type(source).__module__
    if module.startswith("polars"):
        return _open_polars(source, name, columns)
    pa = _import("pyarrow", name)
    if isinstance(source, pa.Table):
        return ArrowTableColumn(source, name, columns)
    if module.startswith("pyarrow.") and hasattr(source, "files"):  # a FileSystemDataset
        return ParquetColumn(list(source.files), name, columns)
    if module.startswith("pyarrow"):
        raise TypeError(
            f"Data {name!r}: a {type(source).__name__} is not a table source; pass a "
            "pyarrow.Table, a pyarrow.dataset of Parquet files, or Parquet paths."
        )
    return ParquetColumn(_parquet_files(source, name), name, columns)


# ------------------------------------------------------------------------------ selections
def _selected(available: list[str], name: str, columns: Any, where: str) -> tuple[list[str], bool]:
    """The column names to read and whether the rows are scalars (one name as a string)."""
    if columns is None:
        if name in available:
            return [name], True
        if len(available) == 1:
            return available, True
        raise ValueError(
            f"Data {name!r}: {where} has columns {available}; say which to read with "
            f"columns='...' (one column) or columns=[...] (rows of several)."
        )
    if isinstance(columns, str):
        selected, scalar = [columns], True
    elif isinstance(columns, list | tuple) and columns and all(isinstance(c, str) for c in columns):
        selected, scalar = list(columns), False
    else:
        raise TypeError(
            f"Data {name!r}: columns must be a column name or a non-empty list of names, "
            f"got {columns!r}."
        )
    missing = [c for c in selected if c not in available]
    if missing:
        raise ValueError(f"Data {name!r}: {where} has no column {missing} (it has {available}).")
    return selected, scalar


def _numpy_dtype(field: Any, name: str, where: str) -> np.dtype:
    """The numpy dtype of an Arrow field, or a TypeError for a non-numeric one."""
    import pyarrow as pa

    kind = field.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.dtype(kind.to_pandas_dtype())
    raise TypeError(
        f"Data {name!r}: column {field.name!r} of {where} has type {kind}, which is not a "
        "number or a boolean: encode categories as integers and select numeric columns."
    )


def _to_numpy(
    table: Any, selected: list[str], scalar: bool, dtype: np.dtype, name: str, where: str
) -> np.ndarray:
    """The rows of ``table``'s ``selected`` columns as numpy (refusing nulls), written
    column by column into one array (no stacked copy)."""
    out = np.empty((table.num_rows, *(() if scalar else (len(selected),))), dtype=dtype)
    for j, column in enumerate(selected):
        values = table.column(column)
        if values.null_count:
            raise ValueError(
                f"Data {name!r}: column {column!r} of {where} has {values.null_count} null "
                "values; drop or fill them before sampling."
            )
        if scalar:
            out[:] = values.to_numpy()
        else:
            out[:, j] = values.to_numpy()
    return out


class _TableColumn(_ChunkedColumn):
    """What table columns share: the selection, its dtype and the rows' shape."""

    def _set_rows(
        self,
        name: str,
        selected: list[str],
        scalar: bool,
        dtype: np.dtype,
        n_rows: int,
        block_rows: list[int],
    ) -> None:
        self.name, self.selected, self.scalar = name, selected, scalar
        self.dtype, self.n_rows = dtype, int(n_rows)
        self.trailing_shape = () if scalar else (len(selected),)
        self.block_bounds = np.concatenate([[0], np.cumsum(block_rows)]).astype(np.int64)
        self.cache = _BlockCache(1)
        self._size_cache()

    def read(self, start: int, stop: int) -> np.ndarray:
        bounds = self.block_bounds
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, max(start, stop - 1), side="right")) - 1
        pieces = []
        for block in range(first, last + 1):
            lo = int(bounds[block])
            data = self._load_block(block)
            pieces.append(data[max(start, lo) - lo : min(stop, int(bounds[block + 1])) - lo])
        if not pieces:
            return np.empty((0, *self.trailing_shape), self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


# --------------------------------------------------------------------------------- parquet
def _parquet_files(source: Any, name: str) -> list[str]:
    """The Parquet files a path, directory, glob or list of paths names, in sorted order."""
    sources = list(source) if isinstance(source, list | tuple) else [source]
    files: list[str] = []
    for item in sources:
        text = str(item)
        path = Path(text)
        if glob.has_magic(text):
            found = sorted(glob.glob(text))
        elif path.is_dir():
            found = sorted(str(p) for p in path.glob("*.parquet"))
        elif path.exists():
            found = [text]
        else:
            raise FileNotFoundError(f"Data {name!r}: no file at {text!r}.")
        if not found:
            raise FileNotFoundError(f"Data {name!r}: no Parquet file matches {text!r}.")
        files.extend(found)
    return files


class ParquetColumn(_TableColumn):
    """Named columns of Parquet files; each row group is a storage block.

    Parameters
    ----------
    files
        The Parquet files, whose rows follow each other in this order.
    name
        The data variable's name (in error messages).
    columns
        A column name, a list of them, or None (the column called ``name``, or the only
        column).
    """

    def __init__(self, files: list[str], name: str, columns: str | list[str] | None):
        pq = _import("pyarrow.parquet", name)
        self.files = [str(f) for f in files]
        self._handles: dict[int, Any] = {}
        first_schema = None
        self.row_groups: list[tuple[int, int]] = []
        block_rows: list[int] = []
        for index, file in enumerate(self.files):
            try:
                meta = pq.ParquetFile(file).metadata
            except Exception as exc:  # pyarrow raises several types for an unreadable file
                raise ValueError(
                    f"Data {name!r}: cannot read {file!r} as Parquet ({type(exc).__name__}: {exc})."
                ) from exc
            schema = meta.schema.to_arrow_schema()
            if first_schema is None:
                first_schema = schema
                selected, scalar = _selected(schema.names, name, columns, f"file {file!r}")
                dtypes = [_numpy_dtype(schema.field(c), name, f"file {file!r}") for c in selected]
            else:
                _check_same_schema(first_schema, schema, selected, name, self.files[0], file)
            _check_no_nulls(meta, schema, selected, name, file)
            for group in range(meta.num_row_groups):
                self.row_groups.append((index, group))
                block_rows.append(meta.row_group(group).num_rows)
        dtype = np.result_type(*dtypes)
        self._set_rows(name, selected, scalar, dtype, sum(block_rows), block_rows)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_handles"] = {}
        return state

    def _load_block(self, block: int) -> np.ndarray:
        index, group = self.row_groups[block]
        handle = self._handles.get(index)
        if handle is None:
            import pyarrow.parquet as pq

            # pre_buffer (pyarrow's default) keeps every row group read in the reader's
            # cache: a 10^7-row pass then held 0.7 GB of Arrow memory; without it, none
            handle = self._handles[index] = pq.ParquetFile(self.files[index], pre_buffer=False)
        where = f"file {self.files[index]!r}"
        if self.scalar:
            table = handle.read_row_group(group, columns=self.selected)
            return _to_numpy(table, self.selected, True, self.dtype, self.name, where)
        # one column at a time: a row group's decoded Arrow table is never held whole beside
        # the numpy rows (80 MB for a million rows of 20 float32 columns)
        out = np.empty(
            (int(np.diff(self.block_bounds[block : block + 2])[0]), len(self.selected)),
            dtype=self.dtype,
        )
        for j, column in enumerate(self.selected):
            table = handle.read_row_group(group, columns=[column])
            out[:, j] = _to_numpy(table, [column], True, self.dtype, self.name, where)
        return out


def _check_same_schema(
    first: Any, schema: Any, selected: list[str], name: str, first_file: str, file: str
) -> None:
    for column in selected:
        if column not in schema.names:
            raise ValueError(
                f"Data {name!r}: file {file!r} has no column {column!r} (file {first_file!r} "
                "has); the files' schemas disagree."
            )
        if schema.field(column).type != first.field(column).type:
            raise ValueError(
                f"Data {name!r}: column {column!r} is {schema.field(column).type} in "
                f"{file!r} but {first.field(column).type} in {first_file!r}; the files' "
                "schemas disagree."
            )


def _check_no_nulls(meta: Any, schema: Any, selected: list[str], name: str, file: str) -> None:
    """Refuse nulls that the row groups' statistics record (the rest are refused on read)."""
    positions = {c: meta.schema.names.index(c) for c in selected if c in meta.schema.names}
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for column, position in positions.items():
            stats = row_group.column(position).statistics
            if stats is not None and stats.has_null_count and stats.null_count:
                raise ValueError(
                    f"Data {name!r}: column {column!r} of file {file!r} has "
                    f"{stats.null_count} null values in row group {group}; drop or fill them "
                    "before sampling."
                )


# ---------------------------------------------------------------------------- arrow table
class ArrowTableColumn(Column):
    """Named columns of an in-memory ``pyarrow.Table``; rows are taken directly."""

    def __init__(self, table: Any, name: str, columns: str | list[str] | None):
        where = "the Arrow table"
        selected, scalar = _selected(table.column_names, name, columns, where)
        dtypes = [_numpy_dtype(table.schema.field(c), name, where) for c in selected]
        self.table = table.select(selected)
        for column in selected:
            if self.table.column(column).null_count:
                raise ValueError(
                    f"Data {name!r}: column {column!r} of {where} has "
                    f"{self.table.column(column).null_count} null values; drop or fill them "
                    "before sampling."
                )
        self.name, self.selected, self.scalar = name, selected, scalar
        self.dtype = np.result_type(*dtypes)
        self.n_rows = int(table.num_rows)
        self.trailing_shape = () if scalar else (len(selected),)
        self.block_bounds = self._uniform_bounds(65_536)

    def take(self, row_indices: np.ndarray) -> np.ndarray:
        taken = self.table.take(np.asarray(row_indices, dtype=np.int64))
        return _to_numpy(taken, self.selected, self.scalar, self.dtype, self.name, "the table")

    def read(self, start: int, stop: int) -> np.ndarray:
        part = self.table.slice(start, stop - start)
        return _to_numpy(part, self.selected, self.scalar, self.dtype, self.name, "the table")


# --------------------------------------------------------------------------------- polars
def _open_polars(source: Any, name: str, columns: Any) -> Column:
    import polars as pl

    if isinstance(source, pl.DataFrame):
        return ArrowTableColumn(source.to_arrow(), name, columns)
    if isinstance(source, pl.LazyFrame):
        return PolarsLazyColumn(source, name, columns)
    raise TypeError(
        f"Data {name!r}: a polars {type(source).__name__} is not a table source; pass a "
        "DataFrame or a LazyFrame."
    )


class PolarsLazyColumn(_TableColumn):
    """Named columns of a polars ``LazyFrame``, read as collected slices of
    :data:`LAZY_BLOCK_ROWS` rows (``pl.scan_parquet`` reads only the row groups a slice
    needs)."""

    def __init__(self, frame: Any, name: str, columns: str | list[str] | None):
        import polars as pl

        where = "the LazyFrame"
        schema = frame.collect_schema()
        selected, scalar = _selected(list(schema.names()), name, columns, where)
        self.frame = frame.select(selected)
        empty = self.frame.head(0).collect().to_arrow()
        dtypes = [_numpy_dtype(empty.schema.field(c), name, where) for c in selected]
        n_rows = int(self.frame.select(pl.len()).collect().item())
        blocks = [min(LAZY_BLOCK_ROWS, n_rows - s) for s in range(0, n_rows, LAZY_BLOCK_ROWS)]
        self._set_rows(name, selected, scalar, np.result_type(*dtypes), n_rows, blocks)

    def _load_block(self, block: int) -> np.ndarray:
        start, stop = int(self.block_bounds[block]), int(self.block_bounds[block + 1])
        table = self.frame.slice(start, stop - start).collect().to_arrow()
        return _to_numpy(table, self.selected, self.scalar, self.dtype, self.name, "the LazyFrame")


def _import(module: str, name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - the parquet extra is not installed
        raise ImportError(
            f"Data {name!r}: reading Parquet or Arrow tables needs the parquet extra "
            "(pip install 'pymc-bigdata[parquet]')."
        ) from exc
