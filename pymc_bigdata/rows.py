"""Row sources: the only code that reads the full per-row data arrays.

A :class:`RowSource` holds the model's row-axis arrays (observed values and covariates
that share a leading axis of length ``N``) and hands out rows by index or in contiguous
chunks.  Everything else in the package (the model layer, the samplers) asks a row source
for rows, so a later source can read from a memmap, zarr or dask array without touching
any sampler.

:class:`RowIndexSampler` draws the minibatch indices from a sampler's own generator;
:class:`LazyPermutation` hands out the rows of one random permutation a batch at a time,
drawing only as much of it as a sequential test reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from pymc_bigdata.sources import ArrayColumn, DaskColumn, as_column

__all__ = ["BlockIndexSampler", "LazyPermutation", "RowIndexSampler", "RowSource"]


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
    **Gathers.** With ``gather == "rows"`` (in-memory and memmap data) every minibatch is a
    uniform sample of rows (:class:`RowIndexSampler`). With ``"blocks"`` (the default for
    zarr and dask, where reading a row decodes its whole chunk) minibatches are uniform
    samples from a cache of random storage blocks that turns over as rows are used
    (:class:`BlockIndexSampler`); the settings come from the first column asking for it.
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
            raise ValueError(f"Row arrays have different row counts: {row_counts}.")
        self.names = tuple(names)
        self.n_rows = next(iter(row_counts.values()))
        self._out_dtypes = [
            np.dtype(d) if d is not None else c.dtype
            for c, d in zip(self.columns, dtypes or [None] * len(self.columns))
        ]
        self.progress = bool(progress)
        #: rows read by full-data passes so far (streamed or reduced by dask)
        self.rows_streamed = 0
        blocked = [c for c in self.columns if getattr(c, "gather", c.default_gather) == "blocks"]
        #: ``"rows"`` (uniform minibatches) or ``"blocks"`` (rows inside cached blocks)
        self.gather = "blocks" if blocked else "rows"
        lead = blocked[0] if blocked else self.columns[0]
        #: where each gather block starts (and N at the end)
        self.block_bounds = lead.block_bounds
        self.active_blocks = int(getattr(lead, "active_blocks", DEFAULT_ACTIVE_BLOCKS))
        self.reuse = float(getattr(lead, "reuse", DEFAULT_REUSE))

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

    def take(self, row_indices: np.ndarray) -> list[np.ndarray]:
        """Gather the given rows of every array (a copy, in the order given)."""
        return _cast([c.take(row_indices) for c in self.columns], self._out_dtypes)

    def subsample(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        """About ``n`` random rows (sorted): uniform rows, or with a block gather the rows
        of random whole blocks (reading each block once), for a cheap start such as the
        MAP search's first stage."""
        if self.gather == "rows" or self.n_rows <= n:
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
    ) -> RowIndexSampler | BlockIndexSampler:
        """The minibatch index sampler for this source's gather (see the class notes)."""
        if self.gather == "rows":
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

    def chunks(self, chunk_rows: int, desc: str = "full-data pass") -> Iterator[list[np.ndarray]]:
        """Yield consecutive row blocks of at most ``chunk_rows`` rows, with a progress bar
        when the pass takes more than ``PROGRESS_DELAY`` seconds. Memory is bounded by one
        block (in-memory arrays give views, no copy)."""
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
            for start in range(0, self.n_rows, chunk_rows):
                stop = min(start + chunk_rows, self.n_rows)
                yield _cast([c.read(start, stop) for c in self.columns], self._out_dtypes)
                self.rows_streamed += stop - start
                bar.update(stop - start)

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
            self.rows_streamed += self.n_rows
            return _dask_reduce(self.columns, fn, args, chunk_rows, self._out_dtypes)
        total = None
        for rows in self.chunks(chunk_rows, desc):
            total = _add(total, fn(*args, *rows))
        return total

    def all_finite(self) -> dict[str, bool]:
        """Whether each floating array is free of NaN and infinities (one streamed pass)."""
        counts = self.reduce(_nonfinite_counts, (), DEFAULT_CHECK_ROWS, "checking data")
        return {c.name: int(n) == 0 for c, n in zip(self.columns, counts)}


#: seconds a full-data pass runs before its progress bar appears
PROGRESS_DELAY = 3.0

#: rows per block when checking the data for NaN
DEFAULT_CHECK_ROWS = 262_144

#: storage blocks a block gather keeps in memory (at least enough for two minibatches)
DEFAULT_ACTIVE_BLOCKS = 16

#: mean number of times a block gather draws a row while its block is cached
DEFAULT_REUSE = 1.0


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
    return [np.require(r, dtype=d, requirements=["C", "A"]) for r, d in zip(rows, dtypes)]


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


