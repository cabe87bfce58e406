"""The rows a step's estimates read: the minibatch size, the census stratum, the weights.

A step holds one :class:`Minibatches`. The rows of the census stratum (rows that would
dominate the gradient noise: a rare feature, a tiny group) enter every estimate with weight
1; the others are subsampled, ``n`` at a time, with weight ``(N - C) / n`` (stratified
sampling: unbiased, and the census rows add no noise). The row source's index sampler draws
the subsampled rows (with or without replacement, reshuffled or independent minibatches;
with a window gather, windows of a shuffled copy, :mod:`pymc_bigdata.row_windows`).
"""

from __future__ import annotations

import numpy as np

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.row_windows import RowWindow, WindowIndexSampler, WindowStarts
from pymc_bigdata.step_methods.gradient_oracle import MinibatchEstimator
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = ["MEASURE_ROWS", "Minibatches"]

#: a measuring transition (:mod:`.gradient_oracle`) reads at least this many rows: the next
#: ``ceil(MEASURE_ROWS / n)`` minibatches together (at most the pool). The measured noise of
#: a small minibatch is heavy-tailed: the rows of a small group enter a 10-row minibatch in
#: one draw of ~50, with weight ``N / n``, so the running mean of 10-row measurements came
#: out several times too low in one chain of two and its step size 3 times its twin's
#: (non-centred hierarchy, 17,798 rows, groups of 20 to 2,000; one group effect's sd 23 %
#: too wide). Minibatches of at least this size measure as before (the same draws)
MEASURE_ROWS = 100


