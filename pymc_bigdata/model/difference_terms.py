"""Compiled per-row Taylor residuals for difference estimators of the log-likelihood.

The model's part of HMC-ECS (Dang et al. 2019, Sec. 4.1-4.2 and 5.1): for the rows of a
subsample, the residual of each row's log-likelihood against its Taylor control variate
around the anchor ``theta*`` (Eq. 4.4),

    d_k(theta) = l_k(theta) - q_k(theta),
    q_k(theta) = l_k(theta*) + grad l_k(theta*) . delta + 1/2 delta' H_k(theta_h) delta,

with ``delta = theta - theta*`` and the terms kept up to the Taylor ``order`` (0, 1 or 2).
``H_k`` is taken at the anchor's curvature point ``theta_h`` (the MAP, or where tuning last
re-fitted the curvature): the estimator stays unbiased for any ``theta_h`` because the
full-data sum ``sum_k q_k`` uses the same point, ``B = sum_k H_k(theta_h)``
(``Anchor.loglik_hessian``).  No per-row Hessian is ever formed: ``delta' H_k delta`` is a
second directional derivative along ``delta`` (two forward passes per row), and the
gradients below are reverse passes through it (``O(m d)`` memory, never ``m d^2``).

Two fused graphs give, in one call, the log prior, the residuals ``d`` of the given rows and
the gradient in ``theta`` of ``log prior + F(d)`` for the estimator's own ``F``:

* ``perturbed``: ``F = w sum_i d_i - (v / 2) sum_i (d_i - mean d)^2`` with ``w = n/m`` and
  ``v = n^2/m^2``: the random part of the bias-corrected estimator (4.5),
  ``l_hat - sigma_hat^2 / 2`` with (4.1)-(4.3); its gradient is (4.7) with ``grad
  sigma_hat^2``;
* ``block_poisson``: the rows in consecutive minibatches of ``m``, ``D_g = w sum_{i in g}
  d_i`` and ``F = sum_g log |D_g - a|``: the random part of ``log |L_hat|`` of (5.1).

A third graph serves approximate Metropolis-Hastings (Korattikara et al. 2014): the
differences ``d_k(theta') - d_k(theta)`` between two points, for the same rows (order 0 is
the plain ``l_k(theta') - l_k(theta)``, which needs no anchor).

Census rows (the base's stratum of rows that would dominate the estimator's variance, e.g.
the few rows of a rare feature) come first and enter exactly, ``+ sum_census d_k`` with
weight 1; the others are subsampled from the pool of ``P = N - C`` rows, ``w = P/m``.

The deterministic part, ``sum_k q_k(theta) = l(theta*) + A . delta + 1/2 delta' B delta``
(``A``, ``B``: full-data sums at the anchor), is added by :func:`control_variate_sum`.

:meth:`DifferenceTerms.perturbed_at_z` and :meth:`DifferenceTerms.block_poisson_at_z` give a
whole estimate at ``z`` in one compiled call (:mod:`.estimate_graphs`): the same formulas,
fused, for HMC-ECS's leapfrog.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple, Protocol

import numpy as np
import pytensor.tensor as pt
from pytensor.compile import Function
from pytensor.gradient import grad, pushforward, zero_grad
from pytensor.graph.replace import clone_replace, graph_replace

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.compiled import CompiledModel
from pymc_bigdata.model.estimate_graphs import estimate_graph
from pymc_bigdata.model.likelihood_inputs import LikelihoodInputs
from pymc_bigdata.model.passes import FullDataPasses

__all__ = [
    "TAYLOR_ORDERS",
    "DifferenceTerms",
    "EstimateAt",
    "HasLikelihoodInputs",
    "control_variate_sum",
]

#: the Taylor orders of the control variates (Sec. 6.8 of the paper compares them)
TAYLOR_ORDERS = (0, 1, 2)


class HasLikelihoodInputs(Protocol):
    """What :func:`control_variate_sum` needs for an expansion in the likelihood inputs
    (a :class:`~pymc_bigdata.MinibatchModel` has it)."""

    @property
    def likelihood_inputs(self) -> LikelihoodInputs: ...


class EstimateAt(NamedTuple):
    """Where a fused estimate is taken (:meth:`DifferenceTerms.perturbed_at_z`): ``theta = c +
    L z`` with ``linear_map = (c, L)`` (``L`` dense or its diagonal), the rows (``n_census``
    census rows first, then the sampled ones, drawn from a pool of ``pool`` rows), the
    anchor, the Taylor order and the expansion's space."""

    z: np.ndarray
    linear_map: tuple[np.ndarray, np.ndarray]
    rows: list[np.ndarray]
    anchor: Anchor
    order: int
    space: str
    n_census: int
    pool: int


