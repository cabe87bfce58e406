"""The one layer between a PyMC model and the samplers.

:class:`MinibatchModel` reads a PyMC model whose likelihood factorises over rows and gives
the samplers, with the minibatch's rows as inputs: the log prior, minibatch estimates of the
log posterior and its gradient (plain, or with first- or second-order control variates),
per-row terms, directional derivatives and gradients, Hessian-vector products and Hessians;
their full-data versions in row chunks; the MAP and Laplace fit; control-variate anchors.
It composes the pieces of :mod:`pymc_bigdata.model`: the graphs (:mod:`.graph`), the
compiled functions (:mod:`.compiled`), the full-data passes (:mod:`.passes`), the Laplace
fit (:mod:`.laplace`), the anchors (:mod:`.anchor`) and HMC-ECS's difference terms.
Everything is compiled lazily, once per layer, and shared by every sampler built on it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np
import pymc as pm
import pytensor
from pytensor.graph.basic import Variable

from pymc_bigdata.model.anchor import Anchor, anchor_at, map_anchor
from pymc_bigdata.model.bulk_fit import BulkReading
from pymc_bigdata.model.compiled import CompiledModel
from pymc_bigdata.model.difference_terms import DifferenceTerms
from pymc_bigdata.model.graph import ModelGraph
from pymc_bigdata.model.laplace import MapResult, find_map
from pymc_bigdata.model.likelihood_inputs import LikelihoodInputs
from pymc_bigdata.model.passes import (
    DEFAULT_CHUNK_ROWS,
    DIAGONAL_PROBES,
    FullDataPasses,
    select_influential,
)

__all__ = ["MinibatchModel"]


class MinibatchModel:
    """Compiled minibatch quantities of a PyMC model whose likelihood factorises over rows.

    Parameters
    ----------
    model
        The PyMC model (default: the one in context).
    vars
        Value variables to sample (default: all of the model's free variables). The other
        free variables are *held*: fixed inputs of every compiled function, set with
        :meth:`hold` (a compound step's other steps move them).
    mode
        PyTensor compile mode (default: PyTensor's default, Numba).
    chunk_rows
        Rows per block in full-data passes.
    discrete
        Sample discrete (binary) variables instead of continuous ones: ``vars`` must then be
        discrete, and only the gradient-free quantities (per-row terms, the log prior) are
        used (:class:`~pymc_bigdata.AusterityGibbs`).

    Attributes
    ----------
    graph : ModelGraph
        The row log-likelihood and log-prior graphs; its ``theta``, ``value_vars``,
        ``held_vars``, ``dim``, ``n_rows``, ``rows``, ``row_inputs``... are also the layer's.
    compiled : CompiledModel
        The compiled functions.
    passes : FullDataPasses
        The full-data passes in chunks of :attr:`chunk_rows` rows.

    Notes
    -----
    ``theta`` everywhere is the flat vector of the value variables in the order of
    ``vars`` (the order ``DictToArrayBijection`` uses in a step method).
    """

    def __init__(
        self,
        model: pm.Model | None = None,
        vars: list[Variable] | None = None,
        mode: str | pytensor.compile.Mode | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        discrete: bool = False,
    ):
        self.model = pm.modelcontext(model)
        self.mode = mode
        self.discrete = bool(discrete)
        self._assemble(ModelGraph(self.model, vars, self.discrete), chunk_rows)
        #: the layer in the model's own coordinates that this one was derived from (itself
        #: unless built by :meth:`reparameterised`)
        self.model_layer = self

    def _assemble(self, graph: ModelGraph, chunk_rows: int) -> None:
        self.graph = graph
        self.compiled = CompiledModel(graph, self.mode)
        self.passes = FullDataPasses(self.compiled, chunk_rows)
        self.value_vars, self.held_vars = graph.value_vars, graph.held_vars
        self.var_shapes, self.var_sizes, self.dim = graph.var_shapes, graph.var_sizes, graph.dim
        self.held_values = graph.held_values
        self.n_rows, self.rows, self.row_inputs = graph.n_rows, graph.rows, graph.row_inputs
        self.theta, self.anchor, self.direction = graph.theta, graph.anchor, graph.direction
        self.row_logp_graph, self.prior_graph = graph.row_logp_graph, graph.prior_graph
        #: the map from this layer's coordinates to the model's (None: the model's own),
        #: and vectors mapped each way (:meth:`ModelGraph.to_model`, ``from_model``)
        self.reparam = graph.reparam
        self.to_model, self.from_model = graph.to_model, graph.from_model
        self._map_results: dict[bytes, MapResult] = {}
        self._derived: dict[str, MinibatchModel] = {}
        self.bulk: BulkReading | None = None  #: the group fits' bulk (``sampling_layer``'s)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_derived": {}}  # derived layers are not carried along

    def derived(self, key: str, build: Callable[[], MinibatchModel]) -> MinibatchModel:
        """``build()`` (a deterministic layer, e.g. :func:`~pymc_bigdata.step_methods.
        coordinates.sampling_layer`'s), once per ``key``, shared by every step on this layer."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    @property
    def initial_theta(self) -> np.ndarray:
        """The model's initial point, raveled in this layer's coordinates."""
        return self.graph.initial_theta

    def reparameterised(self, reparam) -> MinibatchModel:
        """A layer over the same model and rows in the coordinates ``phi`` of ``reparam``
        (e.g. :class:`~pymc_bigdata.model.reparam.LocScaleReparams`): every quantity (the
        MAP, the Laplace fit, the estimates) is then of ``phi``'s density;
        :meth:`to_model` and :meth:`from_model` map vectors between the two."""
        new = object.__new__(MinibatchModel)
        new.model, new.mode, new.discrete = self.model, self.mode, self.discrete
        new._assemble(self.graph.reparameterised(reparam), self.chunk_rows)
        new.model_layer = self
        return new

    @property
    def chunk_rows(self) -> int:
        """Rows per block in full-data passes."""
        return self.passes.chunk_rows

    @chunk_rows.setter
    def chunk_rows(self, value: int) -> None:
        self.passes.chunk_rows = int(value)

    @cached_property
    def difference_terms(self) -> DifferenceTerms:
        """Per-row Taylor residuals and difference-estimator gradients (HMC-ECS), compiled
        lazily; see :mod:`pymc_bigdata.model.difference_terms`."""
        return DifferenceTerms(self.compiled, self.passes)

    @property
    def likelihood_inputs(self) -> LikelihoodInputs:
        """The parameter-only tensors the row log-likelihood reads (``phi(theta)``), found
        lazily; see :mod:`pymc_bigdata.model.likelihood_inputs`."""
        return self.difference_terms.likelihood_inputs

    # ------------------------------------------------------------------ labels and rows
    def coordinate_label(self, index: int) -> str:
        """``name[i, j]`` of the raveled parameter vector's ``index``-th coordinate."""
        return self.graph.coordinate_label(index)

    def value_var_slices(self) -> list[tuple[str, slice, tuple[int, ...]]]:
        """``(name, slice of the raveled vector, shape)`` of every value variable."""
        return self.graph.value_var_slices()

    def take_rows(self, row_indices: np.ndarray) -> list[np.ndarray]:
        """Rows of every data array for the given indices (through the row source)."""
        return self.rows.take(row_indices)

    def data_is_current(self) -> bool:
        """False when ``pm.set_data`` (or ``set_value``) replaced a row array since the
        layer read it: the layer's rows, N and anchors would then be stale."""
        return self.graph.data_is_current()

    # ------------------------------------------------------------------ minibatch quantities
    def prior_logp(self, theta: np.ndarray) -> float:
        """Log prior (with Jacobians of the transforms), without its gradient (what a
        discrete step needs)."""
        return self.compiled.prior_logp(theta)

    def prior_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior (with Jacobians of the transforms) and its gradient."""
        return self.compiled.prior_logp_grad(theta)

    def loglik_grad(self, theta: np.ndarray, rows: list[np.ndarray]) -> tuple[float, np.ndarray]:
        """Summed log-likelihood of the given rows and its gradient."""
        return self.compiled.loglik_grad(theta, rows)

    def uniform_weights(self, n: int) -> np.ndarray:
        """``N/n`` for each of ``n`` rows: the weights of a uniform minibatch."""
        return np.full(n, self.n_rows / n)

    def estimate_logp_grad(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor | None = None,
        weights: np.ndarray | None = None,
    ) -> tuple[float, np.ndarray]:
        """:meth:`estimate_logp` and :meth:`estimate_grad` from one compiled call.

        ``weights`` (default ``N/n`` each) are the rows' inverse inclusion probabilities; a
        census row (always included) has weight 1.
        """
        weights = self.uniform_weights(len(rows[0])) if weights is None else weights
        if anchor is None:
            lp, g = self.compiled.logp_grad_est_fn(theta, *rows, weights)
            return float(lp), g
        lp, g = self.compiled.cv_logp_grad_fn(theta, anchor.theta, *rows, weights)
        return float(lp) + anchor.loglik, g + anchor.loglik_grad

    def estimate_second_order_grad_parts(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor,
        weights: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`estimate_second_order_parts` without the log-density value (cheaper)."""
        weights = self.uniform_weights(len(rows[0])) if weights is None else weights
        g, row_curvature = self.compiled.cv2_grad_parts_fn(
            theta, anchor.theta, anchor.curvature_point, *rows, weights
        )
        return g + anchor.loglik_grad, row_curvature

    def estimate_second_order_parts(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor,
        weights: np.ndarray | None = None,
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """First-order control-variate estimates and the second-order correction's pieces.

        Returns ``(logp, grad_first, row_curvature)``: ``grad_first`` is the first-order
        estimate :meth:`estimate_grad` with ``anchor``, and ``row_curvature`` is
        ``sum_i w_i H_i(theta_h) (theta - theta*)`` over the given rows, where ``H_i`` is
        row i's log-likelihood Hessian at the anchor's curvature point ``theta_h``.  The
        second-order (Taylor) estimate is
        ``grad_first - row_curvature + anchor.loglik_hessian @ (theta - theta*)``
        (:meth:`Anchor.second_order`): unbiased for any ``theta_h``, and exact (no noise at
        all) when every row's log-likelihood is quadratic, as in a Gaussian linear model.
        """
        if anchor.loglik_hessian is None:
            raise ValueError("This anchor has no curvature (loglik_hessian) for second order.")
        weights = self.uniform_weights(len(rows[0])) if weights is None else weights
        lp, g, row_curvature = self.compiled.cv2_parts_fn(
            theta, anchor.theta, anchor.curvature_point, *rows, weights
        )
        return float(lp) + anchor.loglik, g + anchor.loglik_grad, row_curvature

    def estimate_grad(
        self,
        theta: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor | None = None,
        weights: np.ndarray | None = None,
    ) -> np.ndarray:
        """Unbiased minibatch estimate of the gradient of the log posterior.

        Without an anchor: ``grad prior + (N/n) sum_i grad l_i(theta)``.  With the
        control-variate anchor ``theta*``: ``grad prior + grad L(theta*) +
        (N/n) sum_i [grad l_i(theta) - grad l_i(theta*)]``, whose variance vanishes as
        ``theta -> theta*``.
        """
        weights = self.uniform_weights(len(rows[0])) if weights is None else weights
        if anchor is None:
            return self.compiled.grad_fn(theta, *rows, weights)
        return self.compiled.cv_grad_fn(theta, anchor.theta, *rows, weights) + anchor.loglik_grad

    def estimate_logp(
        self, theta: np.ndarray, rows: list[np.ndarray], anchor: Anchor | None = None
    ) -> float:
        """Unbiased minibatch estimate of the log posterior (with control variates if anchored)."""
        weights = self.uniform_weights(len(rows[0]))
        if anchor is None:
            return float(self.compiled.logp_est_fn(theta, *rows, weights))
        lp = self.compiled.cv_logp_est_fn(theta, anchor.theta, *rows, weights)
        return float(lp) + anchor.loglik

    def row_logp(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row log-likelihood terms ``l_i(theta)``, shape (n,)."""
        return self.compiled.row_logp(theta, rows)

    def row_directional_derivatives(
        self, theta: np.ndarray, direction: np.ndarray, rows: list[np.ndarray]
    ) -> np.ndarray:
        """``direction . grad l_i(theta)`` for every given row, shape (n,), by forward mode."""
        return self.compiled.row_directional_derivatives(theta, direction, rows)

    def directional_parts_and_grad(
        self,
        theta: np.ndarray,
        direction: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor | None = None,
        weights: np.ndarray | None = None,
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """The pieces of a minibatch estimate of ``direction . grad log p(theta)``, and
        :meth:`estimate_grad` on the same rows and ``weights``, in one compiled call.

        Returns the log prior's directional derivative (with the transforms' Jacobians),
        per row ``u . grad l_i(theta)`` or with an anchor ``u . [grad l_i(theta) -
        grad l_i(theta*)]`` (the caller weights and sums them, adds ``u . anchor.loglik_grad``,
        has their spread for the noise), and the gradient estimate (SBPS's bounces need it).
        """
        u = np.asarray(direction, dtype=np.float64)
        weights = self.uniform_weights(len(rows[0])) if weights is None else weights
        anchored = () if anchor is None else (anchor.theta,)
        fn = self.compiled.directional_grad_fns[anchor is not None]
        prior, per_row, gradient = fn(theta, *anchored, u, *rows, weights)
        return float(prior), per_row, gradient + (0.0 if anchor is None else anchor.loglik_grad)

    def row_gradients(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row gradients ``grad l_i(theta)``, shape (n, d)."""
        return self.compiled.row_grads_fn(theta, *rows)

    def loglik_hvp(
        self, theta: np.ndarray, direction: np.ndarray, rows: list[np.ndarray]
    ) -> np.ndarray:
        """Hessian-vector product of the summed log-likelihood of the given rows."""
        return self.compiled.hvp_fn(theta, np.asarray(direction, dtype=np.float64), *rows)

    def loglik_hessian(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Dense Hessian (d, d) of the summed log-likelihood of the given rows."""
        return self.compiled.loglik_hessian(theta, rows)

    def prior_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Dense Hessian (d, d) of the log prior."""
        return self.compiled.prior_hessian(theta)

    # ------------------------------------------------------------------ full data
    def full_loglik_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data summed log-likelihood and gradient, computed in row chunks."""
        return self.passes.full_loglik_grad(theta)

    def full_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data log posterior and its gradient (chunked)."""
        return self.passes.full_logp_grad(theta)

    def full_loglik_hvp(self, theta: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """Full-data Hessian-vector product of the summed log-likelihood (chunked)."""
        return self.passes.full_loglik_hvp(theta, direction)

    def full_loglik_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Full-data dense Hessian of the summed log-likelihood (chunked, bounded memory)."""
        return self.passes.full_loglik_hessian(theta)

    def full_loglik_hessian_diagonal(
        self, theta: np.ndarray, n_probes: int = DIAGONAL_PROBES, seed: int = 0
    ) -> np.ndarray:
        """Hutchinson estimate of the diagonal of the full-data log-likelihood Hessian from
        ``n_probes`` HVP passes (:meth:`FullDataPasses.full_loglik_hessian_diagonal`)."""
        return self.passes.full_loglik_hessian_diagonal(theta, n_probes, seed)

    def row_influence(self, theta: np.ndarray, directions: list[np.ndarray]) -> np.ndarray:
        """How much each row's gradient moves along typical steps away from ``theta``.

        ``mean_k |D_v l_i(theta + v_k) - D_v l_i(theta)|`` over the given directions ``v_k``
        (typical posterior displacements, e.g. ``L u`` with ``u ~ N(0, I)``): the size of
        row i's first-order control-variate residual, in log-density units.  Rows whose
        value is far above the mean dominate a uniform minibatch's gradient noise.
        Two forward passes per direction, in one streamed pass over the data; the result
        has N entries (:meth:`influential_rows` keeps only the few that stand out).
        """
        chunks = self.passes.influence_chunks(theta, directions)
        return np.concatenate([part for _, part in chunks])

    def influential_rows(
        self, theta: np.ndarray, directions: list[np.ndarray], factor: float, cap: int
    ) -> np.ndarray:
        """Rows whose :meth:`row_influence` exceeds ``factor`` times its mean over the rows
        (non-finite influence counts as infinite), at most the ``cap`` largest, sorted; one
        streamed pass of bounded memory (:func:`~pymc_bigdata.model.passes.select_influential`)."""
        return select_influential(self.passes.influence_chunks(theta, directions), factor, cap)

    def anchor_with_census(
        self,
        theta: np.ndarray,
        curvature_from: Anchor | None,
        directions: list[np.ndarray],
        factor: float,
        cap: int,
    ) -> tuple[Anchor, np.ndarray]:
        """:meth:`anchor_at` ``theta`` and :meth:`influential_rows` there, from one read of
        the rows (:meth:`FullDataPasses.loglik_grad_and_influential`)."""
        theta = np.asarray(theta, dtype=np.float64)
        loglik, loglik_grad, rows = self.passes.loglik_grad_and_influential(
            theta, directions, factor, cap
        )
        anchor = anchor_at(theta, lambda _: (loglik, loglik_grad), curvature_from)
        return anchor, rows

    # ------------------------------------------------------------------ the Laplace fit
    def find_map(self, start: np.ndarray | None = None, maxiter: int = 500) -> MapResult:
        """Maximise the full-data log posterior; the Laplace precision at the mode and its
        diagnostics (:func:`pymc_bigdata.model.laplace.find_map`, :attr:`MapResult.problem`)."""
        return find_map(self.passes, start, maxiter)

    def map_estimate(self, start: np.ndarray | None = None) -> MapResult:
        """:meth:`find_map` (from ``start``, default the model's initial point), computed once
        per value of the held variables and shared.

        Runs :meth:`check_row_factorisation` first.
        """
        key = self.held_key if self.reparam is None else self.held_key + self.reparam.key()
        if key not in self._map_results:
            self.check_row_factorisation()
            self._map_results[key] = self.find_map(start)
        return self._map_results[key]

    def check_row_factorisation(
        self, theta: np.ndarray | None = None, gradient_free: bool = False
    ) -> None:
        """Refuse rows' terms that read other rows (``passes.check_row_factorisation``)."""
        self.passes.check_row_factorisation(theta, gradient_free)

    def map_anchor(self) -> Anchor:
        """The control-variate anchor at the (cached) MAP, with its curvature when dense."""
        return map_anchor(self.map_estimate())

    def anchor_at(self, theta: np.ndarray, curvature_from: Anchor | None = None) -> Anchor:
        """A control-variate anchor at ``theta`` (one full-data gradient pass), keeping the
        curvature of ``curvature_from`` (:func:`~pymc_bigdata.model.anchor.anchor_at`)."""
        return anchor_at(theta, self.full_loglik_grad, curvature_from)

    # ------------------------------------------------------------------ held variables
    def held_from_point(self, point: dict[str, np.ndarray]) -> np.ndarray:
        """The held variables' values in ``point``, raveled as :attr:`held_values`."""
        return self.graph.held_from_point(point)

    def hold(self, values: np.ndarray) -> bool:
        """Set the held variables (raveled); returns whether they changed."""
        return self.graph.hold(values)

    @property
    def held_key(self) -> bytes:
        """A key of the held variables' current values (the MAP and anchors depend on them)."""
        return self.graph.held_key