class Minibatches:
    """A step's minibatches (see the module docstring).

    Parameters
    ----------
    layer
        The model layer (its row source draws and reads the rows).
    batch_size
        Rows per minibatch ``n`` (the default the chain starts from).
    census
        Indices of the census stratum (possibly empty).
    rng
        The step's generator (replaced per chain by :meth:`reset`).
    replace, reshuffle
        Draw rows with replacement; without, walk through random permutations (reshuffled)
        or draw independent minibatches.
    windows
        Draw windows of the row source's shuffled copy where its gather is ``"windows"``
        (False: uniform rows).
    """

    def __init__(
        self,
        layer: MinibatchModel,
        batch_size: int,
        census: np.ndarray,
        rng: np.random.Generator,
        *,
        replace: bool,
        reshuffle: bool,
        windows: bool = True,
    ):
        self.layer, self.census = layer, census
        self.default_size = self.size = int(batch_size)
        self.measure_rows = 0
        self.replace, self.reshuffle = replace, reshuffle
        self._sampler = layer.rows.index_sampler(
            self.size,
            rng,
            replace=replace,
            reshuffle=reshuffle,
            exclude=census,
            windows=bool(windows),
        )
        #: whether the minibatches are windows of the row source's shuffled copy
        self.windows = isinstance(self._sampler, WindowIndexSampler)
        #: the census stratum's rows (None without one)
        self.census_rows = layer.take_rows(census) if len(census) else None
        self._set_weights()

    @property
    def pool_size(self) -> int:
        """Rows subsampled (all but the census)."""
        return self.layer.n_rows - len(self.census)

    def batch_factor(self, batch_size: float) -> float:
        """``1/n`` with replacement, ``1/n - 1/N`` without: the variance factor of an
        ``n``-row estimate's sum over the pool."""
        if self.replace:
            return 1.0 / batch_size
        return max(1.0 / batch_size - 1.0 / self.pool_size, 0.0)

    def measure_at_least(self, rows: int) -> None:
        """Measuring transitions read at least ``rows`` rows from now on (0: one minibatch)."""
        self.measure_rows = int(rows)
        self._set_weights()

    def draw_measuring(self) -> list[np.ndarray]:
        """The next ``measure_batches`` minibatches' rows together (census rows excluded)."""
        return self.draw_many(self.measure_batches)

    def draw_many(self, n_batches: int) -> list[np.ndarray]:
        """The next ``n_batches`` minibatches' rows, one after the other (census rows
        excluded): what ``n_batches`` calls of :meth:`draw` read, in one array each."""
        return self._rows_of([self._sampler.draw() for _ in range(n_batches)])

    def draw_many_windows(self, n_batches: int) -> WindowStarts | list[np.ndarray]:
        """The next ``n_batches`` minibatches, drawn as :meth:`draw_many` draws them: where
        every one is a window of the shuffled copy that does not wrap around its end, the
        copy and the windows' starts (:class:`WindowStarts`, nothing read); else their
        rows, as :meth:`draw_many` gives them."""
        drawn = [self._sampler.draw() for _ in range(n_batches)]
        windows = isinstance(drawn[0], RowWindow)
        if windows and all(w.start + w.size <= w.shuffled.n_rows for w in drawn):
            arrays = self.layer.rows.window_arrays(drawn[0])
            starts = np.array([w.start for w in drawn], dtype=np.int64)
            return WindowStarts(arrays, starts, drawn[0].size)
        return self._rows_of(drawn)

    def _rows_of(self, drawn: list) -> list[np.ndarray]:
        """The rows of drawn minibatches (row indices or windows), one after the other."""
        if len(drawn) == 1:
            return self.layer.take_rows(drawn[0])
        if not isinstance(drawn[0], RowWindow):  # row indices: one gather for them all
            return self.layer.take_rows(np.concatenate(drawn))
        parts = [self.layer.take_rows(window) for window in drawn]
        return [np.concatenate(arrays) for arrays in zip(*parts)]

    def reset(self, rng: np.random.Generator) -> None:
        """A new chain's generator."""
        self._sampler.reset(rng)

    def restore_default(self) -> None:
        """Back to the default size (a new chain's tuning starts from it)."""
        if self.size != self.default_size:
            self.resize(self.default_size)

    def resize(self, batch_size: int) -> None:
        """Draw ``batch_size`` rows per minibatch from now on."""
        self.size = int(batch_size)
        self._sampler.resize(self.size)
        self._set_weights()

    def draw_indices(self) -> np.ndarray:
        """The next minibatch's row indices (census rows excluded)."""
        drawn = self._sampler.draw()
        return drawn.indices if isinstance(drawn, RowWindow) else drawn

    def draw(self) -> list[np.ndarray]:
        """The next minibatch's rows (census rows excluded)."""
        return self.layer.take_rows(self._sampler.draw())

    def with_census(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """``rows`` after the census stratum's rows (their weights come first)."""
        if self.census_rows is None:
            return rows
        return [np.concatenate([c, r]) for c, r in zip(self.census_rows, rows)]

    def estimator(
        self,
        precond: Preconditioner,
        anchor: Anchor | None,
        cv_order: int,
        *,
        second_order: bool,
        noise_measurement: str,
    ) -> MinibatchEstimator:
        """Estimates on these minibatches in ``precond``'s coordinates, with control
        variates of order ``cv_order`` around ``anchor`` (:mod:`.gradient_oracle`)."""
        return MinibatchEstimator(
            layer=self.layer,
            precond=precond,
            anchor=anchor,
            cv_order=cv_order,
            second_order=second_order,
            weights=self.weights,
            half_weights=self.half_weights,
            census_rows=self.census_rows,
            batch_size=self.size,
            measure_size=self.size * self.measure_batches,
            measure_weights=self.measure_weights,
            noise_measurement=noise_measurement,
            pool_size=self.pool_size,
        )

    def _set_weights(self) -> None:
        """The weights of a minibatch and of its halves, and of a measuring transition's
        ``measure_batches`` minibatches (census rows first, weight 1)."""
        self.weights, self.half_weights = self._weights_for(self.size)
        wanted = -(-self.measure_rows // self.size)  # ceil
        self.measure_batches = max(1, min(wanted, self.pool_size // self.size))
        self.measure_weights = self._weights_for(self.size * self.measure_batches)

    def _weights_for(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """The weights of ``n`` subsampled rows and of their two halves."""
        n_census = len(self.census)
        rest = self.layer.n_rows - n_census
        ones = np.ones(n_census)
        half = n // 2
        return np.concatenate([ones, np.full(n, rest / n)]), (
            np.concatenate([ones, np.full(half, rest / max(half, 1))]),
            np.concatenate([ones, np.full(n - half, rest / max(n - half, 1))]),
        )
