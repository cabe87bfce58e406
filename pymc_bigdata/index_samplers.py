"""Minibatch index samplers: which rows a sampler's next minibatch reads.

:class:`RowIndexSampler` draws uniform minibatches (random reshuffling, independent simple
random samples, or with replacement); :class:`BlockIndexSampler` draws them inside a few cached
random storage blocks, for chunked stores (zarr, dask) where reading a row decodes its whole
block; :class:`LazyPermutation` hands out the rows of one random permutation a batch at a time,
drawing only as much of it as a sequential test reads. Each draws from its owning sampler's
generator and never reads the data: :meth:`pymc_bigdata.rows.RowSource.index_sampler` picks
the sampler for a source's gather.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DEFAULT_ACTIVE_BLOCKS",
    "DEFAULT_REUSE",
    "MARKER_MAX_ROWS",
    "BlockIndexSampler",
    "LazyPermutation",
    "RowIndexSampler",
    "check_batch_size",
]

#: storage blocks a block gather keeps in memory (at least enough for two minibatches)
DEFAULT_ACTIVE_BLOCKS = 16

#: mean number of times a block gather draws a row while its block is cached
DEFAULT_REUSE = 1.0

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


#: :class:`LazyPermutation`'s row slots: a row in the permutation already, a row not yet
_OUT = 0
_FREE = np.iinfo(np.uint16).max


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
        # per row: OUT (in this permutation already), FREE, or during _first_occurrences a
        # candidate's 1-based position (2 bytes a row; a bool array and np.unique cost 24 µs
        # more per 500-row batch at 10^6 rows)
        self._slot = np.full(self.n_rows, _FREE, dtype=np.uint16)
        self._drawn: list[np.ndarray] = []
        self._count = 0
        self._rest: np.ndarray | None = None

    def start(self, rng: np.random.Generator | None = None) -> None:
        """Begin a new permutation (the next decision's), optionally with a new generator."""
        if rng is not None:
            self.rng = rng
        for rows in self._drawn:
            self._slot[rows] = _FREE
        self._drawn, self._count, self._rest = [], 0, None

    @property
    def drawn(self) -> int:
        """How many rows of the current permutation are out."""
        return self._count

    def mark_out(self, rows: np.ndarray) -> None:
        """Count ``rows`` (distinct, none out yet) as the permutation's next entries, read
        elsewhere: the later ones are uniform over the rest (before any :meth:`next` that
        went past half of the rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._rest is not None or self._count + len(rows) > self.n_rows // 2:
            raise ValueError("mark_out works only while at most half of the rows are out.")
        self._slot[rows] = _OUT
        self._drawn.append(rows)
        self._count += len(rows)

    def next(self, k: int) -> np.ndarray:
        """The next ``min(k, rows left)`` rows of the permutation."""
        k = min(int(k), self.n_rows - self._count)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        if self._rest is None and self._count + k > self.n_rows // 2:
            self._rest = np.flatnonzero(self._slot == _FREE)
            self.rng.shuffle(self._rest)
        if self._rest is not None:
            start = self._count - (self.n_rows - len(self._rest))
            rows = self._rest[start : start + k]
        else:
            rows = self._fresh(k)
            self._slot[rows] = _OUT
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
            candidates = candidates[self._slot[candidates] == _FREE]
            candidates = np.concatenate([kept, candidates])
            kept = self._first_occurrences(candidates)[:k]
        return kept

    def _first_occurrences(self, candidates: np.ndarray) -> np.ndarray:
        """The first occurrence of each row in ``candidates`` (none of them out), in order:
        each row's slot takes the smallest position it occurs at, which only its first
        occurrence then matches; the slots are FREE again on return."""
        if len(candidates) >= _FREE:  # positions beyond the slots' range: sort instead
            _, first = np.unique(candidates, return_index=True)
            return candidates[np.sort(first)]
        positions = np.arange(1, len(candidates) + 1, dtype=np.uint16)
        np.minimum.at(self._slot, candidates, positions)
        first = self._slot[candidates] == positions
        self._slot[candidates] = _FREE
        return candidates[first]


def check_batch_size(batch_size: int, n_rows: int) -> None:
    """Raise a clear error unless ``1 <= batch_size <= n_rows``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r}.")
    if not 1 <= batch_size <= n_rows:
        raise ValueError(
            f"batch_size must be between 1 and the number of rows N = {n_rows}, got {batch_size}."
        )
