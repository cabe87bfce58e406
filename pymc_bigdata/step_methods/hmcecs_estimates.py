"""HMC-ECS's estimates: the kernel's two callbacks, built afresh for each draw.

:class:`SubsampleEstimates` holds the estimator's settings at one draw (the coordinates, the
anchor, ``m`` or ``lambda``/``a``, the Taylor space) and gives
:func:`~pymc_bigdata.kernels.hmcecs.hmcecs_step` what it needs: ``evaluate(z, u)``, the
estimated log posterior ``log |L_hat(theta; u)| + log p(theta)`` and its gradient in ``z``
(Eqs. 4.5 and 4.7 with ``grad sigma_hat^2``, or 5.1), and ``propose(u, rng)``, the
subsample's block (or products') refresh. It counts the rows it reads (:attr:`rows_read`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.kernels.hmcecs import (
    Evaluation,
    Subsample,
    block_poisson_log_abs,
    block_poisson_nearest_zero,
    draw_block_subsample,
    draw_poisson_subsample,
    perturbed_loglik,
    propose_block,
    propose_products,
)
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.difference_terms import (
    DifferenceTerms,
    EstimateAt,
    control_variate_sum,
)
from pymc_bigdata.model.laplace import symmetrised
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.minibatches import Minibatches
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = [
    "EstimatorSettings",
    "ExactCache",
    "SubsampleEstimates",
    "anchor_at",
    "residual_spreads",
    "take_pool_rows",
]

#: the last exact evaluation: (preconditioner, z, evaluation)
ExactCache = tuple[Preconditioner, np.ndarray, Evaluation] | None


class EstimatorSettings(NamedTuple):
    """The estimator's settings at one draw (see :class:`~pymc_bigdata.HMCECS`)."""

    estimator: str
    taylor_order: int
    taylor_space: str
    subsample_size: int
    blocks: int
    minibatch: int
    products: int
    refreshed_products: int
    lower_bound: float


def anchor_at(layer: MinibatchModel, center: np.ndarray, taylor_order: int) -> Anchor | None:
    """The anchor moved to ``center`` with, for second order, the full-data curvature there
    (``d <= 2000``; one gradient and one Hessian pass over the data); None where ``center`` or
    the curvature is not finite."""
    if not np.all(np.isfinite(center)):
        return None
    curvature = None
    if taylor_order == 2:
        with np.errstate(all="ignore"):
            hessian = layer.full_loglik_hessian(center)
        if not np.all(np.isfinite(hessian)):
            return None
        hessian = symmetrised(hessian)
        curvature = Anchor(center, 0.0, np.zeros(layer.dim), center, hessian)
    return layer.anchor_at(center, curvature_from=curvature)


def take_pool_rows(
    layer: MinibatchModel, pool_rows: np.ndarray | None, positions: np.ndarray
) -> list[np.ndarray]:
    """Rows at ``positions`` of the pool (the rows outside the census stratum)."""
    return layer.take_rows(positions if pool_rows is None else pool_rows[positions])


def residual_spreads(
    terms: DifferenceTerms,
    rows: list[np.ndarray],
    anchor: Anchor,
    order: int,
    spaces: list[str],
    thetas: list[np.ndarray],
    pool: int,
    ddof: int,
) -> dict[str, list[tuple[float, float]]]:
    """Per Taylor space, ``(N mean, N variance)`` of the rows' residuals at each of
    ``thetas`` (``N = pool``, the subsampled rows; non-finite ones left out): what
    ``taylor_space="auto"`` and the automatic ``m`` or ``lambda`` start from."""
    spreads: dict[str, list[tuple[float, float]]] = {}
    for space in spaces:
        measured = []
        for theta in thetas:
            try:
                d = terms.residuals(theta, rows, anchor, order, space)
            except ParameterValueError:
                continue
            if np.all(np.isfinite(d)):
                spread = float(np.var(d, ddof=ddof))
                measured.append((pool * float(d.mean()), pool * spread))
        if measured:
            spreads[space] = measured
    return spreads


