"""Window gathers: minibatches read as contiguous windows of a once-shuffled copy of the rows.

Reading ``n`` random rows of an in-memory array costs a cache miss per row (about 47 µs for
1,000 rows of 30 float64 at N = 10⁶ on the project's machine), and drawing them costs a
permutation or a repeat check. With ``gather="windows"`` the row source keeps a copy of the
subsampled rows (every row but the census stratum) in one fixed random order, made once per
process, and a minibatch is ``n`` consecutive rows of that copy, starting at a uniform random
position and wrapping around the end: a view, no copy and no gather.

Each window holds every row with probability exactly ``n / N`` (the starts are uniform on the
circle), so every estimate stays unbiased. Over the random order a window is a simple random
sample; given the order, its noise variance is an average over the ``N`` windows whose
relative deviation from a simple random sample's is about ``sqrt(n/N)`` (simulated: 10 % at
``N/n = 100``, 3 % at ``N/n = 1,000``; ``docs/data.md``). With ``reshuffle=False`` the
starts are independent (independent minibatches, Theorem 1 of SBPS); with
``reshuffle=True`` one pass starts at a random offset and reads the ``floor(N/n)`` disjoint
windows from there in a random order.

The order's generator is fixed (``WINDOW_ORDER_SEED``), so ``pm.sample(random_seed=...)``
still fixes every draw; chains differ in their starts. The copy costs the subsampled rows'
bytes once more in memory, in every process that samples (it is not pickled with a step).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_bigdata.index_samplers import LazyPermutation, check_batch_size

__all__ = [
    "WINDOW_ORDER_SEED",
    "RowWindow",
    "ShuffledRows",
    "WindowIndexSampler",
    "WindowPermutation",
    "WindowStarts",
]

#: the seed of the copy's fixed random row order
WINDOW_ORDER_SEED = 20261128


class ShuffledRows:
    """The subsampled rows in one fixed random order, copied once (lazily, per process).

    Parameters
    ----------
    read_in_order
        The row source's reader of the rows in a given order (row indices -> one array per
        data array; :meth:`pymc_bigdata.rows.RowSource.rows_in_order`), the only reader of
        the data.
    n_rows
        Rows of the source ``N``.
    exclude
        Rows never in a window (the census stratum), or None.
    """

    def __init__(
        self,
        read_in_order: Callable[[np.ndarray], list[np.ndarray]],
        n_rows: int,
        exclude: np.ndarray | None = None,
    ):
        self._read_in_order = read_in_order
        self.n_source_rows = int(n_rows)
        self.exclude = None if exclude is None or not len(exclude) else np.unique(exclude)
        excluded = 0 if self.exclude is None else len(self.exclude)
        #: rows in the copy (the pool)
        self.n_rows = self.n_source_rows - excluded
        self._order: np.ndarray | None = None
        self._arrays: list[np.ndarray] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_order": None, "_arrays": None}
        del state["_lock"]
        return state  # rebuilt where it is used: the copy does not travel with a step

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def order(self) -> np.ndarray:
        """The source's row index at each position of the copy."""
        if self._order is None:
            pool = np.arange(self.n_source_rows)
            if self.exclude is not None:
                pool = np.setdiff1d(pool, self.exclude, assume_unique=True)
            shuffle = np.random.default_rng(WINDOW_ORDER_SEED).permutation(len(pool))
            self._order = pool[shuffle]
        return self._order

    @property
    def built(self) -> bool:
        """Whether the copy is in memory."""
        return self._arrays is not None

    @property
    def arrays(self) -> list[np.ndarray]:
        """The copy: each data array's rows in :attr:`order` (built on first use, by the
        row source, in one pass over the rows)."""
        if self._arrays is None:  # the lock only while it may need building
            with self._lock:
                if self._arrays is None:
                    self._arrays = self._read_in_order(self.order)
        return self._arrays

    def release(self) -> None:
        """Free the copy's memory (it is read again, in the same order, on next use)."""
        with self._lock:
            self._arrays = None

    def rows(self, start: int, size: int) -> list[np.ndarray]:
        """The ``size`` rows of the copy from ``start`` on, wrapping around its end: views
        when they do not wrap."""
        stop = start + size
        if stop <= self.n_rows:
            return [a[start:stop] for a in self.arrays]
        wrapped = stop - self.n_rows
        return [np.concatenate([a[start:], a[:wrapped]]) for a in self.arrays]


class WindowStarts(NamedTuple):
    """Minibatches as windows of the row source's shuffled copy: its arrays (each data
    array's rows in the copy's order), each window's first position and the rows per
    window; window ``k`` is ``arrays[i][starts[k] : starts[k] + size]``."""

    arrays: list[np.ndarray]
    starts: np.ndarray
    size: int


class RowWindow:
    """One minibatch of a window gather: ``size`` consecutive rows of a :class:`ShuffledRows`
    from ``start`` on (wrapping around)."""

    __slots__ = ("shuffled", "size", "start")

    def __init__(self, shuffled: ShuffledRows, start: int, size: int):
        self.shuffled, self.start, self.size = shuffled, int(start), int(size)

    def __len__(self) -> int:
        return self.size

    @property
    def indices(self) -> np.ndarray:
        """The source's row indices of the window, in its order."""
        positions = (self.start + np.arange(self.size)) % self.shuffled.n_rows
        return self.shuffled.order[positions]

    def rows(self) -> list[np.ndarray]:
        """Each data array's rows of the window."""
        return self.shuffled.rows(self.start, self.size)


