"""Storage backends of the row source: one column (array) of per-row data each.

A column knows its row count, dtype and the shape of one row, and reads rows two ways:
by index (:meth:`Column.take`, a minibatch) and by contiguous range (:meth:`Column.read`,
a full-data pass).  Four kinds:

* :class:`ArrayColumn`: an in-memory numpy array;
* :class:`MemmapColumn`: a ``.npy`` file or ``np.memmap`` on disk, read through the page
  cache; pages a full-data pass has read are handed back to the kernel (``MADV_DONTNEED``)
  so the process's resident memory stays bounded by a chunk;
* :class:`ZarrColumn`: a zarr array (local store), read chunk by chunk;
* :class:`DaskColumn`: a dask array, read block by block (and reduced on the cluster by
  :meth:`pymc_bigdata.rows.RowSource.reduce`).

Chunked stores decode whole chunks, so an index read groups the rows by *block* (the
store's chunk along the row axis) and keeps the last blocks it decoded in a small
least-recently-used cache.  :class:`~pymc_bigdata.rows.BlockIndexSampler` draws minibatch
rows inside a few cached random blocks, so a minibatch decodes new blocks only as fast as
the cache turns over.

Only :mod:`pymc_bigdata.rows` and :func:`pymc_bigdata.data.Data` build columns; nothing
else in the package reads the arrays.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from pymc_bigdata.shared_rows import attach_rows, share_rows, travelling

__all__ = ["ArrayColumn", "Column", "DaskColumn", "MemmapColumn", "ZarrColumn", "as_column"]

#: rows per block of an in-memory or memmap column when it has no chunking of its own
#: (about 1 MiB of one row's bytes)
BLOCK_BYTES = 2**20

#: one column's rows shared once, whichever thread pickles it first
_SHARE_LOCK = threading.Lock()

#: decoded blocks a chunked column keeps by default (a block gather raises it to hold its
#: active blocks)
CACHE_BYTES = 32 * 2**20


class Column:
    """One per-row array: ``n_rows`` rows of ``trailing_shape`` each, of ``dtype``.

    Attributes
    ----------
    name
        The array's name (in error messages).
    block_bounds
        Row index where each storage block starts, and ``n_rows`` at the end: a chunked
        store decodes one block at a time.
    default_gather
        ``"rows"`` when any row is cheap to read on its own (memory, the page cache),
        ``"blocks"`` when reading one row decodes its whole block (zarr, dask).
    """

    name: str
    n_rows: int
    dtype: np.dtype
    trailing_shape: tuple[int, ...]
    block_bounds: np.ndarray
    default_gather = "rows"

    def take(self, row_indices: np.ndarray) -> np.ndarray:
        """The given rows, in the order given (a copy)."""
        raise NotImplementedError

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (contiguous)."""
        raise NotImplementedError

    def read_pass(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a full-data pass, which reads the rows in order: by
        default :meth:`read`."""
        return self.read(start, stop)

    @property
    def nbytes(self) -> int:
        """Size of the whole array in bytes."""
        return int(self.n_rows * np.prod(self.trailing_shape, dtype=np.int64) * self.dtype.itemsize)

    def _uniform_bounds(self, block_rows: int) -> np.ndarray:
        return np.append(np.arange(0, self.n_rows, block_rows), self.n_rows).astype(np.int64)


def _default_block_rows(dtype: np.dtype, trailing_shape: tuple[int, ...]) -> int:
    row_bytes = max(1, int(np.prod(trailing_shape, dtype=np.int64)) * dtype.itemsize)
    return max(1, BLOCK_BYTES // row_bytes)


class ArrayColumn(Column):
    """An in-memory numpy array (kept C-contiguous). Pickled as the name of a shared-memory
    segment holding its rows where they are large (:mod:`pymc_bigdata.shared_rows`)."""

    def __init__(self, array: np.ndarray, name: str, block_rows: int | None = None):
        self.array = np.ascontiguousarray(array)
        self.name = name
        self.n_rows = int(self.array.shape[0])
        self.dtype = self.array.dtype
        self.trailing_shape = tuple(self.array.shape[1:])
        rows = block_rows or _default_block_rows(self.dtype, self.trailing_shape)
        self.block_bounds = self._uniform_bounds(rows)
        #: the shared-memory segment its pickles name (made at the first pickling)
        self.shared_name: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if travelling():
            state["shared_name"] = None
            return state
        with _SHARE_LOCK:
            if self.shared_name is None:
                self.shared_name = share_rows(self, self.array)
        if self.shared_name is not None:
            state["array"] = None
            state["shared_name"] = self.shared_name
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.array is None:
            shape = (self.n_rows, *self.trailing_shape)
            self.array = attach_rows(self.shared_name, shape, self.dtype, f"data {self.name!r}")

    def take(self, row_indices: np.ndarray) -> np.ndarray:
        # np.take along axis 0 is 2-4x faster than fancy indexing on random rows
        return self.array.take(row_indices, axis=0)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]


class MemmapColumn(Column):
    """A ``.npy`` file (or raw ``np.memmap``) on disk, mapped read-only.

    Index reads go through the page cache (cheap for random rows). After a contiguous
    read the range's pages are released (``madvise(MADV_DONTNEED)``; they stay in the
    kernel's page cache, not in this process's resident memory). Pickles as its path.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        name: str,
        dtype: np.dtype,
        shape: tuple[int, ...],
        offset: int,
        block_rows: int | None = None,
    ):
        self.path = str(path)
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.offset = int(offset)
        self.n_rows = self.shape[0]
        self.trailing_shape = self.shape[1:]
        rows = block_rows or _default_block_rows(self.dtype, self.trailing_shape)
        self.block_bounds = self._uniform_bounds(rows)
        self._map: np.memmap | None = None

    @classmethod
    def from_npy(cls, path: str | os.PathLike, name: str, block_rows: int | None = None):
        """Open a ``.npy`` file (C order) without reading its data."""
        mapped = np.load(path, mmap_mode="r")
        if mapped.ndim > 1 and not mapped.flags.c_contiguous:
            raise ValueError(
                f"Data {name!r}: {path} is stored in Fortran order; rows must be contiguous "
                "(save it with np.save(path, np.ascontiguousarray(array)))."
            )
        return cls(path, name, mapped.dtype, mapped.shape, mapped.offset, block_rows)

    @classmethod
    def from_memmap(cls, array: np.memmap, name: str, block_rows: int | None = None):
        """Wrap an ``np.memmap`` opened on a whole file (not a slice of one)."""
        if array.filename is None or not array.flags.c_contiguous:
            raise ValueError(
                f"Data {name!r}: pass the np.memmap of a whole file in C order (or its path); "
                "a sliced or transposed memmap cannot be re-opened by row."
            )
        return cls(array.filename, name, array.dtype, array.shape, array.offset, block_rows)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_map"] = None
        return state

    @property
    def _array(self) -> np.memmap:
        if self._map is None:
            self._map = np.memmap(
                self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape
            )
        return self._map

    def take(self, row_indices: np.ndarray) -> np.ndarray:
        return np.take(self._array, row_indices, axis=0)

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.array(self._array[start:stop])
        self._release(start, stop)
        return out

    def _release(self, start: int, stop: int) -> None:
        """Drop the mapped pages of rows ``start:stop`` from this process's memory."""
        handle = getattr(self._array, "_mmap", None)
        if handle is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        row_bytes = int(np.prod(self.trailing_shape, dtype=np.int64)) * self.dtype.itemsize
        base = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        begin = self.offset - base + start * row_bytes
        end = self.offset - base + stop * row_bytes
        page = mmap.PAGESIZE
        begin, end = (begin // page) * page, min(-(-end // page) * page, len(handle))
        if end > begin:
            handle.madvise(mmap.MADV_DONTNEED, begin, end - begin)


class _BlockCache:
    """The last ``capacity`` decoded blocks of a chunked column (least recently used out)."""

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        #: blocks decoded so far (a measure of the gathers' I/O)
        self.decoded = 0

    def get(self, block: int, load) -> np.ndarray:
        if block in self._blocks:
            self._blocks.move_to_end(block)
            return self._blocks[block]
        data = load(block)
        self.decoded += 1
        self._blocks[block] = data
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return data

    def clear(self) -> None:
        self._blocks.clear()


class _ChunkedColumn(Column):
    """A column stored in blocks that are decoded whole (zarr chunks, dask blocks)."""

    default_gather = "blocks"

    def __init__(self, array, name: str, row_chunks: tuple[int, ...]):
        self.array = array
        self.name = name
        self.n_rows = int(array.shape[0])
        self.dtype = np.dtype(array.dtype)
        self.trailing_shape = tuple(int(s) for s in array.shape[1:])
        self.block_bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(np.int64)
        self.cache = _BlockCache(1)
        self._size_cache()

    def _size_cache(self) -> None:
        """Room for ``CACHE_BYTES`` of the largest blocks (at least two blocks)."""
        row_bytes = int(np.prod(self.trailing_shape, dtype=np.int64)) * self.dtype.itemsize
        block_bytes = max(1, int(np.diff(self.block_bounds).max()) * row_bytes)
        self.cache.capacity = max(2, CACHE_BYTES // block_bytes)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["cache"] = _BlockCache(self.cache.capacity)
        return state

    def _load_block(self, block: int) -> np.ndarray:
        return self.read(int(self.block_bounds[block]), int(self.block_bounds[block + 1]))

    def read_pass(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a pass in order. Where a storage block is longer than the
        read, it is decoded once, through the cache, and served to the pass's reads in turn:
        read directly, a 500,000-row zarr chunk was decoded again for each of the eight
        65,536-row reads that met it (issue 27). The same rows, so the same sums."""
        bounds = self.block_bounds
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, stop - 1, side="right")) - 1
        if int(np.diff(bounds[first : last + 2]).max()) <= stop - start:
            return self.read(start, stop)
        pieces = []
        for block in range(first, last + 1):
            lo, hi = int(bounds[block]), int(bounds[block + 1])
            data = self.cache.get(block, self._load_block)
            pieces.append(data[max(start, lo) - lo : min(stop, hi) - lo])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def take(self, row_indices: np.ndarray) -> np.ndarray:
        row_indices = np.asarray(row_indices, dtype=np.int64)
        out = np.empty((len(row_indices), *self.trailing_shape), dtype=self.dtype)
        blocks = np.searchsorted(self.block_bounds, row_indices, side="right") - 1
        order = np.argsort(blocks, kind="stable")
        sorted_blocks = blocks[order]
        cuts = np.flatnonzero(np.diff(sorted_blocks)) + 1
        for group in np.split(order, cuts) if len(order) else []:
            block = int(blocks[group[0]])
            data = self.cache.get(block, self._load_block)
            out[group] = data[row_indices[group] - self.block_bounds[block]]
        return out


class ZarrColumn(_ChunkedColumn):
    """A zarr array in a local store; one block per chunk along the row axis."""

    def __init__(self, array, name: str):
        chunk, n_rows = int(array.chunks[0]), int(array.shape[0])
        super().__init__(
            array, name, tuple(np.diff(np.append(np.arange(0, n_rows, chunk), n_rows)))
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array[start:stop])


class DaskColumn(_ChunkedColumn):
    """A dask array with known chunk sizes; one block per dask chunk along the row axis."""

    def __init__(self, array, name: str):
        super().__init__(array, name, array.chunks[0])

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array[start:stop].compute(scheduler="synchronous"))

    def _load_block(self, block: int) -> np.ndarray:
        return np.asarray(self.array.blocks[block].compute(scheduler="synchronous"))


def as_column(source: Any, name: str, block_rows: int | None = None) -> Column:
    """The column for ``source``: an array, an ``np.memmap``, a path to a ``.npy`` file or a
    zarr store, a zarr array or a dask array (tables: :mod:`pymc_bigdata.sources_arrow`).

    Raises a clear error naming the array for a missing or unreadable store, a non-numeric
    dtype, a dask array with unknown chunk sizes or a scalar.
    """
    column = _open(source, name, block_rows)
    if not (
        np.issubdtype(column.dtype, np.number) or np.issubdtype(column.dtype, np.bool_)
    ) or np.issubdtype(column.dtype, np.complexfloating):
        raise TypeError(
            f"Data {name!r} has dtype {column.dtype}, which is not a real numeric type: "
            "encode categories as integers first."
        )
    return column


def _open(source: Any, name: str, block_rows: int | None) -> Column:
    if isinstance(source, Column):
        return source
    if isinstance(source, str | os.PathLike):
        return _open_path(Path(source), name, block_rows)
    if isinstance(source, np.memmap):
        _check_ndim(source.ndim, name)
        return MemmapColumn.from_memmap(source, name, block_rows)
    if _is_dask(source):
        _check_ndim(source.ndim, name)
        if any(np.isnan(c) for c in source.chunks[0]):
            raise ValueError(
                f"Data {name!r}: the dask array has unknown chunk sizes along the row axis; "
                "call .compute_chunk_sizes() on it first."
            )
        return DaskColumn(source, name)
    if _is_zarr(source):
        _check_ndim(source.ndim, name)
        return ZarrColumn(source, name)
    array = np.asarray(source)
    _check_ndim(array.ndim, name)
    return ArrayColumn(array, name, block_rows)


def _open_path(path: Path, name: str, block_rows: int | None) -> Column:
    if not path.exists():
        raise FileNotFoundError(f"Data {name!r}: no file or store at {str(path)!r}.")
    if path.is_file() and path.suffix == ".npy":
        try:
            column = MemmapColumn.from_npy(path, name, block_rows)
        except (OSError, ValueError) as exc:
            raise ValueError(f"Data {name!r}: cannot read {str(path)!r} as .npy: {exc}") from exc
        _check_ndim(len(column.shape), name)
        return column
    try:
        import zarr
    except ImportError as exc:  # pragma: no cover - the zarr extra is not installed
        raise ImportError(
            f"Data {name!r}: {str(path)!r} is not a .npy file; reading a zarr store needs "
            "the zarr extra (pip install 'pymc-bigdata[zarr]')."
        ) from exc
    try:
        array = zarr.open_array(str(path), mode="r")
    except Exception as exc:  # zarr raises several types for a store it cannot read
        raise ValueError(
            f"Data {name!r}: cannot open {str(path)!r} as a zarr array ({type(exc).__name__}: "
            f"{exc}). Pass a .npy file, a zarr array's store or an array."
        ) from exc
    _check_ndim(array.ndim, name)
    return ZarrColumn(array, name)


def _check_ndim(ndim: int, name: str) -> None:
    if ndim < 1:
        raise ValueError(f"Data {name!r} is a scalar: row data need a leading row axis.")


def _is_dask(source: Any) -> bool:
    return type(source).__module__.startswith("dask.array") and hasattr(source, "chunks")


def _is_zarr(source: Any) -> bool:
    return type(source).__module__.startswith("zarr") and hasattr(source, "chunks")
