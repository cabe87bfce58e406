"""The one layer between a PyMC model and the samplers.

:class:`MinibatchModel` reads a PyMC model whose likelihood factorises over rows, takes its
row-axis data out of the graph and compiles, with the minibatch's rows as inputs:

* the log prior and its gradient;
* the summed log-likelihood of given rows and its gradient (minibatch estimate of the log
  posterior = prior + (N/n) * sum of rows);
* the control-variate estimate, sum_i [l_i(theta) - l_i(theta*)] and its gradient;
* per-row log-likelihood terms ``l_i(theta)``;
* per-row directional derivatives ``v . grad l_i(theta)`` (one forward-mode pass);
* per-row gradients (n x d) as a batch of forward-mode passes, one per coordinate;
* Hessian-vector products and the dense Hessian of the summed log-likelihood;
* full-data versions computed in row chunks (bounded memory), and a MAP finder.

PyMC bakes the observed row count into a model (the observed variable's size and the
shape of its value), so the layer rebuilds each observed variable with the minibatch's
size (``change_dist_size``), points its parameters at minibatch inputs and at the free
variables' values, and takes ``pm.logp`` of it at a symbolic value.  Everything is compiled
lazily, once per layer, and shared by every sampler built on it.
"""

from __future__ import annotations

import math
import os
import uuid
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import scipy.linalg
import scipy.optimize
import scipy.sparse
from pymc.data import MinibatchOp
from pymc.distributions.shape_utils import change_dist_size
from pymc.logprob.utils import ParameterValueError, replace_rvs_by_values
from pymc.variational.minibatch_rv import MinibatchRandomVariable
from pytensor.gradient import grad, pushforward
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace, graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from pytensor.scalar import Cast
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.type import RandomType
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.data import row_column
from pymc_bigdata.difference_terms import DifferenceTerms
from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.likelihood_inputs import LikelihoodInputs
from pymc_bigdata.rows import RowSource, check_batch_size

__all__ = ["MapResult", "MinibatchModel"]

#: rows per chunk in full-data passes (keeps memory bounded; ~2 MB per float array column)
DEFAULT_CHUNK_ROWS = 65_536

#: up to this many parameters the full-data Hessian is computed densely (memory d^2 doubles,
#: time ~ N d forward passes); beyond, only a stochastic estimate of its diagonal
DENSE_HESSIAN_MAX_DIM = 2_000

#: up to this many parameters the MAP search also computes the Hessian at the mode itself
DENSE_PRECONDITIONER_DIM = 200

#: rows x basis directions per block when the Hessian is computed by batched HVPs (8 MB)
HESSIAN_BLOCK_ELEMENTS = 2**20

#: Rademacher probes for the Hessian diagonal when d > DENSE_HESSIAN_MAX_DIM
DIAGONAL_PROBES = 32

#: a MAP whose Newton decrement exceeds this (log-density units) is not a mode
MAP_DECREMENT_TOLERANCE = 1e-3

#: smallest eigenvalue of the Laplace precision relative to its largest for a usable mode
MIN_RELATIVE_CURVATURE = 1e-12


