"""Row sources: the only code that reads the full per-row data arrays.

A :class:`RowSource` holds the model's row-axis arrays (observed values and covariates
that share a leading axis of length ``N``) and hands out rows by index, in contiguous
chunks, or reduced over full-data passes (streamed here, or by dask where the data live).
Everything else in the package (the model layer, the samplers) asks a row source for rows,
so a later source can read from a memmap, zarr or dask array without touching any sampler.

The minibatch index samplers (:class:`RowIndexSampler`, :class:`BlockIndexSampler`,
:class:`LazyPermutation`, :func:`check_batch_size`) live in
:mod:`pymc_bigdata.index_samplers` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tqdm import tqdm

from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.index_samplers import (
    DEFAULT_ACTIVE_BLOCKS,
    DEFAULT_REUSE,
    MARKER_MAX_ROWS,
    BlockIndexSampler,
    LazyPermutation,
    RowIndexSampler,
    check_batch_size,
)
from pymc_bigdata.memory import populated_empty
from pymc_bigdata.row_windows import RowWindow, ShuffledRows, WindowIndexSampler
from pymc_bigdata.sources import ArrayColumn, DaskColumn, as_column

__all__ = [
    "ACTIVE_BYTES",
    "WINDOW_COPY_BYTES",
    "WINDOW_MIN_BATCHES",
    "DEFAULT_ACTIVE_BLOCKS",
    "DEFAULT_REUSE",
    "MARKER_MAX_ROWS",
    "BlockIndexSampler",
    "LazyPermutation",
    "RowIndexSampler",
    "RowSource",
    "RowWindow",
    "WindowIndexSampler",
    "check_batch_size",
    "window_rows_for_tests",
]

#: in-memory rows of at most this many bytes (every array together) are read through window
#: gathers unless an array asks otherwise (:mod:`pymc_bigdata.row_windows`: their copy costs as
#: much memory again)
WINDOW_COPY_BYTES = 2**30

#: a default window gather reads windows only where the rows hold this many minibatches:
#: given the copy's fixed order a window's noise variance is off a simple random sample's (which
#: the samplers' noise measurements assume) by about sqrt(n/N), 10 % here (docs/data.md); at
#: N/n = 40 SBPS's Eq. 10 read it 16 % off (tests/step_methods/test_sbps.py)
WINDOW_MIN_BATCHES = 100

#: decoded bytes (over every row array) a block gather's active blocks hold by default: 16
#: blocks of 65,536 rows of 20 float32 covariates take 85 MB; 16 Parquet row groups of
#: 1,048,576 such rows would take 1.4 GB, and get 3 active blocks instead (issue 28)
ACTIVE_BYTES = 256 * 2**20


def window_rows_for_tests(shuffled: ShuffledRows, batch_size: int) -> int:
    """Rows a sequential test (the Austerity steps) reads as one window of ``shuffled``
    before uniform ones: ``N / WINDOW_MIN_BATCHES`` (at least a minibatch), where a window's
    spread is within about 10 % of a simple random sample's
    (:class:`~pymc_bigdata.row_windows.WindowPermutation`)."""
    return max(int(batch_size), shuffled.n_rows // WINDOW_MIN_BATCHES)


class RowSource:
    """The model's per-row arrays, sharing a leading row axis: the only reader of the data.

    Parameters
    ----------
    arrays
        The per-row arrays, in the order the model layer's compiled functions take them:
        numpy arrays, or columns from :func:`pymc_bigdata.sources.as_column` (memmap, zarr,
        dask; :func:`pymc_bigdata.Data` builds them).
    names
        A name for each array, used in error messages.
    dtypes
        The dtype each array's rows are handed out in (default: as stored), e.g. the dtype
        of the model's data variable when a file stores a narrower one.
    progress
        Show a progress bar for full-data passes that take more than ``PROGRESS_DELAY``
        seconds.

    Notes
    -----
    **Gathers.** With ``gather == "rows"`` (memmap data, and in-memory data beyond
    :data:`WINDOW_COPY_BYTES`) every minibatch is a uniform sample of rows
    (:class:`RowIndexSampler`). With ``"blocks"`` (the default for
    zarr and dask, where reading a row decodes its whole chunk) minibatches are uniform
    samples from a cache of random storage blocks that turns over as rows are used
    (:class:`BlockIndexSampler`); the settings come from the first column asking for it.
    With ``"windows"`` (the default for in-memory rows up to :data:`WINDOW_COPY_BYTES` whose
    copy takes at most half the memory available, or asked for by any array,
    :func:`pymc_bigdata.Data`, and refused where the copy would not fit) minibatches drawn
    without replacement are contiguous windows of a copy of the rows in one fixed random
    order, made in memory on first use (:mod:`pymc_bigdata.row_windows`); with replacement
    they are uniform rows. An array given ``gather="rows"`` keeps uniform rows for all.
    """

    def __init__(
        self,
        arrays: Sequence[Any],
        names: Sequence[str],
        dtypes: Sequence[Any] | None = None,
        progress: bool = True,
    ):
        if len(arrays) != len(names):
            raise ValueError("RowSource needs one name per array.")
        if not arrays:
            raise ValueError("RowSource needs at least one array.")
        self.columns = [as_column(a, name) for a, name in zip(arrays, names)]
        row_counts = {c.name: c.n_rows for c in self.columns}
        if len(set(row_counts.values())) != 1:
            raise ValueError(
                f"Row arrays have different row counts: {row_counts}. Every pmbd.Data array "
                "and every per-row observed value of a model must have the same rows, in the "
                "same order; check that the files or columns belong to the same table."
            )
        self.names = tuple(names)
        self.n_rows = next(iter(row_counts.values()))
        self._out_dtypes = [
            np.dtype(d) if d is not None else c.dtype
            for c, d in zip(self.columns, dtypes or [None] * len(self.columns))
        ]
        self.progress = bool(progress)
        #: rows read by full-data passes so far (streamed or reduced by dask)
        self.rows_streamed = 0
        #: whether a complete pass has checked every row for NaN and infinities; until then
        #: every block read is checked (:meth:`check_finite`)
        self.verified = False
        asked = [getattr(c, "gather", None) for c in self.columns]
        gathers = [g or c.default_gather for c, g in zip(self.columns, asked)]
        blocked = [c for c, g in zip(self.columns, gathers) if g == "blocks"]
        #: ``"rows"`` (uniform minibatches), ``"blocks"`` (rows inside cached blocks) or
        #: ``"windows"`` (windows of a shuffled copy)
        self.gather = _source_gather(self.columns, gathers)
        if self.gather == "rows" and "rows" not in asked and self._windows_by_default():
            self.gather = "windows"
        #: whether an array asked for windows (else they need WINDOW_MIN_BATCHES minibatches)
        self._windows_asked = "windows" in asked
        if self._windows_asked:
            self._refuse_a_copy_beyond_memory()
        #: the shuffled copies of window gathers, by the census rows they leave out
        self._shuffled: dict[bytes, ShuffledRows] = {}
        lead = blocked[0] if blocked else self.columns[0]
        #: where each gather block starts (and N at the end)
        self.block_bounds = lead.block_bounds
        requested = getattr(lead, "active_blocks", None)
        self.active_blocks = (
            int(requested) if requested is not None else self._default_active_blocks()
        )
        self.reuse = float(getattr(lead, "reuse", DEFAULT_REUSE))

    def _windows_by_default(self) -> bool:
        """Whether rows no array asked a gather for are read through window gathers: every
        array in memory, together at most :data:`WINDOW_COPY_BYTES`, and their copy at most
        half the memory available now."""
        available = available_memory()
        fits = available is None or 2 * self.copy_bytes <= available
        return self.in_memory and self.nbytes <= WINDOW_COPY_BYTES and fits

    def _refuse_a_copy_beyond_memory(self) -> None:
        """A clear error where an array asks for window gathers whose copy of the rows would
        not fit in the memory available now (it is made in memory, on the first minibatch)."""
        available = available_memory()
        if available is not None and self.copy_bytes > available:
            raise ValueError(
                f'gather="windows" copies every row array in memory, in a shuffled order: '
                f"{self.copy_bytes / 2**30:.2f} GiB, but {available / 2**30:.2f} GiB are "
                'available. Use gather="rows" (uniform rows, read where they lie) or, for a '
                'chunked store, gather="blocks".'
            )

    @property
    def copy_bytes(self) -> int:
        """Bytes of a window gathers' copy of every row (in the minibatches' dtypes)."""
        return sum(
            self.n_rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            for shape, dtype in zip(self.trailing_shapes, self._out_dtypes)
        )

    def _default_active_blocks(self) -> int:
        """:data:`DEFAULT_ACTIVE_BLOCKS`, or fewer (at least 2) where that many of the
        largest gather blocks, over every array, would exceed :data:`ACTIVE_BYTES`."""
        row_bytes = sum(
            int(np.prod(c.trailing_shape, dtype=np.int64)) * c.dtype.itemsize for c in self.columns
        )
        block_bytes = max(1, int(np.diff(self.block_bounds).max()) * row_bytes)
        return int(np.clip(ACTIVE_BYTES // block_bytes, 2, DEFAULT_ACTIVE_BLOCKS))

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
        """Dtype of each array's rows as handed out."""
        return tuple(self._out_dtypes)

    @property
    def trailing_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shape of one row of each array."""
        return tuple(c.trailing_shape for c in self.columns)

    @property
    def nbytes(self) -> int:
        """Size of all the arrays together, in bytes."""
        return sum(c.nbytes for c in self.columns)

    @property
    def in_memory(self) -> bool:
        """Whether every array is an in-memory numpy array."""
        return all(isinstance(c, ArrayColumn) for c in self.columns)

    def take(self, row_indices: np.ndarray | RowWindow) -> list[np.ndarray]:
        """Gather the given rows of every array (a copy, in the order given; a window's
        rows are views of its copy); refused where they hold NaN or infinities and no
        complete pass has checked the data yet."""
        if isinstance(row_indices, RowWindow):
            return row_indices.rows()  # the copy was checked when it was read
        rows = _cast([c.take(row_indices) for c in self.columns], self._out_dtypes)
        if not self.verified:
            self._refuse_nonfinite(_nonfinite_counts(*rows))
        return rows

    def window_arrays(self, window: RowWindow) -> list[np.ndarray]:
        """The shuffled copy whose slice ``window`` is (each data array's rows in the copy's
        order), for compiled code that reads windows as slices of it, as :meth:`take` gives
        a window's rows as views of it (the copy was checked when it was read)."""
        return window.shuffled.arrays

    def subsample(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        """About ``n`` random rows (sorted): uniform rows, or with a block gather the rows
        of random whole blocks (reading each block once), for a cheap start such as the
        MAP search's first stage."""
        if self.gather != "blocks" or self.n_rows <= n:
            return self.take(np.sort(rng.choice(self.n_rows, min(n, self.n_rows), replace=False)))
        bounds = self.block_bounds
        order = rng.permutation(len(bounds) - 1)
        sizes = np.diff(bounds)[order]
        chosen = np.sort(order[: int(np.searchsorted(np.cumsum(sizes), n)) + 1])
        return self.take(np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in chosen]))

    def index_sampler(
        self,
        batch_size: int,
        rng: np.random.Generator,
        replace: bool = False,
        reshuffle: bool = True,
        exclude: np.ndarray | None = None,
        windows: bool = True,
    ) -> RowIndexSampler | BlockIndexSampler | WindowIndexSampler:
        """The minibatch index sampler for this source's gather (see the class notes);
        ``windows=False`` draws uniform rows where the gather is ``"windows"``, and so do
        rows of fewer than :data:`WINDOW_MIN_BATCHES` minibatches unless an array asked for
        windows."""
        shuffled = self.window_copy(batch_size, exclude) if windows and not replace else None
        if shuffled is not None:
            return WindowIndexSampler(shuffled, batch_size, rng, reshuffle)
        if self.gather != "blocks":
            return RowIndexSampler(self.n_rows, batch_size, rng, replace, reshuffle, exclude)
        sampler = BlockIndexSampler(
            self.block_bounds, batch_size, rng, self.active_blocks, self.reuse, replace, exclude
        )
        for column in self.columns:  # hold the active blocks (and the next) in each cache
            if hasattr(column, "cache"):
                column.cache.capacity = max(
                    column.cache.capacity,
                    (sampler.active_blocks + 1) * _blocks_per_gather_block(column, self),
                )
        return sampler

    def window_copy(
        self, batch_size: int, exclude: np.ndarray | None = None
    ) -> ShuffledRows | None:
        """The shuffled copy that minibatches of ``batch_size`` rows without replacement read
        windows of, or None where they read uniform rows: the gather is ``"windows"`` and an
        array asked for it or the rows hold :data:`WINDOW_MIN_BATCHES` minibatches."""
        enough = self._windows_asked or self.n_rows >= WINDOW_MIN_BATCHES * batch_size
        return self.shuffled_rows(exclude) if self.gather == "windows" and enough else None

    def shuffled_rows(self, exclude: np.ndarray | None = None) -> ShuffledRows:
        """The window gathers' copy of every row but ``exclude``, one per census (its
        arrays are read on first use, :meth:`rows_in_order`)."""
        key = b"" if exclude is None else np.unique(exclude).astype(np.int64).tobytes()
        if key not in self._shuffled:
            self._shuffled[key] = ShuffledRows(self.rows_in_order, self.n_rows, exclude)
        return self._shuffled[key]

    def release_copies(self) -> None:
        """Free the window gathers' copies of the rows (a step reading windows reads its
        copy again, in the same order, at its next minibatch): e.g. to give their memory
        back after sampling, or to count a copy's read in a timed run."""
        for shuffled in self._shuffled.values():
            shuffled.release()

    def rows_in_order(self, order: np.ndarray) -> list[np.ndarray]:
        """Every array's rows ``order`` (distinct row indices), copied: gathered in pieces
        from memory, or out of memory in one full-data pass (each block read in turn, its
        rows placed where ``order`` puts them)."""
        out = [
            populated_empty((len(order), *shape), dtype)
            for shape, dtype in zip(self.trailing_shapes, self._out_dtypes)
        ]
        if self.in_memory:
            for start in range(0, len(order), DEFAULT_CHECK_ROWS):
                rows = self.take(order[start : start + DEFAULT_CHECK_ROWS])
                for array, part in zip(out, rows):
                    array[start : start + len(part)] = part
            self.rows_streamed += len(order)  # every row read once, as by a pass
            return out
        position = np.full(self.n_rows, -1, dtype=np.int64)
        position[order] = np.arange(len(order))
        start = 0
        for rows in self.chunks(DEFAULT_CHECK_ROWS, "copying rows for window gathers"):
            where = position[start : start + len(rows[0])]
            kept = where >= 0
            for array, part in zip(out, rows):
                array[where[kept]] = part[kept]
            start += len(rows[0])
        return out

    def chunks(self, chunk_rows: int, desc: str = "full-data pass") -> Iterator[list[np.ndarray]]:
        """Yield consecutive row blocks of at most ``chunk_rows`` rows, with a progress bar
        when the pass takes more than ``PROGRESS_DELAY`` seconds. Memory is bounded by two
        blocks (in-memory arrays give views, no copy; out of memory the next block is read
        while the caller works on this one)."""
        bar = tqdm(
            total=self.n_rows,
            desc=desc,
            unit="rows",
            unit_scale=True,
            delay=PROGRESS_DELAY,
            leave=False,
            disable=not self.progress,
        )
        with bar:
            for start, stop, rows in self._blocks_in_order(chunk_rows):
                if not self.verified:
                    self._refuse_nonfinite(_nonfinite_counts(*rows))
                yield rows
                self.rows_streamed += stop - start
                bar.update(stop - start)
        self.verified = True  # a complete pass: every row was checked

    def _blocks_in_order(self, chunk_rows: int) -> Iterator[tuple[int, int, list[np.ndarray]]]:
        """``(start, stop, rows)`` of consecutive blocks. Out of memory, the next block is
        read on a second thread while the caller works on this one (two blocks in memory):
        decoding and copying overlap the pass's arithmetic."""
        bounds = [
            (start, min(start + chunk_rows, self.n_rows))
            for start in range(0, self.n_rows, chunk_rows)
        ]

        def read(start: int, stop: int) -> list[np.ndarray]:
            return _cast([c.read_pass(start, stop) for c in self.columns], self._out_dtypes)

        if self.in_memory or len(bounds) < 2:
            for start, stop in bounds:
                yield start, stop, read(start, stop)
            return
        with ThreadPoolExecutor(max_workers=1) as reader:
            pending = reader.submit(read, *bounds[0])
            for k, (start, stop) in enumerate(bounds):
                rows = pending.result()
                if k + 1 < len(bounds):
                    pending = reader.submit(read, *bounds[k + 1])
                yield start, stop, rows

    def reduce(
        self, fn: Callable[..., Any], args: Sequence[Any], chunk_rows: int, desc: str
    ) -> Any:
        """``sum over row blocks of fn(*args, *rows)``: a full-data pass.

        ``fn`` returns an array or a list of arrays (summed elementwise). Over dask arrays
        the blocks are reduced by dask, one task per dask block (each task streams its block
        in ``chunk_rows`` pieces), on the active ``dask.distributed`` client when there is
        one, so a cluster computes the pass where the data live; ``fn`` must then pickle
        (:class:`pymc_bigdata.model.compiled.ChunkFunction` does). Otherwise the pass streams here.
        """
        if any(isinstance(c, DaskColumn) for c in self.columns):
            if not self.verified:  # the workers' blocks are not seen here: a pass of its own
                self._check_on_dask()
            self.rows_streamed += self.n_rows
            return _dask_reduce(self.columns, fn, args, chunk_rows, self._out_dtypes)
        total = None
        for rows in self.chunks(chunk_rows, desc):
            total = _add(total, fn(*args, *rows))
        return total

    def check_finite(self) -> None:
        """Refuse data with NaN or infinite values, naming the arrays: one pass over the
        rows, or none where a complete pass has checked them already (every full-data pass
        checks the blocks it reads until one has read them all: the MAP search's first)."""
        if self.verified:
            return
        if any(isinstance(c, DaskColumn) for c in self.columns):
            self._check_on_dask()
            return
        for _ in self.chunks(DEFAULT_CHECK_ROWS, "checking data"):
            pass

    def _check_on_dask(self) -> None:
        counts = _dask_reduce(
            self.columns, _nonfinite_counts, (), DEFAULT_CHECK_ROWS, self._out_dtypes
        )
        self.rows_streamed += self.n_rows
        self._refuse_nonfinite(counts)
        self.verified = True

    def _refuse_nonfinite(self, counts: np.ndarray) -> None:
        bad = [c.name for c, n in zip(self.columns, counts) if int(n) > 0]
        if bad:
            raise ModelNotSupportedError(
                f"Row data {bad} contain NaN or infinite values. Drop or impute those rows first."
            )