class SubsampleEstimates:
    """One draw's estimates (see the module docstring).

    Parameters
    ----------
    layer, minibatches
        The model layer and the step's minibatches (their census stratum enters every
        estimate exactly).
    pool_rows
        The subsampled rows' indices (None: all rows, no census).
    precond, anchor
        The coordinates ``theta = c + L z`` and the control variates' anchor.
    settings
        The estimator's settings.
    exact_cache
        The last exact evaluation (the u-update of an exact estimate proposes the same
        ``u``: its evaluation is reused); :attr:`exact_cache` holds the newest.
    fused
        Evaluate in one compiled call (:mod:`pymc_bigdata.model.estimate_graphs`; the same
        formulas) where the layer can (:meth:`~.DifferenceTerms.fusable`); False: step by
        step, through the kernel's numpy estimators (the reference, for tests).
    """

    def __init__(
        self,
        layer: MinibatchModel,
        minibatches: Minibatches,
        pool_rows: np.ndarray | None,
        precond: Preconditioner,
        anchor: Anchor,
        settings: EstimatorSettings,
        exact_cache: ExactCache,
        fused: bool = True,
    ):
        self.layer, self.minibatches, self.pool_rows = layer, minibatches, pool_rows
        self.precond, self.anchor, self.settings = precond, anchor, settings
        self.exact_cache = exact_cache
        self.pool = minibatches.pool_size
        #: whether the perturbed estimator's ``m`` reaches the pool of subsampled rows: the
        #: log-likelihood is then the exact full-data sum (``sigma_hat^2 = 0``, ``u`` fixed)
        self.exact = settings.estimator == "perturbed" and settings.subsample_size >= self.pool
        #: the rows the evaluations read so far
        self.rows_read = 0
        terms = layer.difference_terms
        self._fused = fused and terms.fusable(anchor, settings.taylor_order, settings.taylor_space)
        self._linear_map = tuple(np.ascontiguousarray(a) for a in precond.linear_map())

    def _take(self, positions: np.ndarray) -> list[np.ndarray]:
        return take_pool_rows(self.layer, self.pool_rows, positions)

    def fresh(self, rng: np.random.Generator) -> Subsample:
        """A new subsample: ``G`` blocks of ``m`` rows (perturbed) or ``lambda`` minibatch
        products (signed); every row when :attr:`exact`."""
        s = self.settings
        if self.exact:  # every row, read by full-data passes: u has nothing to vary
            return Subsample(np.arange(self.pool), ())
        if s.estimator == "perturbed":
            return draw_block_subsample(self.pool, s.subsample_size, s.blocks, self._take, rng)
        return draw_poisson_subsample(self.pool, s.minibatch, s.products, self._take, rng)

    def propose(self, u: Subsample, rng: np.random.Generator) -> Subsample:
        """The u-update's proposal: one block (perturbed) or ``kappa`` products redrawn."""
        s = self.settings
        if self.exact:
            return u
        if s.estimator == "perturbed":
            return propose_block(u, self.pool, self._take, rng)
        kappa = min(s.refreshed_products, s.products)
        return propose_products(u, self.pool, kappa, self._take, rng)

    def evaluate(self, z: np.ndarray, u: Subsample) -> Evaluation:
        """``log |L_hat(theta; u)| + log p(theta)`` and its gradient in ``z``, ``sigma_hat^2``
        and the sign; with :attr:`exact`, the full-data log posterior."""
        if self.exact:
            return self._evaluate_exactly(z)
        rows = self.minibatches.with_census(list(u.rows))
        n_census = len(self.minibatches.census)
        self.rows_read += n_census + len(u.indices)
        try:
            if self._fused:
                return self._evaluate_fused(z, rows, n_census)
            return self._evaluate_by_steps(z, rows, n_census)
        except ParameterValueError:
            return Evaluation(math.nan, np.full(len(z), np.nan), math.nan, 1, math.nan)

    def _evaluate_fused(self, z: np.ndarray, rows: list[np.ndarray], n_census: int) -> Evaluation:
        """:meth:`evaluate` in one compiled call (the formulas of :meth:`_evaluate_by_steps`)."""
        s, pool, terms = self.settings, self.pool, self.layer.difference_terms
        at = EstimateAt(
            z, self._linear_map, rows, self.anchor, s.taylor_order, s.taylor_space, n_census, pool
        )
        n = len(rows[0]) - n_census
        if s.estimator == "perturbed":
            logp, grad_z, sigma2, total = terms.perturbed_at_z(at)
            return Evaluation(logp, grad_z, sigma2, 1, pool * total / n)
        logp, grad_z, negatives, nearest, spread, total = terms.block_poisson_at_z(
            at, s.minibatch, s.lower_bound, s.products
        )
        variance = pool * pool * spread / (n - 1) / s.minibatch / s.products if n > 1 else math.nan
        level = pool * total / n if n else 0.0
        return Evaluation(logp, grad_z, variance, -1 if negatives % 2 else 1, level, nearest)

    def _evaluate_by_steps(
        self, z: np.ndarray, rows: list[np.ndarray], n_census: int
    ) -> Evaluation:
        """:meth:`evaluate` step by step: the residuals and gradient, the control variates'
        sum and the kernel's numpy estimators (the reference)."""
        s, theta, pool = self.settings, self.precond.theta(z), self.pool
        prior, d, g = self._residuals(theta, rows, n_census)
        cv_sum, cv_grad = control_variate_sum(
            theta, self.anchor, s.taylor_order, s.taylor_space, self.layer
        )
        census, sampled = float(d[:n_census].sum()), d[n_census:]
        nearest_zero = math.inf
        if s.estimator == "perturbed":
            loglik, loglik_var = perturbed_loglik(cv_sum, sampled, pool, census)
            sign = 1
        else:
            products, minibatch, bound = s.products, s.minibatch, s.lower_bound
            loglik, sign = block_poisson_log_abs(
                cv_sum + census, sampled, pool, minibatch, products, bound
            )
            loglik_var = self._minibatch_variance(sampled)
            nearest_zero = block_poisson_nearest_zero(sampled, pool, minibatch, products, bound)
        grad_z = self.precond.grad_z(g + cv_grad)
        level = pool * float(sampled.mean()) if len(sampled) else 0.0
        return Evaluation(prior + loglik, grad_z, loglik_var, sign, level, nearest_zero)

    def _residuals(self, theta: np.ndarray, rows: list[np.ndarray], n_census: int) -> tuple:
        """The prior, the rows' Taylor residuals and the estimate's gradient in ``theta``."""
        s, terms = self.settings, self.layer.difference_terms
        order, space, pool = s.taylor_order, s.taylor_space, self.pool
        if s.estimator == "perturbed":
            return terms.perturbed(theta, rows, self.anchor, order, n_census, pool, space)
        return terms.block_poisson(
            theta, rows, self.anchor, order, s.minibatch, s.lower_bound, n_census, pool, space
        )

    def _evaluate_exactly(self, z: np.ndarray) -> Evaluation:
        """The full-data log posterior and its gradient at ``z`` (one chunked pass; the
        u-update proposes the same ``u``, so the last evaluation is reused)."""
        cached = self.exact_cache
        if cached is not None and cached[0] is self.precond and np.array_equal(cached[1], z):
            return cached[2]
        self.rows_read += self.layer.n_rows
        try:
            logp, grad = self.layer.full_logp_grad(self.precond.theta(z))
        except ParameterValueError:
            return Evaluation(math.nan, np.full(len(z), np.nan), math.nan, 1, math.nan)
        evaluation = Evaluation(float(logp), self.precond.grad_z(grad), 0.0, 1, math.nan)
        self.exact_cache = (self.precond, z, evaluation)
        return evaluation

    def _minibatch_variance(self, d: np.ndarray) -> float:
        """Signed: ``Var log |L_hat| ~ sigma^2 / lambda`` with ``sigma^2 = N^2 var(d) / m`` the
        variance of one minibatch estimate, from the residuals' spread."""
        if len(d) < 2:
            return math.nan
        s = self.settings
        return self.pool * self.pool * float(np.var(d, ddof=1)) / s.minibatch / s.products
