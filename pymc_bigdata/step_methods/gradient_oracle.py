"""The gradient oracle a gradient kernel receives: fresh minibatch estimates of the log
posterior's gradient in the preconditioned coordinates ``z``, and a record of what it did.

:class:`MinibatchEstimator` holds the step's current settings (anchor, control-variate order,
weights, census rows) and computes estimates in ``theta``; :class:`GradientOracle` serves one
draw: every call reads a fresh minibatch, and the call the kernel makes on its last
transition (:meth:`GradientOracle.last`) also measures the estimator's noise when the draw is a
measuring one (two half minibatches, Var = E[(g_a - g_b)^2] / 4). After the kernel returns,
:meth:`GradientOracle.record` says how many rows were read, where the last gradient was
taken (the virial), the measured log-density estimate and the noise measurement. The oracle
writes nothing but its own record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.row_windows import WindowStarts

__all__ = ["DrawRecord", "GradientOracle", "MinibatchEstimator", "NoiseSample", "RowDraws"]


class NoiseSample(NamedTuple):
    """One measurement of the per-unit gradient noise ``N^2 s^2`` per coordinate (z units) of
    the first-order estimate and, where available, the second-order one; and, where the
    estimator asks for it (``noise_covariance``), the first-order estimate's whole per-unit
    covariance matrix (its diagonal is ``first``)."""

    first: np.ndarray
    second: np.ndarray | None
    covariance: np.ndarray | None = None


class DrawRecord(NamedTuple):
    """What a draw's gradient calls did.

    Attributes
    ----------
    rows_read
        Rows read over the draw (census rows included).
    position, grad
        Where the last gradient was evaluated and its value (z units), or None.
    log_density
        The measured log-density estimate (NaN unless the draw measured).
    noise
        The noise measurement, or None.
    """

    rows_read: int
    position: np.ndarray | None = None
    grad: np.ndarray | None = None
    log_density: float = math.nan
    noise: NoiseSample | None = None

    def virial(self) -> float:
        """``-z . grad / d`` at the last gradient evaluation (NaN without one)."""
        if self.grad is None:
            return math.nan
        return -float(self.position @ self.grad) / len(self.position)


@dataclass(frozen=True)
class MinibatchEstimator:
    """Minibatch estimates of ``grad log p(theta)`` under a step's current settings.

    Attributes
    ----------
    layer
        The :class:`~pymc_bigdata.MinibatchModel`.
    precond
        The step's :class:`~pymc_bigdata.step_methods.preconditioner.Preconditioner`.
    anchor
        The control variates' anchor, or None for plain minibatch sums.
    cv_order
        Control-variate order used for the estimates (0, 1 or 2).
    second_order
        Whether the anchor carries the curvature for second order (then both orders' noise
        is measured).
    weights, half_weights
        Row weights of a minibatch and of its two halves (census rows first, weight 1).
    census_rows
        The census stratum's rows (included in every estimate), or None.
    batch_size
        Rows per minibatch (outside the census).
    measure_size, measure_weights
        Rows a measuring estimate reads (outside the census; whole minibatches, at least
        ``batch_size``), and the weights of those rows and of their two halves.
    noise_measurement
        ``"split"`` (two half minibatches) or ``"fisher"`` (per-row gradients).
    pool_size
        Rows subsampled (all but the census).
    noise_covariance
        Whether a measurement also returns the first-order estimate's covariance matrix
        (``NoiseSample.covariance``; SGHMC's matrix B-hat).
    """

    layer: Any
    precond: Any
    anchor: Any
    cv_order: int
    second_order: bool
    weights: np.ndarray
    half_weights: tuple[np.ndarray, np.ndarray]
    census_rows: list[np.ndarray] | None
    batch_size: int
    measure_size: int
    measure_weights: tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]
    noise_measurement: str
    pool_size: int
    noise_covariance: bool = False

    def with_census(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """The census rows in front of a minibatch's rows."""
        if self.census_rows is None:
            return rows
        return [np.concatenate([c, r]) for c, r in zip(self.census_rows, rows)]

    def gradient(
        self, theta: np.ndarray, rows: list[np.ndarray], weights: np.ndarray
    ) -> np.ndarray:
        """The gradient estimate alone (the hot path); ``rows`` include the census."""
        anchor = self.anchor
        if self.cv_order == 2:
            g, row_curv = self.layer.estimate_second_order_grad_parts(theta, rows, anchor, weights)
            return anchor.second_order(theta, g, row_curv)
        return self.layer.estimate_grad(theta, rows, anchor, weights)

    def measured(
        self, theta: np.ndarray, rows: list[np.ndarray]
    ) -> tuple[float, np.ndarray, NoiseSample]:
        """The estimate on ``measure_size`` rows (``rows``, census excluded) with its noise
        measured: ``(log density, gradient in theta, noise in z units)``. Split: the weighted
        mean of two halves' estimates, whose difference gives ``Var(estimate) = E[(g_a -
        g_b)^2] / 4`` (``measure_size / 2`` rows each)."""
        weights, half_weights = self.measure_weights
        if self.noise_measurement == "fisher":
            lp, g = self.layer.estimate_logp_grad(
                theta, self.with_census(rows), self.anchor, weights
            )
            if self.cv_order == 2:  # value from first order; gradient as sampled
                g = self.gradient(theta, self.with_census(rows), weights)
            return lp, g, self._fisher_noise(theta, rows)
        half = self.measure_size // 2
        halves = [
            self.with_census([r[:half] for r in rows]),
            self.with_census([r[half:] for r in rows]),
        ]
        w_a = half / self.measure_size
        pairs = list(zip(halves, half_weights))
        if self.second_order:
            parts = [
                self.layer.estimate_second_order_parts(theta, h, self.anchor, w) for h, w in pairs
            ]
            (lp_a, first_a, curv_a), (lp_b, first_b, curv_b) = parts
            second_a = self.anchor.second_order(theta, first_a, curv_a)
            second_b = self.anchor.second_order(theta, first_b, curv_b)
            noise = NoiseSample(
                self._z_var(first_a - first_b),
                self._z_var(second_a - second_b),
                self._z_covariance(first_a - first_b),
            )
            chosen = (second_a, second_b) if self.cv_order == 2 else (first_a, first_b)
        else:
            (lp_a, g_a), (lp_b, g_b) = [
                self.layer.estimate_logp_grad(theta, h, self.anchor, w) for h, w in pairs
            ]
            noise = NoiseSample(self._z_var(g_a - g_b), None, self._z_covariance(g_a - g_b))
            chosen = (g_a, g_b)
        lp = w_a * lp_a + (1.0 - w_a) * lp_b
        return lp, w_a * chosen[0] + (1.0 - w_a) * chosen[1], noise

    def _z_var(self, difference: np.ndarray) -> np.ndarray:
        """Per-unit noise ``N^2 s^2`` (z units) from two halves' difference: ``E[(g_a -
        g_b)^2] / 4 = N^2 s^2 / n`` for halves of a sample drawn with or without
        replacement (``s^2``: the rows' variance, ``N``: the subsampled rows)."""
        return self.precond.grad_z(difference) ** 2 / 4.0 * self.measure_size

    def _z_covariance(self, difference: np.ndarray) -> np.ndarray | None:
        """The per-unit covariance matrix whose diagonal :meth:`_z_var` is (one outer
        product), where the estimator asks for it."""
        if not self.noise_covariance:
            return None
        dz = self.precond.grad_z(difference)
        return np.outer(dz, dz) / 4.0 * self.measure_size

    def _fisher_noise(self, theta: np.ndarray, rows: list[np.ndarray]) -> NoiseSample:
        """The first-order estimate's per-unit noise from per-row gradients (z units; the
        empirical Fisher of Ahn et al. 2012): ``N^2 Cov_i[grad l_i(theta) -
        grad l_i(theta*)]``, its diagonal and (where asked for) the whole matrix; the anchor
        term drops out without control variates."""
        per_row = self.layer.row_gradients(theta, rows)
        if self.anchor is not None:
            per_row = per_row - self.layer.row_gradients(self.anchor.theta, rows)
        per_row_z = self.precond.grad_z_rows(per_row)
        variance = per_row_z.var(axis=0, ddof=1) * self.pool_size**2
        if not self.noise_covariance:
            return NoiseSample(variance, None)
        covariance = np.cov(per_row_z, rowvar=False, ddof=1).reshape(len(variance), -1)
        return NoiseSample(variance, None, covariance * self.pool_size**2)


class RowDraws(Protocol):
    """What the oracle draws its rows from (:class:`~.minibatches.Minibatches`)."""

    def draw(self) -> list[np.ndarray]: ...

    def draw_many(self, n_batches: int) -> list[np.ndarray]: ...

    def draw_many_windows(self, n_batches: int) -> WindowStarts | list[np.ndarray]: ...

    def draw_measuring(self) -> list[np.ndarray]: ...


class GradientOracle:
    """One draw's stochastic gradient of the log posterior in z (a fresh minibatch per call).

    Parameters
    ----------
    estimator
        The estimates under the step's current settings (its ``precond`` maps z and theta).
    minibatches
        Draws the next minibatch's rows (``draw()``) and a measuring call's
        (``draw_measuring()``, ``estimator.measure_size`` rows), outside the census.
    measure
        Whether the call on the kernel's last transition measures the noise (and the log
        density), when it reads at least 2 rows.
    """

    def __init__(self, estimator: MinibatchEstimator, minibatches: RowDraws, measure: bool):
        self.estimator = estimator
        self._minibatches = minibatches
        self._measures = measure and estimator.measure_size >= 2
        self._measure = self._measures
        self._census = 0 if estimator.census_rows is None else len(estimator.census_rows[0])
        self._rows_read = 0
        self._position: np.ndarray | None = None
        self._grad: np.ndarray | None = None
        self._log_density = math.nan
        self._noise: NoiseSample | None = None

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """A plain estimate at ``z``."""
        return self._estimate(z, measure=False)

    def last(self, z: np.ndarray) -> np.ndarray:
        """The estimate on the kernel's last transition: the draw's noise measurement (its
        first such call only) when the draw measures."""
        measure, self._measure = self._measure, False
        return self._estimate(z, measure)

    def again(self) -> None:
        """The kernel runs the draw again (e.g. at a finer step): its next last call
        measures as the first did; the rows read so far still count."""
        self._measure = self._measures

    def measure_at(self, z: np.ndarray) -> DrawRecord:
        """A last (measuring) estimate at ``z`` alone, with no kernel transition (e.g. where
        a rejected divergence restarts the chain): the record of what it did."""
        with np.errstate(all="ignore"):
            self.last(z)
        return self.record()

    @property
    def last_measures(self) -> bool:
        """Whether the next :meth:`last` call measures."""
        return self._measure

    def draw_rows(self, n_calls: int) -> list[np.ndarray]:
        """The rows of the next ``n_calls`` plain estimates' minibatches, one after the
        other (census rows excluded), for estimates computed elsewhere (compiled code); they
        count as read."""
        rows = self._minibatches.draw_many(n_calls)
        self._rows_read += n_calls * self._census + len(rows[0])
        return rows

    def draw_windows(self, n_calls: int) -> WindowStarts | list[np.ndarray]:
        """:meth:`draw_rows`, but where every minibatch is a window of the shuffled copy that
        does not wrap, the copy and the windows' starts
        (:class:`~pymc_bigdata.row_windows.WindowStarts`); they count as read."""
        drawn = self._minibatches.draw_many_windows(n_calls)
        n_rows = len(drawn[0]) if isinstance(drawn, list) else n_calls * drawn.size
        self._rows_read += n_calls * self._census + n_rows
        return drawn

    def computed(self, z: np.ndarray, g: np.ndarray) -> None:
        """Record a plain estimate computed elsewhere: ``g`` at ``z`` (z units)."""
        self._position, self._grad = z, g

    def record(self) -> DrawRecord:
        """What the calls so far did."""
        return DrawRecord(
            self._rows_read, self._position, self._grad, self._log_density, self._noise
        )

    def _estimate(self, z: np.ndarray, measure: bool) -> np.ndarray:
        estimator = self.estimator
        theta = estimator.precond.theta(z)
        draw = self._minibatches.draw_measuring if measure else self._minibatches.draw
        rows = draw()
        self._rows_read += self._census + len(rows[0])
        try:
            if measure:
                lp, g_theta, self._noise = estimator.measured(theta, rows)
                self._log_density = lp
            else:
                rows = estimator.with_census(rows)
                g_theta = estimator.gradient(theta, rows, estimator.weights)
        except ParameterValueError:  # a parameter left its support (e.g. p = NaN): diverging
            g_theta = np.full(len(theta), np.nan)
        g = estimator.precond.grad_z(g_theta)
        self._position, self._grad = z, g
        return g