#: seconds a full-data pass runs before its progress bar appears
PROGRESS_DELAY = 3.0

#: rows per block when checking the data for NaN
DEFAULT_CHECK_ROWS = 262_144


def available_memory() -> int | None:
    """Bytes of memory available for new allocations without swapping (Linux's
    ``MemAvailable``), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _source_gather(columns: Sequence[Any], gathers: Sequence[str]) -> str:
    """The source's gather from its arrays' own: ``"blocks"`` or ``"windows"`` when any
    array asks for it (not both), else ``"rows"``."""
    asked = set(gathers) - {"rows"}
    if len(asked) > 1:
        names = {g: [c.name for c, h in zip(columns, gathers) if h == g] for g in sorted(asked)}
        raise ValueError(
            f"Row arrays ask for different gathers: {names}. Minibatches read every array's "
            'rows together; give them one gather (e.g. gather="blocks" for a chunked store).'
        )
    return asked.pop() if asked else "rows"


def _blocks_per_gather_block(column: Any, source: RowSource) -> int:
    """How many of ``column``'s blocks one gather block can touch."""
    if np.array_equal(column.block_bounds, source.block_bounds):
        return 1
    smallest = max(1, int(np.diff(column.block_bounds).min()))
    return -(-int(np.diff(source.block_bounds).max()) // smallest) + 1


def _nonfinite_counts(*rows: np.ndarray) -> np.ndarray:
    return np.array(
        [int((~np.isfinite(r)).sum()) if np.issubdtype(r.dtype, np.floating) else 0 for r in rows]
    )


def _add(total: Any, part: Any) -> Any:
    if isinstance(part, list | tuple):
        parts = [np.asarray(p, dtype=np.float64) for p in part]
        return parts if total is None else [t + p for t, p in zip(total, parts)]
    part = np.asarray(part, dtype=np.float64) if not isinstance(part, np.ndarray) else part
    return part.astype(np.float64) if total is None else total + part


def _cast(rows: list[np.ndarray], dtypes: Sequence[np.dtype]) -> list[np.ndarray]:
    return [
        r
        if r.dtype == d and r.flags.c_contiguous and r.flags.aligned  # a gather's, as a rule
        else np.require(r, dtype=d, requirements=["C", "A"])
        for r, d in zip(rows, dtypes)
    ]


def _reduce_block(
    fn: Callable[..., Any], args: Sequence[Any], chunk_rows: int, dtypes, *block
) -> Any:
    """One dask block's share of a full-data pass, in pieces of ``chunk_rows`` rows."""
    total = None
    for start in range(0, len(block[0]), chunk_rows):
        rows = _cast([b[start : start + chunk_rows] for b in block], dtypes)
        total = _add(total, fn(*args, *rows))
    return total


def _dask_reduce(columns: list[Any], fn: Callable[..., Any], args, chunk_rows: int, dtypes) -> Any:
    import dask
    import dask.array as da

    lead = next(c for c in columns if isinstance(c, DaskColumn)).array
    row_chunks = lead.chunks[0]
    arrays = []
    for c in columns:
        if isinstance(c, DaskColumn):
            arrays.append(c.array.rechunk({0: row_chunks}))
        elif isinstance(c, ArrayColumn):
            arrays.append(da.from_array(c.array, chunks=(row_chunks, *c.trailing_shape)))
        else:
            raise TypeError(
                f"Data {c.name!r} ({type(c).__name__}) cannot be combined with dask arrays in "
                "one full-data pass; give every large array as a dask array."
            )
    tasks = [
        dask.delayed(_reduce_block)(fn, args, chunk_rows, dtypes, *[a.blocks[k] for a in arrays])
        for k in range(len(row_chunks))
    ]
    parts = dask.compute(*tasks, scheduler=_dask_scheduler())
    total = None
    for part in parts:
        total = _add(total, part)
    return total


def _dask_scheduler() -> Any:
    """The active ``dask.distributed`` client, or dask's synchronous scheduler (compiled
    functions are not thread-safe, and one block at a time bounds memory)."""
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - the dask extra without distributed
        return "synchronous"
    try:
        return default_client()
    except ValueError:
        return "synchronous"