class DifferenceTerms:
    """Residuals ``d_k`` and estimator gradients of one model (compiled lazily, per order).

    Parameters
    ----------
    compiled
        The model's compiled quantities (the row log-likelihood graph is read from it).
    passes
        Its full-data passes (for the sums of an expansion in the likelihood inputs).
    """

    def __init__(self, compiled: CompiledModel, passes: FullDataPasses):
        self.compiled, self.passes = compiled, passes
        self._fns: dict[tuple[str, int, str], Function] = {}
        self._last_sums: tuple | None = None

    @cached_property
    def likelihood_inputs(self) -> LikelihoodInputs:
        """The parameter-only tensors the row log-likelihood reads (``phi(theta)``), found
        lazily; see :mod:`pymc_bigdata.model.likelihood_inputs`."""
        return LikelihoodInputs(self.compiled, self.passes)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fns"] = {}  # recompiled lazily after unpickling (fast from the cache)
        return state

    # ------------------------------------------------------------------ graphs
    @cached_property
    def _curvature_point(self) -> pt.TensorVariable:
        return pt.vector("theta_curvature", dtype="float64")

    def _expansion(self, space: str):
        """The expansion's coordinates at a parameter graph, and the row log-likelihood
        graph at given coordinates: ``theta`` itself, or the likelihood inputs ``phi``."""
        model = self.compiled.graph
        if space == "parameters":
            return (lambda theta: theta), (
                lambda point: clone_replace(model.row_logp_graph, {model.theta: point})
            )
        if space != "likelihood_inputs":  # pragma: no cover - internal
            raise ValueError(space)
        inputs = self.likelihood_inputs
        if not inputs.available:
            raise ValueError(f"No expansion in the likelihood inputs: {inputs.reason}.")
        return inputs.coordinates, inputs.rows_at

    def _residual_graph(self, order: int, space: str) -> pt.TensorVariable:
        """``d_k(theta)`` per row, shape (n,)."""
        model = self.compiled.graph
        rows = model.row_logp_graph
        if order < 0:  # no control variate: l_k(theta) itself
            return rows
        coordinates, rows_at = self._expansion(space)
        star = coordinates(model.anchor)
        delta = coordinates(model.theta) - star
        residual = rows - rows_at(star)
        point, tangent = pt.vector("expansion_point"), pt.vector("expansion_tangent")
        slope = pushforward(rows_at(point), point, tangent)  # at a symbolic point, along Delta
        if order >= 1:
            residual = residual - graph_replace(slope, {point: star, tangent: delta})
        if order >= 2:
            curve = pushforward(slope, point, tangent)
            at_h = {point: coordinates(self._curvature_point), tangent: delta}
            residual = residual - 0.5 * graph_replace(curve, at_h)
        return residual

    @cached_property
    def _from_point(self) -> pt.TensorVariable:
        return pt.vector("theta_from", dtype="float64")

    def _inputs(self) -> list[pt.TensorVariable]:
        model = self.compiled.graph
        return [model.theta, model.anchor, self._curvature_point, *model.row_inputs]

    def _compiled(self, kind: str, order: int, space: str = "parameters") -> Function:
        key = (kind, order, space)
        if key not in self._fns:
            self._fns[key] = self._build(kind, order, space)
        return self._fns[key]

    def _build(self, kind: str, order: int, space: str) -> Function:
        model, compile_fn = self.compiled.graph, self.compiled.compile
        if kind.startswith("fused"):  # "fused <estimator> <dense|diagonal>"
            _, estimator, layout = kind.split()
            return self._build_fused(estimator, order, space, layout == "dense")
        d = self._residual_graph(order, space)
        if kind == "residuals":
            return compile_fn(self._inputs(), d)
        if kind == "differences":
            start = clone_replace(d, {model.theta: self._from_point})
            return compile_fn([*self._inputs(), self._from_point], d - start)
        prior = model.prior_graph
        census = pt.scalar("n_census", dtype="int64")
        sampled = d[census:]
        if kind == "perturbed":
            w = pt.scalar("w", dtype="float64")
            v = pt.scalar("v", dtype="float64")
            coefficient = w - v * (sampled - sampled.mean())
            extra = [w, v]
        elif kind == "block_poisson":
            w = pt.scalar("w", dtype="float64")
            m = pt.scalar("m", dtype="int64")
            a = pt.scalar("a", dtype="float64")
            groups = sampled.reshape((-1, m))
            totals = w * groups.sum(axis=1)
            coefficient = (w / (totals - a))[:, None] * pt.ones_like(groups)
            coefficient = coefficient.reshape((-1,))
            extra = [w, m, a]
        else:  # pragma: no cover - internal
            raise ValueError(kind)
        # census rows (always included) enter exactly: weight 1, no variance term
        coefficient = pt.concatenate([pt.ones_like(d[:census]), coefficient])
        objective = prior + (zero_grad(coefficient) * d).sum()
        inputs = [*self._inputs(), census, *extra]
        return compile_fn(inputs, [prior, d, grad(objective, model.theta)])

    def _build_fused(self, estimator: str, order: int, space: str, dense: bool) -> Function:
        """The whole estimate at ``z`` (:func:`~.estimate_graphs.estimate_graph`), compiled."""
        model = self.compiled.graph
        coordinates, _ = self._expansion(space)
        residuals = self._residual_graph(order, space)
        graph_in = (residuals, model.prior_graph, model.theta, model.anchor, coordinates)
        before, after, outputs = estimate_graph(estimator, order, dense, *graph_in)
        rows = [model.anchor, self._curvature_point, *model.row_inputs]
        return self.compiled.compile([*before, *rows, *after], outputs)

    # ------------------------------------------------------------------ calls
    @staticmethod
    def _points(anchor: Anchor, order: int) -> tuple[np.ndarray, np.ndarray]:
        if order == 2:
            if anchor.curvature_point is None or anchor.loglik_hessian is None:
                raise ValueError("Second-order control variates need an anchor with curvature.")
            return anchor.theta, anchor.curvature_point
        return anchor.theta, anchor.theta  # the curvature point is unused below order 2

    def residuals(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor,
        order: int,
        space: str = "parameters",
    ) -> np.ndarray:
        """``d_k(theta)`` of the given rows, shape (n,), with the expansion in ``space``
        (``"parameters"`` or ``"likelihood_inputs"``)."""
        star, point = self._points(anchor, order)
        return self._compiled("residuals", order, space)(theta, star, point, *rows)

    def differences(
        self,
        theta: np.ndarray,
        theta_from: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor | None,
        order: int,
    ) -> np.ndarray:
        """``d_k(theta) - d_k(theta_from)`` of the given rows, shape (n,): with ``anchor=None``
        the plain ``l_k(theta) - l_k(theta_from)``; order 0 gives the same without the
        anchor's row terms (computed, then cancelled), so prefer None for plain differences."""
        if anchor is None:
            fn = self._compiled("differences", -1)
            return fn(theta, theta, theta, *rows, theta_from)
        star, point = self._points(anchor, order)
        return self._compiled("differences", order)(theta, star, point, *rows, theta_from)

    def perturbed(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor,
        order: int,
        n_census: int = 0,
        pool: int | None = None,
        space: str = "parameters",
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """Log prior, residuals ``d`` and ``grad [log prior + sum_census d + (P/m) sum d -
        sigma_hat^2 / 2]`` for ``rows``: ``n_census`` census rows first (always included,
        weight 1), then ``m`` rows drawn uniformly with replacement from the ``pool`` of ``P``
        other rows (default all ``N``) (Eqs. 4.2, 4.3, 4.7)."""
        star, point = self._points(anchor, order)
        m = len(rows[0]) - n_census
        w = (self.compiled.graph.n_rows if pool is None else pool) / m
        fn = self._compiled("perturbed", order, space)
        census = np.asarray(n_census, dtype=np.int64)
        prior, d, g = fn(theta, star, point, *rows, census, _scalar(w), _scalar(w * w))
        return float(prior), d, g

    def block_poisson(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor,
        order: int,
        minibatch: int,
        lower_bound: float,
        n_census: int = 0,
        pool: int | None = None,
        space: str = "parameters",
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """Log prior, residuals ``d`` and ``grad [log prior + sum_census d + sum_g log |D_g -
        a|]``: ``n_census`` census rows first, then consecutive minibatches of ``minibatch``
        rows from the pool (Eq. 5.1's random part; ``D_g = (P/m) sum_g d``)."""
        star, point = self._points(anchor, order)
        w = (self.compiled.graph.n_rows if pool is None else pool) / minibatch
        fn = self._compiled("block_poisson", order, space)
        prior, d, g = fn(
            theta,
            star,
            point,
            *rows,
            np.asarray(n_census, dtype=np.int64),
            _scalar(w),
            np.asarray(minibatch, dtype=np.int64),
            _scalar(lower_bound),
        )
        return float(prior), d, g

    # ------------------------------------------------------------------ fused estimates
    @staticmethod
    def fusable(anchor: Anchor, order: int, space: str) -> bool:
        """Whether :meth:`perturbed_at_z` / :meth:`block_poisson_at_z` can take this anchor:
        not where the second-order sum's ``B`` is held sparse (large ``d``: a dense ``B`` in
        the graph would cost ``d^2`` per call), which the step-by-step path multiplies."""
        hessian = anchor.loglik_hessian
        return not (order == 2 and space == "parameters" and not isinstance(hessian, np.ndarray))

    def perturbed_at_z(self, at: EstimateAt) -> tuple[float, np.ndarray, float, float]:
        """The perturbed estimate's ``(log prior + log L_hat, its gradient in z, sigma_hat^2,
        sum of the sampled rows' d)`` at ``at``, one compiled call (Eqs. 4.1-4.5, 4.7)."""
        w = at.pool / (len(at.rows[0]) - at.n_census)
        fn = self._fused("perturbed", at)
        logp, grad_z, sigma2, total = fn(*self._fused_args(at), _scalar(w), _scalar(w * w))
        return float(logp), grad_z, float(sigma2), float(total)

    def block_poisson_at_z(
        self, at: EstimateAt, minibatch: int, lower_bound: float, products: int
    ) -> tuple[float, np.ndarray, int, float, float, float]:
        """The block-Poisson estimate's ``(log prior + log |L_hat|, its gradient in z, number
        of negative factors, the factor nearest zero, sum (d - mean d)^2, sum d)`` over the
        sampled rows at ``at``, with ``lambda = products`` factors (Eq. 5.1)."""
        extra = (
            _scalar(at.pool / minibatch),
            np.asarray(minibatch, dtype=np.int64),
            _scalar(lower_bound),
            _scalar(products),
        )
        fn = self._fused("signed", at)
        logp, grad_z, negatives, nearest, spread, total = fn(*self._fused_args(at), *extra)
        return float(logp), grad_z, int(negatives), float(nearest), float(spread), float(total)

    def _fused(self, estimator: str, at: EstimateAt) -> Function:
        layout = "dense" if at.linear_map[1].ndim == 2 else "diagonal"
        return self._compiled(f"fused {estimator} {layout}", at.order, at.space)

    def _fused_args(self, at: EstimateAt) -> tuple:
        """The fused function's arguments up to the estimator's own."""
        star, point = self._points(at.anchor, at.order)
        sums = self._known_sums(at.anchor, at.order, at.space)
        census = np.asarray(at.n_census, dtype=np.int64)
        return (at.z, *at.linear_map, star, point, *at.rows, census, *sums)

    def _known_sums(self, anchor: Anchor, order: int, space: str) -> tuple[np.ndarray, ...]:
        """``(l(theta*), A, B)`` of :func:`control_variate_sum`, as the fused graph reads them
        (kept for the last anchor; unused ones empty)."""
        cached = self._last_sums
        if cached is not None and cached[0] is anchor and cached[1] == (order, space):
            return cached[2]
        slope, curvature = np.zeros(0), np.zeros((0, 0))
        if order >= 1 and space == "likelihood_inputs":
            inputs = self.likelihood_inputs.anchor(anchor, order)
            slope, curvature = inputs.loglik_grad, inputs.loglik_hessian
        elif order >= 1:
            slope = anchor.loglik_grad
            curvature = anchor.loglik_hessian if order >= 2 else curvature
        sums = (
            _scalar(anchor.loglik),
            np.ascontiguousarray(slope, dtype=np.float64),
            np.ascontiguousarray(curvature, dtype=np.float64),
        )
        self._last_sums = (anchor, (order, space), sums)
        return sums


def control_variate_sum(
    theta: np.ndarray,
    anchor: Anchor,
    order: int,
    space: str = "parameters",
    layer: HasLikelihoodInputs | None = None,
) -> tuple[float, np.ndarray]:
    """``sum_k q_k(theta)`` over all rows and its gradient, from the anchor's full-data sums:
    ``l(theta*) + A . delta + 1/2 delta' B delta`` and ``A + B delta`` (up to ``order``).

    With ``space="likelihood_inputs"`` the expansion is in ``phi`` and the sums in ``phi``
    come from ``layer`` (:meth:`~pymc_bigdata.model.likelihood_inputs.LikelihoodInputs.anchor`).
    """
    if space == "likelihood_inputs":
        if layer is None:
            raise ValueError("The expansion in the likelihood inputs needs the layer.")
        return layer.likelihood_inputs.control_variate_sum(theta, anchor, order)
    value = float(anchor.loglik)
    gradient = np.zeros_like(theta)
    if order >= 1:
        delta = theta - anchor.theta
        value += float(anchor.loglik_grad @ delta)
        gradient = gradient + anchor.loglik_grad
        if order >= 2:
            curved = anchor.loglik_hessian @ delta
            value += 0.5 * float(delta @ curved)
            gradient = gradient + curved
    return value, np.asarray(gradient, dtype=np.float64)


def _scalar(value: float) -> np.ndarray:
    """A 0-d float64 array (the compiled functions trust their inputs' types)."""
    return np.asarray(value, dtype=np.float64)