class WindowIndexSampler:
    """Draws minibatches as :class:`RowWindow` s of one :class:`ShuffledRows` (the module
    docstring): independent uniform starts, or with ``reshuffle=True`` the disjoint windows of
    a pass from a random offset, in a random order.

    Parameters
    ----------
    shuffled
        The copy whose windows are drawn.
    batch_size
        Rows per minibatch ``n``, ``1 <= n <= N`` (the pool's rows).
    rng
        The owning sampler's generator.
    reshuffle
        Disjoint windows along passes (True) or independent windows (False).
    """

    def __init__(
        self,
        shuffled: ShuffledRows,
        batch_size: int,
        rng: np.random.Generator,
        reshuffle: bool = True,
    ):
        check_batch_size(batch_size, shuffled.n_rows)
        self.shuffled = shuffled
        self.n_rows = shuffled.n_rows
        self.batch_size = int(batch_size)
        self.rng = rng
        self.reshuffle = bool(reshuffle)
        self._starts = np.empty(0, dtype=np.int64)
        self._position = 0

    def resize(self, batch_size: int) -> None:
        """Draw ``batch_size`` rows per minibatch from now on (a pass starts afresh)."""
        check_batch_size(batch_size, self.n_rows)
        self.batch_size = int(batch_size)
        self._starts = np.empty(0, dtype=np.int64)

    def reset(self, rng: np.random.Generator) -> None:
        """Start afresh from a new generator (a new chain)."""
        self.rng = rng
        self._starts = np.empty(0, dtype=np.int64)

    def draw(self) -> RowWindow:
        """The next minibatch's window."""
        if not self.reshuffle:
            return RowWindow(self.shuffled, int(self.rng.integers(self.n_rows)), self.batch_size)
        if self._position >= len(self._starts):
            self._new_pass()
        start = self._starts[self._position]
        self._position += 1
        return RowWindow(self.shuffled, int(start), self.batch_size)

    def _new_pass(self) -> None:
        n = self.batch_size
        offset = int(self.rng.integers(self.n_rows))
        windows = self.rng.permutation(self.n_rows // n)
        self._starts = (offset + windows * n) % self.n_rows
        self._position = 0


class WindowPermutation:
    """A sequential test's rows: one window of a :class:`ShuffledRows` for its first
    ``window_rows`` rows, then uniform rows among the rest, read as far as the test reads;
    the drop-in for :class:`~pymc_bigdata.index_samplers.LazyPermutation` where the rows are
    read through window gathers.

    Each decision starts at a uniform random position of the copy and reads its rows in
    order from there, wrapping around the end: within a decision the rows are distinct
    (without replacement), and over the copy's random order the first ``k`` of them are a
    simple random sample, as a permutation's first ``k`` are. Given the order, the mean of
    ``k`` consecutive rows from a uniform start is still unbiased (every row is in exactly
    ``k`` of the ``N`` windows of ``k``), but its spread is a simple random sample's only to
    within about ``sqrt(k/N)`` (the module docstring): fine for a test that stops after a
    batch or two, not for one that reads half the rows (AusterityGibbs on the variable
    selection example read 46 % of the rows per update from windows and decided 1.28 % of
    its updates wrong, against 0.39 % from a uniform permutation: ``docs/austerity.md``).
    So past ``window_rows`` rows (the steps pass ``N / WINDOW_MIN_BATCHES``, where that
    deviation is about 10 %) the test reads uniform rows among those it has not read, from
    a lazy permutation with the window's rows taken out: a window's rows are views of the
    copy, the later ones a gather.

    Parameters
    ----------
    shuffled
        The copy whose windows are read.
    rng
        The owning sampler's generator.
    window_rows
        Rows read as one window before uniform ones (default: every row).
    """

    def __init__(
        self, shuffled: ShuffledRows, rng: np.random.Generator, window_rows: int | None = None
    ):
        self.shuffled = shuffled
        self.n_rows = shuffled.n_rows
        self.rng = rng
        limit = self.n_rows if window_rows is None else int(window_rows)
        #: rows of a decision read as one window; the rest are uniform among those not read
        self.window_rows = min(max(limit, 1), self.n_rows)
        self._rest: LazyPermutation | None = None  # positions beyond the window (lazily)
        self._start = 0
        self._count = 0

    def start(self, rng: np.random.Generator | None = None) -> None:
        """Begin the next decision's rows at a uniform random position (optionally with a
        new generator)."""
        if rng is not None:
            self.rng = rng
        self._start = int(self.rng.integers(self.n_rows))
        self._count = 0

    @property
    def drawn(self) -> int:
        """How many rows of the current decision are out."""
        return self._count

    def next(self, k: int) -> RowWindow | np.ndarray:
        """The next ``min(k, rows left)`` rows of the decision: a :class:`RowWindow` while
        they are in its window, else the source's row indices (the window's remainder,
        then uniform rows among those not read)."""
        k = max(min(int(k), self.n_rows - self._count), 0)
        in_window = max(min(k, self.window_rows - self._count), 0)
        window = RowWindow(self.shuffled, (self._start + self._count) % self.n_rows, in_window)
        if in_window == k:
            self._count += k
            return window
        if self._count + in_window >= self.window_rows and self._count <= self.window_rows:
            self._begin_rest()  # the window is read: uniform rows among the others from here
        self._count += k
        positions = self._rest.next(k - in_window)
        return np.concatenate([window.indices, self.shuffled.order[positions]])

    def _begin_rest(self) -> None:
        """A lazy permutation of the copy's positions with the window's taken out."""
        if self._rest is None:
            self._rest = LazyPermutation(self.n_rows, self.rng)
        self._rest.start(self.rng)
        window = (self._start + np.arange(self.window_rows)) % self.n_rows
        self._rest.mark_out(window)