#: up to this many rows, independent minibatches find repeats with a row marker (4 bytes per
#: row); beyond, by sorting (repeats are then rare: about n^2 / 2N per minibatch)
MARKER_MAX_ROWS = 10_000_000


class RowIndexSampler:
    """Draws minibatch row indices from a generator.

    Without replacement and with ``reshuffle=True`` (the default) it walks through a fresh
    random permutation of the rows ("random reshuffling"): consecutive minibatches within one
    pass over the data are disjoint, and each minibatch on its own is a simple random sample
    without replacement. Their gradient noise is then negatively correlated across a pass (it
    sums to zero over one), which lowers its effect on the dynamics. With ``reshuffle=False``
    every minibatch is an independent simple random sample (what a B-hat noise correction
    assumes). With ``replace=True`` each minibatch draws its rows independently, with
    replacement.

    Parameters
    ----------
    n_rows
        Number of rows ``N``.
    batch_size
        Rows per minibatch ``n``, ``1 <= n <= N``.
    rng
        The owning sampler's generator.
    replace
        Draw with replacement.
    reshuffle
        Without replacement: disjoint minibatches along random permutations (True) or
        independent minibatches (False).
    exclude
        Row indices never drawn (a census stratum the caller always includes itself).
    """

    def __init__(
        self,
        n_rows: int,
        batch_size: int,
        rng: np.random.Generator,
        replace: bool = False,
        reshuffle: bool = True,
        exclude: np.ndarray | None = None,
    ):
        check_batch_size(batch_size, n_rows)
        #: rows that may be drawn (all but ``exclude``), or None for all
        self._pool = None
        if exclude is not None and len(exclude):
            keep = np.ones(n_rows, dtype=bool)
            keep[exclude] = False
            self._pool = np.flatnonzero(keep)
            n_rows = len(self._pool)
            check_batch_size(batch_size, n_rows)
        self.n_rows = int(n_rows)
        self.batch_size = int(batch_size)
        self.replace = bool(replace)
        self.reshuffle = bool(reshuffle)
        self.rng = rng
        self._permutation = np.empty(0, dtype=np.int64)
        self._position = 0
        self._marker: np.ndarray | None = None
        self._positions = np.empty(0, dtype=np.int32)

    def resize(self, batch_size: int) -> None:
        """Draw ``batch_size`` rows per minibatch from now on (the permutation walk goes on)."""
        check_batch_size(batch_size, self.n_rows)
        self.batch_size = int(batch_size)

    def reset(self, rng: np.random.Generator) -> None:
        """Start afresh from a new generator (a new chain)."""
        self.rng = rng
        self._permutation = np.empty(0, dtype=np.int64)
        self._position = 0

    def draw(self) -> np.ndarray:
        """Return the row indices of the next minibatch."""
        if self._pool is None:
            return self._draw_positions()
        return np.take(self._pool, self._draw_positions())

    def _simple_random_sample(self) -> np.ndarray:
        """``n`` distinct rows, every n-subset equally likely.

        For ``n`` well below ``N``: rows drawn with replacement, repeats dropped and the
        shortfall drawn again (an exchangeable process, so the set is uniform), O(n) with a
        reusable row marker up to ``MARKER_MAX_ROWS`` rows and O(n log n) beyond, where
        ``Generator.choice`` costs O(N) (0.46 ms at N = 1e6).
        """
        n, total = self.batch_size, self.n_rows
        if n > total // 4:
            return self.rng.choice(total, size=n, replace=False)
        rows = self.rng.integers(0, total, size=n)
        while True:
            rows = self._distinct(rows)
            if len(rows) == n:
                return rows
            rows = np.concatenate([rows, self.rng.integers(0, total, size=n - len(rows))])

    def _distinct(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` without repeats (the last occurrence of each kept, order otherwise kept)."""
        if self.n_rows > MARKER_MAX_ROWS:
            ordered = np.sort(rows)
            if not np.any(ordered[1:] == ordered[:-1]):
                return rows
            _, last = np.unique(rows[::-1], return_index=True)
            return rows[np.sort(len(rows) - 1 - last)]
        if self._marker is None:
            self._marker = np.empty(self.n_rows, dtype=np.int32)
        if len(self._positions) < len(rows):
            self._positions = np.arange(len(rows), dtype=np.int32)
        position = self._positions[: len(rows)]
        self._marker[rows] = position  # a repeated row keeps its last position
        kept = self._marker[rows] == position
        return rows if kept.all() else rows[kept]

    def _draw_positions(self) -> np.ndarray:
        if self.replace:
            return self.rng.integers(0, self.n_rows, size=self.batch_size)
        if not self.reshuffle:
            return self._simple_random_sample()
        if self._position + self.batch_size > len(self._permutation):
            self._permutation = self.rng.permutation(self.n_rows)
            self._position = 0
        start = self._position
        self._position += self.batch_size
        return self._permutation[start : self._position]


class BlockIndexSampler:
    """Minibatch rows drawn uniformly inside a few cached random storage blocks.

    A chunked store (zarr, dask) decodes a whole block to read one row, so uniform rows
    would decode about ``n`` blocks per minibatch. Here ``K`` random blocks are *active*
    (held decoded by the columns' caches); each minibatch is a uniform sample of ``n`` rows
    of the active blocks (without replacement unless ``replace``), and after every
    minibatch blocks are swapped for fresh random ones at the rate rows are used: one swap
    per ``block_rows * reuse`` rows drawn. Each row is then drawn ``reuse`` times on
    average while its block is cached, and the store is read about ``1 / reuse`` times as
    fast as a uniform gather would read rows (one block per ``block_rows * reuse`` rows).

    Consequence for the gradient noise. The active set is a uniform random set of blocks
    at every step (swaps pick uniformly), so each minibatch is marginally a uniform sample
    of rows when the blocks have one row each, and every row has the same chance
    ``n / N`` of being in a minibatch whatever the blocks. The estimator stays unbiased;
    its variance about the full-data sum gains the spread of the active blocks' mean,
    ``N^2 Var(mean of K blocks)``, which for rows stored in random order is
    ``N^2 sigma^2 / (K B)`` (negligible beside ``N^2 sigma^2 / n`` when ``K B >> n``) but
    grows with the intra-block correlation of sorted data, and it is correlated across
    the ``K B reuse / n`` minibatches a cache lives. See ``docs/data.md``.

    Parameters
    ----------
    block_bounds
        Row index where each block starts, and ``N`` at the end.
    batch_size
        Rows per minibatch ``n``.
    rng
        The owning sampler's generator.
    active_blocks
        Blocks held at once (raised so that they hold at least ``2 n`` rows).
    reuse
        Mean number of times a row is drawn while its block is active (> 0).
    replace
        Draw a minibatch's rows with replacement.
    exclude
        Row indices never drawn (a census stratum).
    """

    def __init__(
        self,
        block_bounds: np.ndarray,
        batch_size: int,
        rng: np.random.Generator,
        active_blocks: int = DEFAULT_ACTIVE_BLOCKS,
        reuse: float = DEFAULT_REUSE,
        replace: bool = False,
        exclude: np.ndarray | None = None,
    ):
        self.block_bounds = np.asarray(block_bounds, dtype=np.int64)
        self.n_blocks = len(self.block_bounds) - 1
        n_rows = int(self.block_bounds[-1])
        if not (isinstance(active_blocks, int | np.integer) and active_blocks >= 1):
            raise ValueError(f"active_blocks must be a positive integer, got {active_blocks!r}.")
        if not (isinstance(reuse, int | float) and np.isfinite(reuse) and reuse > 0):
            raise ValueError(f"reuse must be a positive number, got {reuse!r}.")
        self._excluded = None
        if exclude is not None and len(exclude):
            self._excluded = np.zeros(n_rows, dtype=bool)
            self._excluded[exclude] = True
        check_batch_size(batch_size, n_rows - (0 if exclude is None else len(exclude)))
        self.n_rows = n_rows
        self.batch_size = int(batch_size)
        self.requested_blocks = int(active_blocks)
        self.reuse = float(reuse)
        self.replace = bool(replace)
        self.rng = rng
        self._mean_block = n_rows / self.n_blocks
        self._set_active_count()
        self._active: np.ndarray | None = None
        self._pool = np.empty(0, dtype=np.int64)
        self._swap_credit = 0.0
        #: blocks swapped in so far (each one decoded once)
        self.swaps = 0

    def _set_active_count(self) -> None:
        wanted = max(self.requested_blocks, int(np.ceil(2 * self.batch_size / self._mean_block)))
        self.active_blocks = min(self.n_blocks, wanted)

    def resize(self, batch_size: int) -> None:
        """Draw ``batch_size`` rows per minibatch from now on (the cache is redrawn)."""
        check_batch_size(batch_size, self.n_rows)
        self.batch_size = int(batch_size)
        self._set_active_count()
        self._active = None

    def reset(self, rng: np.random.Generator) -> None:
        """Start afresh from a new generator (a new chain)."""
        self.rng = rng
        self._active = None
        self._swap_credit = 0.0

    def draw(self) -> np.ndarray:
        """Return the row indices of the next minibatch."""
        if self._active is None:
            self._active = self.rng.choice(self.n_blocks, self.active_blocks, replace=False)
            self._rebuild_pool()
        pool = self._pool
        if self.replace:
            rows = pool[self.rng.integers(0, len(pool), size=self.batch_size)]
        else:
            rows = pool[self.rng.choice(len(pool), size=self.batch_size, replace=False)]
        self._swap_credit += self.batch_size / (self._mean_block * self.reuse)
        if self.active_blocks < self.n_blocks:
            while self._swap_credit >= 1.0:
                self._swap_credit -= 1.0
                self._swap()
        return rows

    def _swap(self) -> None:
        """Replace one uniformly chosen active block by a uniformly chosen inactive one."""
        slot = int(self.rng.integers(self.active_blocks))
        while True:
            fresh = int(self.rng.integers(self.n_blocks))
            if fresh not in self._active:
                break
        self._active[slot] = fresh
        self.swaps += 1
        self._rebuild_pool()
        if len(self._pool) < self.batch_size:  # only with a census filling the blocks
            self._swap()

    def _rebuild_pool(self) -> None:
        bounds = self.block_bounds
        pool = np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in self._active])
        if self._excluded is not None:
            pool = pool[~self._excluded[pool]]
        self._pool = pool


class LazyPermutation:
    """The rows of a uniformly random permutation, drawn only as far as they are read.

    A sequential test (approximate MH, Korattikara et al. 2014) reads rows without
    replacement until it is confident, usually a few hundred of ``N``: a full permutation
    would cost ``O(N)`` per decision. While less than half of the rows are out, each new row
    is drawn uniformly with replacement and kept only when it is not out yet (a first
    occurrence): every kept row is then uniform over the rows not yet out, which is what a
    permutation's next entry is. Beyond half, the rest is shuffled once (``O(N)``, as the
    rows read already cost that much).

    Parameters
    ----------
    n_rows
        Number of rows ``N``.
    rng
        The owning sampler's generator.
    """

    def __init__(self, n_rows: int, rng: np.random.Generator):
        if n_rows < 1:
            raise ValueError(f"LazyPermutation needs at least one row, got {n_rows}.")
        self.n_rows = int(n_rows)
        self.rng = rng
        self._out = np.zeros(self.n_rows, dtype=bool)
        self._drawn: list[np.ndarray] = []
        self._count = 0
        self._rest: np.ndarray | None = None

    def start(self, rng: np.random.Generator | None = None) -> None:
        """Begin a new permutation (the next decision's), optionally with a new generator."""
        if rng is not None:
            self.rng = rng
        for rows in self._drawn:
            self._out[rows] = False
        self._drawn, self._count, self._rest = [], 0, None

    @property
    def drawn(self) -> int:
        """How many rows of the current permutation are out."""
        return self._count

    def next(self, k: int) -> np.ndarray:
        """The next ``min(k, rows left)`` rows of the permutation."""
        k = min(int(k), self.n_rows - self._count)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        if self._rest is None and self._count + k > self.n_rows // 2:
            self._rest = np.flatnonzero(~self._out)
            self.rng.shuffle(self._rest)
        if self._rest is not None:
            start = self._count - (self.n_rows - len(self._rest))
            rows = self._rest[start : start + k]
        else:
            rows = self._fresh(k)
            self._out[rows] = True
            self._drawn.append(rows)
        self._count += k
        return rows

    def _fresh(self, k: int) -> np.ndarray:
        """``k`` rows not out yet, each uniform over those left, in order of drawing."""
        kept = np.empty(0, dtype=np.int64)
        left = self.n_rows - self._count  # rows not out yet (at least half of them)
        while len(kept) < k:
            # enough draws for the rows still wanted, at the rate new rows turn up: one
            # round almost always (the draws beyond the k-th new row are dropped unread)
            need = k - len(kept)
            size = int(1.25 * need * self.n_rows / (left - len(kept))) + 16
            candidates = self.rng.integers(0, self.n_rows, size=size)
            candidates = candidates[~self._out[candidates]]
            candidates = np.concatenate([kept, candidates])
            _, first = np.unique(candidates, return_index=True)
            kept = candidates[np.sort(first)][:k]  # first occurrences, in order
        return kept


def check_batch_size(batch_size: int, n_rows: int) -> None:
    """Raise a clear error unless ``1 <= batch_size <= n_rows``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r}.")
    if not 1 <= batch_size <= n_rows:
        raise ValueError(
            f"batch_size must be between 1 and the number of rows N = {n_rows}, got {batch_size}."
        )