@dataclass(frozen=True)
class MapResult:
    """A MAP estimate with the curvature of the log posterior there.

    Attributes
    ----------
    theta : ndarray, shape (d,)
        The maximiser of the log posterior (unconstrained space).
    logp : float
        The log posterior at ``theta``.
    loglik_grad : ndarray, shape (d,)
        Full-data gradient of the summed log-likelihood at ``theta`` (the control-variate anchor).
    loglik : float
        Full-data summed log-likelihood at ``theta``.
    hessian : ndarray, shape (d, d) or (d,)
        Negative Hessian of the log posterior at ``theta`` (the Laplace precision); only its
        diagonal (shape (d,), a stochastic estimate) when ``d > DENSE_HESSIAN_MAX_DIM``.
    n_evaluations : int
        Full-data passes the optimiser made.
    loglik_hessian : ndarray, shape (d, d), or None
        Full-data Hessian of the summed log-likelihood at ``hessian_point`` (the second-order
        control variates' curvature); None when ``d > DENSE_HESSIAN_MAX_DIM``.
    hessian_point : ndarray, shape (d,), or None
        Where ``loglik_hessian`` was computed: ``theta`` up to ``DENSE_PRECONDITIONER_DIM``
        parameters; beyond, the subsample optimum from which Newton started (one full-data
        Hessian instead of two; ``hessian`` is then the Laplace precision to that accuracy).
    newton_decrement : float
        ``g^T H^{-1} g`` at ``theta`` (twice the log-density gap to the quadratic model's
        mode); near 0 at a mode, ``inf`` when ``H`` is not positive definite.
    min_curvature : float
        Smallest eigenvalue of ``H`` relative to its largest (diagonal: smallest entry ratio).
    """

    theta: np.ndarray
    logp: float
    loglik_grad: np.ndarray
    loglik: float
    hessian: np.ndarray
    n_evaluations: int
    loglik_hessian: np.ndarray | None = None
    hessian_point: np.ndarray | None = None
    newton_decrement: float = 0.0
    min_curvature: float = 1.0

    @property
    def dense(self) -> bool:
        """Whether :attr:`hessian` is the dense matrix (not only its diagonal)."""
        return self.hessian.ndim == 2

    @property
    def problem(self) -> str | None:
        """Why this point is not a usable mode for a Laplace fit, or None if it is.

        A mode needs a positive definite curvature and a vanishing Newton step: the search
        stopped at most ``MAP_DECREMENT_TOLERANCE`` (in log density) from the quadratic
        model's maximum.  A centred hierarchical model whose density grows without bound as a
        scale parameter goes to 0 fails the first or the second test.
        """
        if not np.isfinite(self.logp):
            return "the log posterior is not finite there"
        if not self.min_curvature > MIN_RELATIVE_CURVATURE:
            return (
                "the log posterior's Hessian is not negative definite there (relative "
                f"smallest curvature {self.min_curvature:.3g})"
            )
        if not self.newton_decrement <= MAP_DECREMENT_TOLERANCE:
            return (
                "the search did not reach a stationary point (Newton decrement "
                f"{self.newton_decrement:.3g}): the density may grow without bound towards a "
                "boundary, e.g. a scale parameter going to 0 in a centred hierarchical model"
            )
        return None


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
        self.chunk_rows = int(chunk_rows)
        self.discrete = bool(discrete)
        self.value_vars = _check_vars(self.model, vars, self.discrete)
        self.held_vars = [v for v in self.model.value_vars if v not in self.value_vars]
        initial_point = self.model.initial_point()
        self.var_shapes = [initial_point[v.name].shape for v in self.value_vars]
        self.var_sizes = [int(np.prod(s)) for s in self.var_shapes]
        self.dim = int(sum(self.var_sizes))
        self.initial_theta = _flat(initial_point, self.value_vars)
        self.held_shapes = [initial_point[v.name].shape for v in self.held_vars]
        self.held_values = pytensor.shared(_flat(initial_point, self.held_vars), "held_values")
        self._map_results: dict[bytes, MapResult] = {}
        self._build_graphs()

    # ------------------------------------------------------------------ graph building
    def _build_graphs(self) -> None:
        model = self.model
        observed = list(model.observed_RVs)
        if not observed:
            raise ModelNotSupportedError(
                "The model has no observed variables: there are no rows to subsample. "
                "Pass data with observed=... or use pm.sample's default samplers."
            )
        _check_no_missing_values(model)
        stripped_values = {rv: _strip_minibatch(model.rvs_to_values[rv]) for rv in observed}
        self.n_rows = _common_row_count(stripped_values)
        row_vars, canonical = _find_row_data(model, observed, stripped_values, self.n_rows)
        row_names = _row_names(row_vars, observed, stripped_values)
        _check_free_vars_not_per_row(model, self.n_rows)

        self.theta = pt.vector("theta", dtype="float64")
        self.anchor = pt.vector("theta_anchor", dtype="float64")
        self.direction = pt.vector("direction", dtype="float64")
        value_of = self._unravel(self.theta)

        row_inputs = [
            pt.tensor(f"rows_{i}", dtype=v.dtype, shape=(None, *v.type.shape[1:]))
            for i, v in enumerate(row_vars)
        ]
        input_of = dict(zip(row_vars, row_inputs))
        data_to_rows = {var: input_of[canon] for var, canon in canonical.items()}
        _check_deterministics_not_per_row(model, canonical, row_names, row_vars, self.n_rows)
        arrays = [_row_array(v) for v in row_vars]
        self._data_snapshot = [
            (v, _data_value(v))
            for v in _data_vars(model)
            if isinstance(v, TensorSharedVariable) and row_column(v) is None
        ]
        self.rows = RowSource(arrays, row_names, dtypes=[v.dtype for v in row_vars])
        _check_finite_rows(self.rows)
        self.row_inputs = row_inputs

        row_terms = []
        free_rvs_to_values = {rv: model.rvs_to_values[rv] for rv in model.free_RVs}
        for rv in observed:
            row_terms.append(
                self._per_row_logp(rv, stripped_values[rv], data_to_rows, free_rvs_to_values)
            )
        row_logp = row_terms[0]
        for term in row_terms[1:]:
            row_logp = row_logp + term
        self.row_logp_graph = graph_replace(row_logp, value_of, strict=False)

        prior_terms = [*model.logp(vars=model.free_RVs, sum=False, jacobian=True)]
        for pot in model.potentials:
            if any(a in canonical for a in ancestors([pot])):
                raise ModelNotSupportedError(
                    f"Potential {pot.name!r} depends on row data, so the likelihood does not "
                    "factor over rows; write it as an observed variable instead."
                )
            prior_terms.append(pt.sum(model.replace_rvs_by_values([pot])[0]))
        prior = pt.sum([pt.sum(t) for t in prior_terms])
        self.prior_graph = graph_replace(prior, value_of, strict=False)

    def _unravel(self, theta: pt.TensorVariable) -> dict[Variable, pt.TensorVariable]:
        """Map each sampled value variable to its slice of the flat ``theta``, and each held
        one to its slice of the shared ``held_values``."""
        replacements = _slices(theta, self.value_vars, self.var_shapes)
        replacements.update(_slices(self.held_values, self.held_vars, self.held_shapes))
        return replacements

    def _per_row_logp(self, rv, value, data_to_rows, free_rvs_to_values) -> pt.TensorVariable:
        """Rebuild ``rv`` on minibatch inputs and return its per-row log-likelihood (n,)."""
        name = rv.name
        if isinstance(rv.owner.op, MinibatchRandomVariable):  # total_size wrapper: we rescale
            rv = rv.owner.inputs[0]
        ndim_supp = getattr(rv.owner.op, "ndim_supp", 0)
        if rv.ndim - ndim_supp < 1:
            raise ModelNotSupportedError(
                f"Observed variable {name!r} has its row axis inside one multivariate "
                f"draw ({type(rv.owner.op).__name__} over all rows), so its likelihood does not "
                "factor over rows. Subsampling needs independent rows given the parameters."
            )
        value_rows = data_to_rows[value]
        batch_shape = [value_rows.shape[i] for i in range(rv.ndim - ndim_supp)]
        try:
            resized = change_dist_size(rv, new_size=batch_shape, expand=False)
        except NotImplementedError as exc:
            raise ModelNotSupportedError(
                f"Observed variable {name!r} ({type(rv.owner.op).__name__}) cannot be "
                f"resized to a minibatch: {exc}"
            ) from exc
        [resized] = replace_rvs_by_values(
            [resized],
            rvs_to_values=free_rvs_to_values,
            rvs_to_transforms=self.model.rvs_to_transforms,
        )
        # rebuild_strict=False re-infers every type, so no static row count survives
        replacements = {
            out: data_to_rows.get(full, full)
            for out, full in _minibatch_replacements(resized).items()
        }
        replacements.update(data_to_rows)
        resized = clone_replace(resized, replacements, rebuild_strict=False)
        elementwise = pm.logp(resized, value_rows, warn_rvs=False)
        if elementwise.ndim > 1:
            elementwise = elementwise.sum(axis=tuple(range(1, elementwise.ndim)))
        return elementwise

    # ------------------------------------------------------------------ compilation
    def _compile(self, inputs, outputs) -> pytensor.compile.function.types.Function:
        fn = pytensor.function(
            inputs, outputs, mode=self.mode, on_unused_input="ignore", trust_input=False
        )
        fn.trust_input = True
        return fn

    @cached_property
    def _prior_logp_grad_fn(self):
        prior = self.prior_graph
        return self._compile([self.theta], [prior, grad(prior, self.theta)])

    @cached_property
    def _loglik_grad_graphs(self) -> tuple[list, list]:
        total = self.row_logp_graph.sum()
        return [self.theta, *self.row_inputs], [total, grad(total, self.theta)]

    @cached_property
    def _loglik_grad_fn(self):
        return self._compile(*self._loglik_grad_graphs)

    def _chunk_function(self, name: str) -> ChunkFunction:
        """The compiled ``_<name>_fn`` with its graphs, to reduce over row blocks anywhere
        (a dask worker compiles it from the graphs, once)."""
        cache = self.__dict__.setdefault("_chunk_functions", {})
        if name not in cache:
            cache[name] = ChunkFunction(
                *getattr(self, f"_{name}_graphs"), self.mode, getattr(self, f"_{name}_fn")
            )
        return cache[name]

    @cached_property
    def _weights(self) -> pt.TensorVariable:
        """Per-row weights of a minibatch sum (N/n for a uniform sample)."""
        return pt.vector("row_weights", dtype="float64")

    @cached_property
    def _anchor_row_logp_graph(self) -> pt.TensorVariable:
        return clone_replace(self.row_logp_graph, {self.theta: self.anchor})

    def _estimate_graph(self, control_variates: bool) -> pt.TensorVariable:
        """prior + sum_i w_i l_i, or with control variates prior + sum_i w_i [l_i - l_i*]."""
        rows = self.row_logp_graph
        if control_variates:
            rows = rows - self._anchor_row_logp_graph
        return self.prior_graph + (self._weights * rows).sum()

    def _estimate_grad_graph(self, control_variates: bool) -> pt.TensorVariable:
        weights = self._weights
        g = grad(self.prior_graph, self.theta) + grad(
            (weights * self.row_logp_graph).sum(), self.theta
        )
        if control_variates:
            g = g - grad((weights * self._anchor_row_logp_graph).sum(), self.anchor)
        return g

    def _estimate_inputs(self, control_variates: bool) -> list[pt.TensorVariable]:
        anchor = [self.anchor] if control_variates else []
        return [self.theta, *anchor, *self.row_inputs, self._weights]

    @cached_property
    def _grad_fn(self):
        return self._compile(self._estimate_inputs(False), self._estimate_grad_graph(False))

    @cached_property
    def _cv_grad_fn(self):
        return self._compile(self._estimate_inputs(True), self._estimate_grad_graph(True))

    @cached_property
    def _logp_est_fn(self):
        return self._compile(self._estimate_inputs(False), self._estimate_graph(False))

    @cached_property
    def _cv_logp_est_fn(self):
        return self._compile(self._estimate_inputs(True), self._estimate_graph(True))

    @cached_property
    def _logp_grad_est_fn(self):
        outputs = [self._estimate_graph(False), self._estimate_grad_graph(False)]
        return self._compile(self._estimate_inputs(False), outputs)

    @cached_property
    def _cv_logp_grad_fn(self):
        outputs = [self._estimate_graph(True), self._estimate_grad_graph(True)]
        return self._compile(self._estimate_inputs(True), outputs)

    @cached_property
    def _curvature_point(self) -> pt.TensorVariable:
        return pt.vector("theta_curvature", dtype="float64")

    @cached_property
    def _cv2_graphs(self) -> tuple[list, list]:
        """Inputs, and outputs (first-order CV value, gradient, and
        ``sum_i w_i H_i(theta_h) (theta - theta*)``, the minibatch part of the second-order
        correction) of the second-order estimate."""
        at_h = clone_replace(self.row_logp_graph, {self.theta: self._curvature_point})
        grad_at_h = grad((self._weights * at_h).sum(), self._curvature_point)
        hvp = pushforward(grad_at_h, self._curvature_point, self.theta - self.anchor)
        outputs = [self._estimate_graph(True), self._estimate_grad_graph(True), hvp]
        inputs = [
            self.theta,
            self.anchor,
            self._curvature_point,
            *self.row_inputs,
            self._weights,
        ]
        return inputs, outputs

    @cached_property
    def _cv2_parts_fn(self):
        inputs, outputs = self._cv2_graphs
        return self._compile(inputs, outputs)

    @cached_property
    def _cv2_grad_parts_fn(self):
        """Without the value, which costs about as much as the gradient."""
        inputs, outputs = self._cv2_graphs
        return self._compile(inputs, outputs[1:])

    @cached_property
    def _row_logp_fn(self):
        return self._compile([self.theta, *self.row_inputs], self.row_logp_graph)

    @cached_property
    def _row_jvp_graph(self) -> pt.TensorVariable:
        return pushforward(self.row_logp_graph, self.theta, self.direction)

    @cached_property
    def _row_jvp_fn(self):
        return self._compile([self.theta, self.direction, *self.row_inputs], self._row_jvp_graph)

    @cached_property
    def _directional_parts_fns(self) -> dict[bool, pytensor.compile.function.types.Function]:
        """Prior directional derivative and per-row ones (minus the anchor's), one call."""
        prior = pushforward(self.prior_graph, self.theta, self.direction)
        rows = self._row_jvp_graph
        return {
            False: self._compile([self.theta, self.direction, *self.row_inputs], [prior, rows]),
            True: self._compile(
                [self.theta, self.anchor, self.direction, *self.row_inputs],
                [prior, rows - clone_replace(rows, {self.theta: self.anchor})],
            ),
        }

    @cached_property
    def _row_grads_fn(self):
        # A batch of forward-mode passes, one per coordinate: vectorising the pushforward
        # over its tangent turns each matrix-vector product into one matrix-matrix product.
        basis = pt.matrix("basis", dtype="float64")
        per_row = vectorize_graph(self._row_jvp_graph, {self.direction: basis})
        eye = pt.eye(self.theta.shape[0], dtype="float64")
        out = graph_replace(per_row, {basis: eye}).T
        return self._compile([self.theta, *self.row_inputs], out)

    @cached_property
    def _hvp_graph(self) -> pt.TensorVariable:
        g = grad(self.row_logp_graph.sum(), self.theta)
        return pushforward(g, self.theta, self.direction)

    @cached_property
    def _hvp_graphs(self) -> tuple[list, list]:
        return [self.theta, self.direction, *self.row_inputs], [self._hvp_graph]

    @cached_property
    def _hvp_fn(self):
        inputs, [out] = self._hvp_graphs
        return self._compile(inputs, out)

    @cached_property
    def _hessian_graphs(self) -> tuple[list, list]:
        basis = pt.matrix("basis", dtype="float64")
        batched = vectorize_graph(self._hvp_graph, {self.direction: basis})
        eye = pt.eye(self.theta.shape[0], dtype="float64")
        return [self.theta, *self.row_inputs], [graph_replace(batched, {basis: eye})]

    @cached_property
    def _hessian_fn(self):
        inputs, [out] = self._hessian_graphs
        return self._compile(inputs, out)

    @cached_property
    def _prior_hessian_fn(self):
        g = grad(self.prior_graph, self.theta)
        basis = pt.matrix("basis", dtype="float64")
        hv = pushforward(g, self.theta, self.direction)
        batched = vectorize_graph(hv, {self.direction: basis})
        eye = pt.eye(self.theta.shape[0], dtype="float64")
        return self._compile([self.theta], graph_replace(batched, {basis: eye}))

    @cached_property
    def likelihood_inputs(self) -> LikelihoodInputs:
        """The parameter-only tensors the row log-likelihood reads (``phi(theta)``), found
        lazily; see :mod:`pymc_bigdata.likelihood_inputs`."""
        return LikelihoodInputs(self)

    @cached_property
    def difference_terms(self) -> DifferenceTerms:
        """Per-row Taylor residuals and difference-estimator gradients (HMC-ECS), compiled
        lazily; see :mod:`pymc_bigdata.difference_terms`."""
        return DifferenceTerms(self)

    # ------------------------------------------------------------------ minibatch quantities
    def coordinate_label(self, index: int) -> str:
        """``name[i, j]`` of the raveled parameter vector's ``index``-th coordinate."""
        for var, shape, size in zip(self.value_vars, self.var_shapes, self.var_sizes):
            if index < size:
                if not shape:
                    return var.name
                return f"{var.name}[{', '.join(map(str, np.unravel_index(index, shape)))}]"
            index -= size
        raise IndexError(f"coordinate {index} beyond the {self.dim} parameters")

    def value_var_slices(self) -> list[tuple[str, slice, tuple[int, ...]]]:
        """``(name, slice of the raveled vector, shape)`` of every value variable."""
        out, start = [], 0
        for var, shape, size in zip(self.value_vars, self.var_shapes, self.var_sizes):
            out.append((var.name, slice(start, start + size), tuple(shape)))
            start += size
        return out

    def take_rows(self, row_indices: np.ndarray) -> list[np.ndarray]:
        """Rows of every data array for the given indices (through the row source)."""
        return self.rows.take(row_indices)

    @cached_property
    def _prior_logp_fn(self):
        return self._compile([self.theta], self.prior_graph)

    def prior_logp(self, theta: np.ndarray) -> float:
        """Log prior (with Jacobians of the transforms), without its gradient (what a
        discrete step needs)."""
        return float(self._prior_logp_fn(theta))

    def prior_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior (with Jacobians of the transforms) and its gradient."""
        lp, g = self._prior_logp_grad_fn(theta)
        return float(lp), g

    def loglik_grad(self, theta: np.ndarray, rows: list[np.ndarray]) -> tuple[float, np.ndarray]:
        """Summed log-likelihood of the given rows and its gradient."""
        lp, g = self._loglik_grad_fn(theta, *rows)
        return float(lp), g

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
            lp, g = self._logp_grad_est_fn(theta, *rows, weights)
            return float(lp), g
        lp, g = self._cv_logp_grad_fn(theta, anchor.theta, *rows, weights)
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
        g, row_curvature = self._cv2_grad_parts_fn(
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
        lp, g, row_curvature = self._cv2_parts_fn(
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
            return self._grad_fn(theta, *rows, weights)
        return self._cv_grad_fn(theta, anchor.theta, *rows, weights) + anchor.loglik_grad

    def estimate_logp(
        self, theta: np.ndarray, rows: list[np.ndarray], anchor: Anchor | None = None
    ) -> float:
        """Unbiased minibatch estimate of the log posterior (with control variates if anchored)."""
        weights = self.uniform_weights(len(rows[0]))
        if anchor is None:
            return float(self._logp_est_fn(theta, *rows, weights))
        return float(self._cv_logp_est_fn(theta, anchor.theta, *rows, weights)) + anchor.loglik

    def row_logp(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row log-likelihood terms ``l_i(theta)``, shape (n,)."""
        return self._row_logp_fn(theta, *rows)

    def row_directional_derivatives(
        self, theta: np.ndarray, direction: np.ndarray, rows: list[np.ndarray]
    ) -> np.ndarray:
        """``direction . grad l_i(theta)`` for every given row, shape (n,), by forward mode."""
        return self._row_jvp_fn(theta, np.asarray(direction, dtype=np.float64), *rows)

    def directional_parts(
        self,
        theta: np.ndarray,
        direction: np.ndarray,
        rows: list[np.ndarray],
        anchor: Anchor | None = None,
    ) -> tuple[float, np.ndarray]:
        """The pieces of a minibatch estimate of ``direction . grad log p(theta)``.

        Returns the log prior's directional derivative (with the transforms' Jacobians) and,
        per given row, ``u . grad l_i(theta)`` or with an anchor the control-variate residual
        ``u . [grad l_i(theta) - grad l_i(theta*)]``: one forward pass over the rows (two with
        an anchor), no gradient.  The caller weights and sums the rows, adds
        ``u . anchor.loglik_grad`` with an anchor, and has the rows' spread for the noise.
        """
        u = np.asarray(direction, dtype=np.float64)
        fn = self._directional_parts_fns[anchor is not None]
        if anchor is None:
            prior, per_row = fn(theta, u, *rows)
        else:
            prior, per_row = fn(theta, anchor.theta, u, *rows)
        return float(prior), per_row

    def row_gradients(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row gradients ``grad l_i(theta)``, shape (n, d)."""
        return self._row_grads_fn(theta, *rows)

    def row_influence(self, theta: np.ndarray, directions: list[np.ndarray]) -> np.ndarray:
        """How much each row's gradient moves along typical steps away from ``theta``.

        ``mean_k |D_v l_i(theta + v_k) - D_v l_i(theta)|`` over the given directions ``v_k``
        (typical posterior displacements, e.g. ``L u`` with ``u ~ N(0, I)``): the size of
        row i's first-order control-variate residual, in log-density units.  Rows whose
        value is far above the mean dominate a uniform minibatch's gradient noise.
        Two forward passes per direction, in one streamed pass over the data; the result
        has N entries (:meth:`influential_rows` keeps only the few that stand out).
        """
        return np.concatenate([part for _, part in self._influence_chunks(theta, directions)])

    def influential_rows(
        self, theta: np.ndarray, directions: list[np.ndarray], factor: float, cap: int
    ) -> np.ndarray:
        """Rows whose :meth:`row_influence` exceeds ``factor`` times its mean over the rows
        (non-finite influence counts as infinite), at most the ``cap`` largest, sorted.

        One streamed pass keeping the ``cap`` largest values seen and the running sum, so
        memory is bounded by a chunk and ``cap`` whatever N is; the same rows as
        thresholding the full :meth:`row_influence`."""
        top_rows, top_values = np.empty(0, dtype=np.int64), np.empty(0)
        total, count = 0.0, 0
        for start, part in self._influence_chunks(theta, directions):
            finite = np.isfinite(part)
            total += float(part[finite].sum())
            count += int(finite.sum())
            part = np.where(finite, part, np.inf)
            rows = np.concatenate([top_rows, start + np.arange(len(part))])
            values = np.concatenate([top_values, part])
            keep = np.argsort(values, kind="stable")[::-1][:cap]
            top_rows, top_values = rows[keep], values[keep]
        threshold = factor * total / max(count, 1)
        return np.sort(top_rows[top_values > threshold])

    def _influence_chunks(self, theta: np.ndarray, directions: list[np.ndarray]):
        """``(first row, row_influence of a chunk)`` over the data, one pass."""
        start = 0
        for rows in self.rows.chunks(self.chunk_rows, "row influence"):
            out = np.zeros(len(rows[0]))
            for v in directions:
                moved = self.row_directional_derivatives(theta + v, v, rows)
                here = self.row_directional_derivatives(theta, v, rows)
                out += np.abs(moved - here)
            yield start, out / max(len(directions), 1)
            start += len(out)

    def loglik_hvp(
        self, theta: np.ndarray, direction: np.ndarray, rows: list[np.ndarray]
    ) -> np.ndarray:
        """Hessian-vector product of the summed log-likelihood of the given rows."""
        return self._hvp_fn(theta, np.asarray(direction, dtype=np.float64), *rows)

    def loglik_hessian(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Dense Hessian (d, d) of the summed log-likelihood of the given rows."""
        return self._hessian_fn(theta, *rows)

    def prior_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Dense Hessian (d, d) of the log prior."""
        return self._prior_hessian_fn(theta)

    # ------------------------------------------------------------------ full data
    def full_loglik_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data summed log-likelihood and gradient, computed in row chunks."""
        lp, g = self.rows.reduce(
            self._chunk_function("loglik_grad"), (theta,), self.chunk_rows, "log-likelihood"
        )
        return float(lp), g

    def full_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data log posterior and its gradient (chunked)."""
        lp, g = self.full_loglik_grad(theta)
        plp, pg = self.prior_logp_grad(theta)
        return lp + plp, g + pg

    def full_loglik_hvp(self, theta: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """Full-data Hessian-vector product of the summed log-likelihood (chunked)."""
        direction = np.asarray(direction, dtype=np.float64)
        return self.rows.reduce(
            self._chunk_function("hvp"), (theta, direction), self.chunk_rows, "Hessian product"
        )

    def full_loglik_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Full-data dense Hessian of the summed log-likelihood.

        Computed by batched Hessian-vector products over the d basis directions, in row
        chunks of at most ``HESSIAN_BLOCK_ELEMENTS / d`` rows so the intermediate arrays stay
        near 8 MB whatever d is (time ~ N d forward passes).
        """
        return self.rows.reduce(
            self._chunk_function("hessian"), (theta,), self._hessian_chunk_rows(), "Hessian"
        )

    def _hessian_chunk_rows(self) -> int:
        return int(max(256, min(self.chunk_rows, HESSIAN_BLOCK_ELEMENTS // max(self.dim, 1))))

    def full_loglik_hessian_diagonal(
        self, theta: np.ndarray, n_probes: int = DIAGONAL_PROBES, seed: int = 0
    ) -> np.ndarray:
        """Hutchinson estimate of the diagonal of the full-data log-likelihood Hessian.

        ``mean_k v_k * (H v_k)`` over Rademacher probes ``v_k``: ``n_probes`` full-data HVP
        passes and O(d) memory, for models too large for :meth:`full_loglik_hessian`.  Its
        error in entry j is ``sqrt(sum_{k != j} H_jk^2 / n_probes)``; it serves as a starting
        preconditioner that tuning refines from the chain's draws.
        """
        rng = np.random.default_rng(seed)
        total = np.zeros(self.dim)
        for _ in range(n_probes):
            probe = rng.choice(np.array([-1.0, 1.0]), size=self.dim)
            total += probe * self.full_loglik_hvp(theta, probe)
        return total / n_probes

    def find_map(self, start: np.ndarray | None = None, maxiter: int = 500) -> MapResult:
        """Maximise the full-data log posterior.

        1. Quasi-Newton (L-BFGS) on a fixed random subsample of at most ``chunk_rows`` rows,
           scaled by N/n (all rows when N is small): cheap, and lands within a few posterior
           standard deviations of the mode.
        2. Up to ``DENSE_HESSIAN_MAX_DIM`` parameters: Newton steps on the full data
           (chunked gradients) with the subsample's Hessian, halving a step that does not
           increase the log posterior, until the Newton decrement ``g^T H^{-1} g`` is below
           1e-12; then the exact full-data Hessian at the mode (the Laplace precision).
           Beyond: L-BFGS on the full data, and a Hutchinson estimate of the Hessian's
           diagonal (no d x d matrix anywhere).
        3. Diagnostics (:attr:`MapResult.problem`): the Newton decrement at the end and the
           relative smallest curvature, so a caller can tell a mode from a point where the
           search gave up (an improper direction, a density unbounded at a boundary).

        Returns
        -------
        MapResult
        """
        theta = self.initial_theta if start is None else np.asarray(start, dtype=np.float64)
        n_sub = min(self.n_rows, self.chunk_rows)
        sub_rows = (
            self.rows.subsample(n_sub, np.random.default_rng(20140621))
            if n_sub < self.n_rows
            else next(self.rows.chunks(self.n_rows))
        )
        theta = _lbfgs(self._scaled_negative_logp(sub_rows), theta, maxiter, self.n_rows)
        hessian_point, loglik_hess = theta, None
        if self.dim <= DENSE_PRECONDITIONER_DIM:  # cheap: subsample Hessian for Newton
            scale = self.n_rows / n_sub
            hess = scale * self._chunked_hessian(theta, sub_rows) + self.prior_hessian(theta)
            theta, n_eval = self._newton(theta, -0.5 * (hess + hess.T))
            hessian_point = theta
        elif self.dim <= DENSE_HESSIAN_MAX_DIM:  # one full Hessian, used by Newton and kept
            loglik_hess = self._symmetric_full_hessian(theta)
            theta, n_eval = self._newton(theta, -(loglik_hess + self.prior_hessian(theta)))
        else:
            theta = _lbfgs(self._full_negative_logp, theta, maxiter, self.n_rows)
            n_eval = maxiter  # an upper bound: scipy does not report it through _lbfgs
        try:
            loglik, loglik_grad = self.full_loglik_grad(theta)
            prior_lp, prior_grad = self.prior_logp_grad(theta)
        except ParameterValueError:  # ended where a parameter left its support: no mode
            nan = np.full(self.dim, np.nan)
            return MapResult(theta, -math.inf, nan, -math.inf, np.ones(self.dim), n_eval + 1)
        lp, grad_lp = loglik + prior_lp, loglik_grad + prior_grad
        if self.dim <= DENSE_HESSIAN_MAX_DIM:
            if loglik_hess is None:
                loglik_hess = self._symmetric_full_hessian(theta)
            precision = -(loglik_hess + self.prior_hessian(theta))
            precision = 0.5 * (precision + precision.T)
            decrement, min_curv = _dense_diagnostics(precision, grad_lp)
        else:
            prior_diag = np.diag(self.prior_hessian(theta)) if self.dim <= 20_000 else 0.0
            precision = -(self.full_loglik_hessian_diagonal(theta) + prior_diag)
            decrement, min_curv = _diagonal_diagnostics(precision, grad_lp)
        return MapResult(
            theta=theta,
            logp=lp,
            loglik_grad=loglik_grad,
            loglik=loglik,
            hessian=precision,
            n_evaluations=n_eval + 2,
            loglik_hessian=loglik_hess,
            hessian_point=hessian_point,
            newton_decrement=decrement,
            min_curvature=min_curv,
        )

    def _symmetric_full_hessian(self, theta: np.ndarray) -> np.ndarray:
        hess = self.full_loglik_hessian(theta)
        return 0.5 * (hess + hess.T)

    def _scaled_negative_logp(self, rows: list[np.ndarray]):
        scale = self.n_rows / len(rows[0])

        def negative(theta):
            lp, g = self.loglik_grad(theta, rows)
            plp, pg = self.prior_logp_grad(theta)
            return -(plp + scale * lp), -(pg + scale * g)

        return negative

    def _full_negative_logp(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        lp, g = self.full_logp_grad(theta)
        return -lp, -g

    def _chunked_hessian(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((self.dim, self.dim))
        step = self._hessian_chunk_rows()
        for start in range(0, len(rows[0]), step):
            out += self.loglik_hessian(theta, [r[start : start + step] for r in rows])
        return out

    def _newton(
        self, theta: np.ndarray, precision: np.ndarray, max_iter: int = 50
    ) -> tuple[np.ndarray, int]:
        """Full-data Newton iterations with a fixed (approximate) precision matrix."""
        n_eval = 1
        lp, g = self._checked_logp_grad(theta)
        if not np.isfinite(lp):
            return theta, n_eval
        try:
            factor = scipy.linalg.cho_factor(precision)
        except np.linalg.LinAlgError:
            factor = None
        for _ in range(max_iter):
            step = (
                scipy.linalg.cho_solve(factor, g)
                if factor is not None
                else np.linalg.lstsq(precision, g, rcond=None)[0]
            )
            if float(g @ step) < 1e-12 or not np.all(np.isfinite(step)):
                break
            for _halving in range(30):
                new_lp, new_g = self._checked_logp_grad(theta + step)
                n_eval += 1
                if np.isfinite(new_lp) and new_lp >= lp - 1e-9 * abs(lp):
                    break
                step = 0.5 * step
            else:
                break
            theta, lp, g = theta + step, new_lp, new_g
        return theta, n_eval

    def _checked_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """:meth:`full_logp_grad`, with ``-inf`` where a parameter leaves its support."""
        try:
            return self.full_logp_grad(theta)
        except ParameterValueError:
            return -math.inf, np.full(self.dim, np.nan)

    # ------------------------------------------------------------------ held variables
    def held_from_point(self, point: dict[str, np.ndarray]) -> np.ndarray:
        """The held variables' values in ``point``, raveled as :attr:`held_values`."""
        return _flat(point, self.held_vars)

    def hold(self, values: np.ndarray) -> bool:
        """Set the held variables (raveled); returns whether they changed."""
        values = np.asarray(values, dtype=np.float64)
        current = self.held_values.get_value(borrow=True)
        if values.shape != current.shape:
            raise ValueError(
                f"held values have shape {values.shape}, the layer holds {current.shape}"
            )
        if np.array_equal(values, current):
            return False
        self.held_values.set_value(values.copy())
        return True

    @property
    def held_key(self) -> bytes:
        """A key of the held variables' current values (the MAP and anchors depend on them)."""
        return self.held_values.get_value(borrow=True).tobytes()

    def map_estimate(self, start: np.ndarray | None = None) -> MapResult:
        """:meth:`find_map` (from ``start``, default the model's initial point), computed once
        per value of the held variables and shared.

        Runs :meth:`check_row_factorisation` first.
        """
        key = self.held_key
        if key not in self._map_results:
            self.check_row_factorisation()
            self._map_results[key] = self.find_map(start)
        return self._map_results[key]

    def check_row_factorisation(
        self, theta: np.ndarray | None = None, gradient_free: bool = False
    ) -> None:
        """Refuse a likelihood whose per-row terms depend on the other rows in the batch.

        Graph inspection catches multivariate distributions over the row axis; this catches
        the rest (e.g. a covariate centred inside the model, ``x - x.mean()``): the summed
        log-likelihood of a block of rows must not change when the block is split in two or
        its rows are reversed. ``gradient_free`` compares the per-row terms instead (what a
        discrete layer can compute).
        """
        block = next(self.rows.chunks(2 * self.chunk_rows))
        n = len(block[0])
        if n < 2:
            return
        # off the initial point, where parameters are often exactly 0; the initial point
        # itself if the likelihood is not finite there
        candidates = (
            [theta]
            if theta is not None
            else [self.initial_theta + 0.3 * np.cos(np.arange(self.dim) + 1.0), self.initial_theta]
        )
        if gradient_free:
            candidates = [np.round(np.clip(c, 0, 1)) for c in candidates]

        def summed(theta, rows):
            if gradient_free:
                return float(np.sum(self.row_logp(theta, rows)))
            return self.loglik_grad(theta, rows)[0]

        for theta in candidates:
            whole = summed(theta, block)
            if np.isfinite(whole):
                break
        else:
            return  # nothing finite to compare; the MAP search will report the problem
        halves = sum(
            summed(theta, [b[s] for b in block]) for s in (slice(0, n // 2), slice(n // 2, n))
        )
        reversed_rows = summed(theta, [np.ascontiguousarray(b[::-1]) for b in block])
        tolerance = 1e-8 * max(1.0, abs(whole))
        if not (abs(whole - halves) <= tolerance and abs(whole - reversed_rows) <= tolerance):
            raise ModelNotSupportedError(
                "The likelihood does not factor over rows: the log-likelihood of a block of "
                f"rows ({whole:.6g}) changes when the block is split in two ({halves:.6g}) or "
                f"reordered ({reversed_rows:.6g}). The model uses the data across rows (e.g. a "
                "mean, cumulative sum or lag over the data inside the model); compute such "
                "quantities before building the model and pass them as data."
            )

    def map_anchor(self) -> Anchor:
        """The control-variate anchor at the (cached) MAP, with its curvature when dense."""
        m = self.map_estimate()
        return Anchor(
            theta=m.theta,
            loglik=m.loglik,
            loglik_grad=m.loglik_grad,
            curvature_point=m.hessian_point if m.loglik_hessian is not None else None,
            loglik_hessian=_compact(m.loglik_hessian),
        )

    def anchor_at(self, theta: np.ndarray, curvature_from: Anchor | None = None) -> Anchor:
        """A control-variate anchor at ``theta`` (one full-data gradient pass).

        The second-order curvature (point and Hessian) is carried over from
        ``curvature_from``: the correction stays unbiased with a Hessian taken elsewhere, so
        re-centring costs one gradient pass, not a Hessian.
        """
        theta = np.asarray(theta, dtype=np.float64)
        loglik, loglik_grad = self.full_loglik_grad(theta)
        point = hess = None
        if curvature_from is not None and curvature_from.loglik_hessian is not None:
            point, hess = curvature_from.curvature_point, curvature_from.loglik_hessian
        return Anchor(theta, loglik, loglik_grad, point, _compact(hess))

    def data_is_current(self) -> bool:
        """False when ``pm.set_data`` (or ``set_value``) replaced a row array since the
        layer read it: the layer's rows, N and anchors would then be stale."""
        for var, array in self._data_snapshot:
            current = _data_value(var)
            if current is array:
                continue  # the usual case: same buffer, nothing to compare
            if current.shape != array.shape or current.dtype != array.dtype:
                return False
            if not np.array_equal(current, array, equal_nan=True):  # e.g. after unpickling
                return False
        return True

    def _neg_hessian(self, theta: np.ndarray) -> np.ndarray:
        hess = self.full_loglik_hessian(theta) + self.prior_hessian(theta)
        return -0.5 * (hess + hess.T)

    # ------------------------------------------------------------------ helpers for steps
    def scale_for(self, batch_size: int) -> float:
        """The ratio N/n that scales a minibatch sum to the full data."""
        check_batch_size(batch_size, self.n_rows)
        return self.n_rows / batch_size

    def __getstate__(self):
        # Compiled functions are rebuilt lazily after unpickling (fast from the compile cache).
        state = self.__dict__.copy()
        for key in [k for k in state if k.startswith("_") and k.endswith("_fn")]:
            del state[key]
        return state


#: functions compiled on this process for ChunkFunctions that arrived pickled (dask workers)
_WORKER_FUNCTIONS: dict[tuple, pytensor.compile.function.types.Function] = {}


class ChunkFunction:
    """A compiled per-chunk function of the layer that can travel to dask workers.

    Called here it is the layer's compiled function. Pickled, it carries its graphs (and
    the held values they read) instead, and a worker compiles them once per process.
    """

    def __init__(self, inputs: list, outputs: list, mode, compiled=None):
        self.inputs, self.outputs, self.mode = inputs, outputs, mode
        self.compiled = compiled
        self.key = (id(self), os.getpid(), uuid.uuid4().hex)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["compiled"] = None
        return state

    def __call__(self, *args):
        if self.compiled is None:
            held = [
                v.get_value(borrow=True).tobytes()
                for v in ancestors(self.outputs)
                if isinstance(v, TensorSharedVariable)
            ]
            key = (self.key, *held)
            if key not in _WORKER_FUNCTIONS:
                _WORKER_FUNCTIONS[key] = pytensor.function(
                    self.inputs, self.outputs, mode=self.mode, on_unused_input="ignore"
                )
            self.compiled = _WORKER_FUNCTIONS[key]
        out = self.compiled(*args)
        return out if len(self.outputs) > 1 else out[0] if isinstance(out, list) else out


@dataclass(frozen=True)
class Anchor:
    """The control-variate anchor theta* and the full-data quantities there.

    ``curvature_point`` and ``loglik_hessian`` (the full-data log-likelihood Hessian there)
    enable second-order control variates; both None for first order only.
    """

    theta: np.ndarray
    loglik: float
    loglik_grad: np.ndarray
    curvature_point: np.ndarray | None = None
    loglik_hessian: np.ndarray | None = None

    def second_order(
        self, theta: np.ndarray, grad_first: np.ndarray, row_curvature: np.ndarray
    ) -> np.ndarray:
        """The second-order estimate from :meth:`MinibatchModel.estimate_second_order_parts`."""
        return grad_first - row_curvature + self.loglik_hessian @ (theta - self.theta)


#: a Hessian with at most this fraction of non-zero entries is stored sparse (CSR)
SPARSE_HESSIAN_DENSITY = 0.1


def _compact(matrix: np.ndarray | None):
    """A CSR copy of a mostly-zero matrix (its matvec then costs O(nnz), not O(d^2))."""
    if matrix is None or scipy.sparse.issparse(matrix) or matrix.shape[0] < 100:
        return matrix
    if np.count_nonzero(matrix) > SPARSE_HESSIAN_DENSITY * matrix.size:
        return matrix
    return scipy.sparse.csr_matrix(matrix)


def _lbfgs(negative_logp, theta: np.ndarray, maxiter: int, n_rows: int) -> np.ndarray:
    """L-BFGS-B on ``negative_logp(theta) -> (value, grad)``; non-finite values are walls."""

    def guarded(x):
        try:
            value, g = negative_logp(x)
        except ParameterValueError:  # a parameter left its support (e.g. a scale underflowed)
            return np.inf, np.zeros_like(x)
        if not np.isfinite(value) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)
        return value, g

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return scipy.optimize.minimize(
            guarded,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": maxiter, "gtol": 1e-9 * n_rows},
        ).x


def _dense_diagnostics(precision: np.ndarray, grad_lp: np.ndarray) -> tuple[float, float]:
    """Newton decrement ``g^T P^{-1} g`` and relative smallest eigenvalue of ``P``."""
    eig = np.linalg.eigvalsh(precision)
    if not np.all(np.isfinite(eig)) or eig[-1] <= 0:
        return math.inf, -math.inf
    min_curvature = float(eig[0] / eig[-1])
    if min_curvature <= MIN_RELATIVE_CURVATURE:
        return math.inf, min_curvature
    try:
        factor = scipy.linalg.cho_factor(precision)
    except np.linalg.LinAlgError:
        return math.inf, min_curvature
    return float(grad_lp @ scipy.linalg.cho_solve(factor, grad_lp)), min_curvature


def _diagonal_diagnostics(precision_diag: np.ndarray, grad_lp: np.ndarray) -> tuple[float, float]:
    if not np.all(np.isfinite(precision_diag)) or precision_diag.max() <= 0:
        return math.inf, -math.inf
    min_curvature = float(precision_diag.min() / precision_diag.max())
    if min_curvature <= MIN_RELATIVE_CURVATURE:
        return math.inf, min_curvature
    return float(np.sum(grad_lp**2 / precision_diag)), min_curvature


# ---------------------------------------------------------------------- model checks
def _row_names(row_vars, observed, values) -> list[str]:
    """Readable names: the variable's name, or the observed variable a plain array feeds."""
    names = []
    for var in row_vars:
        if var.name:
            names.append(var.name)
            continue
        owner = next((rv.name for rv in observed if values[rv] is var), None)
        if owner is not None:
            names.append(f"observed data of {owner!r}")
            continue
        users = [rv.name for rv in observed if var in set(ancestors(rv.owner.inputs))]
        names.append(f"unnamed covariate array of shape {_data_value(var).shape} used by {users}")
    return names


def _is_discrete(var: Variable) -> bool:
    return var.dtype.startswith(("int", "uint")) or var.dtype == "bool"


def _check_vars(model: pm.Model, vars, discrete: bool = False) -> list[Variable]:
    """The sampled value variables, in the model's order.

    Default: every free variable, all continuous (or, with ``discrete``, every discrete
    one). Given ``vars`` may be a subset; the rest are held. Continuous steps refuse discrete
    variables in their ``vars`` and vice versa.
    """
    if vars is None:
        vars = [v for v in model.value_vars if _is_discrete(v)] if discrete else model.value_vars
        if not vars:
            raise ModelNotSupportedError("The model has no discrete free variables to sample.")
    vars = [model.rvs_to_values.get(v, v) for v in vars]
    unknown = [getattr(v, "name", v) for v in vars if v not in model.value_vars]
    if unknown:
        raise ValueError(f"{unknown} are not free variables of the model.")
    for var in vars:
        name = model.values_to_rvs[var].name
        if _is_discrete(var) and not discrete:
            raise ModelNotSupportedError(
                f"Free variable {name!r} is discrete ({var.dtype}); gradient-based "
                "subsampling samplers need continuous parameters. Marginalise it out "
                "(e.g. pymc_extras.marginalize), or sample it in a compound step: "
                "step=[pmb.AusterityGibbs([binary vars]), pmb.SGHMC([continuous vars])]."
            )
        if discrete and not _is_discrete(var):
            raise ModelNotSupportedError(
                f"Free variable {name!r} is continuous ({var.dtype}); this step samples "
                "discrete variables only. Give it to a continuous step in a compound step."
            )
    if not discrete:
        loose = [
            model.values_to_rvs[v].name
            for v in model.value_vars
            if v not in vars and not _is_discrete(v)
        ]
        if loose:
            raise ModelNotSupportedError(
                f"Subsampling samplers must update every continuous free variable together; "
                f"{loose} are not in the step's vars. Pass all continuous free variables (the "
                "default); only discrete ones may be left to another step."
            )
    return [v for v in model.value_vars if v in vars]


def _flat(point: dict[str, np.ndarray], value_vars: list[Variable]) -> np.ndarray:
    """The values of ``value_vars`` in ``point``, raveled into one float64 vector."""
    if not value_vars:
        return np.zeros(0)
    return np.concatenate([np.ravel(point[v.name]) for v in value_vars]).astype(np.float64)


def _slices(flat, value_vars, shapes) -> dict[Variable, pt.TensorVariable]:
    """Each value variable as its slice of the flat vector ``flat``, in its own dtype."""
    out, start = {}, 0
    for var, shape in zip(value_vars, shapes):
        size = int(np.prod(shape))
        piece = flat[start : start + size].reshape(shape).astype(var.dtype)
        out[var] = var.type.filter_variable(piece, allow_convert=True)
        start += size
    return out


def _strip_minibatch(value: Variable) -> Variable:
    """Full-data variable behind a ``pm.Minibatch`` output or a dtype cast (or the value)."""
    while value.owner is not None:
        op = value.owner.op
        if isinstance(op, MinibatchOp):
            value = value.owner.inputs[value.owner.outputs.index(value)]
        elif isinstance(op, Elemwise) and isinstance(op.scalar_op, Cast):
            value = value.owner.inputs[0]  # pm.Data stores integers as int32; PyMC casts
        else:
            break
    return value


def _minibatch_replacements(graph: Variable) -> dict[Variable, Variable]:
    """Replace every ``pm.Minibatch`` output in ``graph`` by its full-data input."""
    out = {}
    for var in ancestors([graph]):
        if var.owner is not None and isinstance(var.owner.op, MinibatchOp):
            for i, o in enumerate(var.owner.outputs[:-1]):
                out[o] = var.owner.inputs[i]
    return out


def _data_vars(model: pm.Model) -> list[Variable]:
    """Every shared data container of the model (``pm.Data`` and observed shared values)."""
    found = list(model.data_vars)
    graphs = [rv.owner.inputs[i] for rv in model.observed_RVs for i in range(len(rv.owner.inputs))]
    graphs += [model.rvs_to_values[rv] for rv in model.observed_RVs]
    for var in ancestors(graphs):
        if isinstance(var, TensorSharedVariable) and var not in found:
            found.append(var)
    return found


def _data_value(var: Variable) -> np.ndarray:
    if isinstance(var, Constant):
        return np.asarray(var.data)
    return np.asarray(var.get_value(borrow=True))


def _row_count(var: Variable) -> int:
    column = row_column(var)
    return column.n_rows if column is not None else int(_data_value(var).shape[0])


def _row_array(var: Variable):
    """What the row source reads for ``var``: a ``pmb.Data`` column, or its array."""
    column = row_column(var)
    return column if column is not None else _data_value(var)


def _check_deterministics_not_per_row(model, canonical, row_names, row_vars, n_rows) -> None:
    """Refuse Deterministics computed from row data: PyMC's trace evaluates every
    Deterministic at every draw, which would read all N rows per draw."""
    name_of = {var: name for var, name in zip(row_vars, row_names)}
    for det in model.deterministics:
        used = {name_of[canonical[a]] for a in ancestors([det]) if a in canonical}
        if used:
            raise ModelNotSupportedError(
                f"Deterministic {det.name!r} is computed from the row data {sorted(used)}: "
                f"PyMC's trace would evaluate it on all N = {n_rows} rows at every draw. "
                "Remove it from the model (write the expression without pm.Deterministic) "
                "and compute it after sampling on the rows you need, e.g. with "
                "pm.compute_deterministics on a model built on a subsample."
            )


def _common_row_count(values: dict) -> int:
    counts = {}
    for rv, value in values.items():
        if not isinstance(value, Constant | TensorSharedVariable):
            raise ModelNotSupportedError(
                f"Observed data of {rv.name!r} is a computed expression; pass the data "
                "array itself (or pm.Data) as observed."
            )
        if value.type.ndim < 1:
            raise ModelNotSupportedError(
                f"Observed variable {rv.name!r} is a scalar: there is no row axis to subsample."
            )
        counts[rv.name] = _row_count(value)
    if len(set(counts.values())) != 1:
        raise ModelNotSupportedError(
            f"Observed variables have different row counts {counts}; subsampling needs every "
            "observed variable to share one leading row axis."
        )
    return next(iter(counts.values()))


def _find_row_data(
    model, observed, values, n_rows
) -> tuple[list[Variable], dict[Variable, Variable]]:
    """Observed values and covariates with a leading row axis of length ``n_rows``.

    Returns the distinct row arrays and a map from every graph variable holding one of them
    to its canonical variable (plain arrays used twice become two equal constants).
    """
    full_graphs = [inp for rv in observed for inp in rv.owner.inputs]
    row_vars: list[Variable] = []
    canonical: dict[Variable, Variable] = {}

    def add(var):
        if var in canonical:
            return
        if row_column(var) is not None:  # a pmb.Data array: never read it to compare
            row_vars.append(var)
            canonical[var] = var
            return
        data = _data_value(var)
        for known in row_vars:
            if row_column(known) is not None:
                continue
            other = _data_value(known)
            if (
                other.shape == data.shape
                and other.dtype == data.dtype
                and (other is data or np.array_equal(other, data, equal_nan=True))
            ):
                canonical[var] = known
                return
        row_vars.append(var)
        canonical[var] = var

    for rv in observed:
        add(values[rv])
    for var in ancestors(full_graphs):
        if var.owner is not None or isinstance(var.type, RandomType):
            continue
        if not isinstance(var, Constant | TensorSharedVariable):
            continue
        if getattr(var.type, "ndim", 0) < 1:
            continue
        if row_column(var) is not None or (n_rows > 1 and _data_value(var).shape[0] == n_rows):
            add(var)
    return row_vars, canonical


def _check_free_vars_not_per_row(model: pm.Model, n_rows: int) -> None:
    init = model.initial_point()
    for rv in model.free_RVs:
        value = model.rvs_to_values[rv]
        shape = np.shape(init[value.name])
        if n_rows > 1 and len(shape) >= 1 and shape[0] == n_rows:
            raise ModelNotSupportedError(
                f"Free variable {rv.name!r} has a per-row dimension (shape {shape}, N = "
                f"{n_rows}): a local latent variable. Subsampling samplers need global "
                "parameters only; marginalise the local variables out."
            )


def _check_no_missing_values(model: pm.Model) -> None:
    for rv in model.free_RVs:
        if rv.name.endswith("_unobserved") or rv.name.endswith("_missing"):
            raise ModelNotSupportedError(
                f"The model imputes missing observed values ({rv.name!r}): observed data "
                "contains NaN or masked entries. Drop those rows before building the model."
            )
    for rv in model.observed_RVs:
        value = _strip_minibatch(model.rvs_to_values[rv])
        if isinstance(value, Constant | TensorSharedVariable):
            data = _data_value(value)
            if np.ma.isMaskedArray(data) or (
                np.issubdtype(data.dtype, np.floating) and not np.isfinite(data).all()
            ):
                raise ModelNotSupportedError(
                    f"Observed variable {rv.name!r} has missing or non-finite values "
                    "(NaN/inf/masked). Drop those rows before building the model."
                )


def _check_finite_rows(rows: RowSource) -> None:
    bad = [name for name, ok in rows.all_finite().items() if not ok]
    if bad:
        raise ModelNotSupportedError(
            f"Row data {bad} contain NaN or infinite values. Drop or impute those rows first."
        )
