"""The likelihood's inputs: the parameter-only tensors that the per-row log-likelihood reads.

A row's log-likelihood ``l_k(theta)`` reads the parameters only through a few tensors that
depend on ``theta`` and not on the rows: ``beta`` in ``X @ beta``, the group effects
``a = mu + tau * z`` of a non-centred hierarchical model in ``a[group]``, ``sigma`` and
``log(sigma)`` in a normal likelihood.  Stacked and flattened they are the vector
``phi(theta)``, and ``l_k(theta) = m_k(phi(theta))`` with ``m_k`` the row's log-likelihood as
a function of ``phi``.  This module finds ``phi`` in the model's graph (the *frontier*
between parameter-only and row-dependent nodes) and compiles ``phi(theta)``, ``m_k(phi)``
and the full-data sums of ``m_k``'s gradient and Hessian in ``phi``.

Why: a Taylor control variate (HMC-ECS, Dang et al. 2019, Eq. 4.4) can be expanded in ``phi``
instead of ``theta``,

    q_k(theta) = m_k(phi*) + grad m_k(phi*) . Delta + 1/2 Delta' H^phi_k(phi_h) Delta,
    Delta = phi(theta) - phi(theta*),

and its full-data sum is still known in closed form from ``A_phi = sum_k grad m_k(phi*)``
and ``B_phi = sum_k H^phi_k(phi_h)`` (``p x p``, ``p = dim phi``).  The difference estimator
stays unbiased for any proxy; what changes is its variance.  Where ``phi`` is a nonlinear
function of ``theta`` that the data pin down better than ``theta`` (the group effects of a
non-centred model: ``mu``, ``tau`` and ``z`` wander along directions that leave ``a``
unchanged), the expansion in ``phi`` stays accurate over the whole posterior while the one in
``theta`` fails away from ``theta*``.  Where ``phi`` is a linear function of ``theta`` (slices
and reshapes of it, as in a GLM) the two expansions are the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.ops import ViewOp
from pytensor.gradient import grad, pushforward
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace, graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.scalar import ScalarType
from pytensor.scalar import constant as scalar_constant
from pytensor.tensor.basic import Join
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.shape import Reshape, SpecifyShape
from pytensor.tensor.subtensor import Subtensor

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.compiled import ChunkFunction, CompiledModel
from pymc_bigdata.model.laplace import symmetrised
from pymc_bigdata.model.passes import HESSIAN_BLOCK_ELEMENTS, FullDataPasses

__all__ = ["InputAnchor", "LikelihoodInputs"]

#: at most this many likelihood inputs (B_phi is dense p x p, as the model's B)
MAX_INPUT_DIM = 2_000

#: ops that keep phi a linear (selection) map of theta: the two expansions then coincide
_SELECTION_OPS = (Subtensor, Reshape, DimShuffle, SpecifyShape, ViewOp, Join)


@dataclass(frozen=True)
class InputAnchor:
    """Full-data sums of the expansion in ``phi`` at an :class:`~pymc_bigdata.model.anchor.Anchor`:
    ``phi* = phi(theta*)``, ``A_phi`` there and ``B_phi`` at ``phi(theta_h)`` (zero below
    second order)."""

    phi: np.ndarray
    loglik_grad: np.ndarray
    loglik_hessian: np.ndarray


class LikelihoodInputs:
    """``phi(theta)`` and the row log-likelihood as a function of ``phi``, for one model.

    Parameters
    ----------
    compiled
        The model's compiled quantities (the row log-likelihood graph is read from it).
    passes
        Its full-data passes (the row source and the chunk size of ``A_phi`` and ``B_phi``).

    Attributes
    ----------
    available : bool
        Whether an expansion in ``phi`` can be used (``reason`` says why not).
    linear : bool
        ``phi`` selects and reshapes entries of ``theta`` only: the expansion in ``phi`` is
        the same function as the one in ``theta``.
    dim : int
        ``p``, the length of ``phi``.
    names : list of str
        A readable name of each tensor stacked in ``phi``.
    """

    def __init__(self, compiled: CompiledModel, passes: FullDataPasses):
        self.compiled, self.passes = compiled, passes
        self.phi = pt.vector("likelihood_inputs", dtype="float64")
        self.available, self.reason, self.linear = False, "", True
        self.dim, self.names = 0, []
        try:
            self._find()
        except _NotAvailable as exc:
            self.reason = str(exc)
        self._last_anchor: tuple[Anchor, int, InputAnchor] | None = None
        self._hessian_cache: tuple[np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in [k for k in state if k.endswith("_fn")]:
            del state[key]
        state["_chunk_functions"] = {}
        return state

    # ------------------------------------------------------------------ finding phi
    def _find(self) -> None:
        model = self.compiled.graph
        graph, theta = model.row_logp_graph, model.theta
        frontier = _frontier(graph, theta, model.row_inputs)
        floats = [v for v in frontier if v.dtype.startswith("float")]
        others = [v for v in frontier if not v.dtype.startswith("float")]
        if any(v.dtype != "bool" for v in others):
            self.reason = "the likelihood reads integer tensors computed from the parameters"
            return
        if not floats:
            self.reason = "the likelihood reads no parameters"
            return
        shapes = [v.type.shape for v in floats]
        if any(dim is None for shape in shapes for dim in shape):  # evaluated once, uncompiled
            fn = pytensor.function([theta], floats, mode="FAST_COMPILE", on_unused_input="ignore")
            shapes = [np.shape(v) for v in fn(model.initial_theta)]
        sizes = [int(np.prod(s)) for s in shapes]
        self.dim = int(sum(sizes))
        if self.dim > MAX_INPUT_DIM:
            self.reason = f"the likelihood reads {self.dim} > {MAX_INPUT_DIM} parameter values"
            return
        self.names = [v.name or str(v) for v in floats]
        self.linear = all(_is_selection(v, theta) for v in floats)
        replacements, start = {}, 0
        for var, shape, size in zip(floats, shapes, sizes):
            piece = self.phi[start : start + size].reshape(shape)
            replacements[var] = pt.specify_shape(piece, shape).astype(var.dtype)
            start += size
        for var in others:  # parameter checks (e.g. sigma > 0): not part of the proxy
            replacements[var] = _true_like(var)
        self.phi_graph = pt.concatenate([pt.cast(v, "float64").ravel() for v in floats])
        self.row_graph = graph_replace(graph, replacements, strict=False)
        if theta in ancestors([self.row_graph]):
            self.reason = "the parameters reach the likelihood other than through tensors"
            return
        self.available = True

    # ------------------------------------------------------------------ graphs
    def coordinates(self, theta: Variable) -> Variable:
        """The graph of ``phi`` at the parameter vector ``theta`` (a graph)."""
        return clone_replace(self.phi_graph, {self.compiled.graph.theta: theta})

    def rows_at(self, phi: Variable) -> Variable:
        """The per-row log-likelihood graph at ``phi`` (a graph), shape (n,)."""
        return clone_replace(self.row_graph, {self.phi: phi})

    @cached_property
    def _phi_fn(self):
        return self.compiled.compile([self.compiled.graph.theta], self.phi_graph)

    @cached_property
    def _loglik_grad_graphs(self) -> tuple[list, list]:
        total = self.row_graph.sum()
        return [self.phi, *self.compiled.graph.row_inputs], [total, grad(total, self.phi)]

    @cached_property
    def _hessian_graphs(self) -> tuple[list, list]:
        direction = pt.vector("phi_direction", dtype="float64")
        hvp = pushforward(grad(self.row_graph.sum(), self.phi), self.phi, direction)
        basis = pt.matrix("basis", dtype="float64")
        batched = vectorize_graph(hvp, {direction: basis})
        eye = pt.eye(self.phi.shape[0], dtype="float64")
        inputs = [self.phi, *self.compiled.graph.row_inputs]
        return inputs, [graph_replace(batched, {basis: eye})]

    def _chunk_function(self, name: str) -> ChunkFunction:
        cache = self.__dict__.setdefault("_chunk_functions", {})
        if name not in cache:
            inputs, outputs = getattr(self, f"_{name}_graphs")
            cache[name] = ChunkFunction.compile(inputs, outputs, self.compiled.mode)
        return cache[name]

    @cached_property
    def _cv_sum_fn(self):
        """``A . Delta + 1/2 Delta' B Delta`` and its gradient in ``theta``."""
        model = self.compiled.graph
        a_phi = pt.vector("A_phi", dtype="float64")
        b_phi = pt.matrix("B_phi", dtype="float64")
        delta = self.coordinates(model.theta) - self.coordinates(model.anchor)
        value = a_phi @ delta + 0.5 * delta @ (b_phi @ delta)
        return self.compiled.compile(
            [model.theta, model.anchor, a_phi, b_phi], [value, grad(value, model.theta)]
        )

    # ------------------------------------------------------------------ numbers
    def __call__(self, theta: np.ndarray) -> np.ndarray:
        """``phi(theta)``."""
        return np.asarray(self._phi_fn(np.asarray(theta, dtype=np.float64)))

    def full_loglik_grad(self, theta: np.ndarray) -> np.ndarray:
        """``A_phi``: the full-data gradient of the log-likelihood in ``phi`` at
        ``phi(theta)`` (one pass)."""
        passes = self.passes
        _, g = passes.rows.reduce(
            self._chunk_function("loglik_grad"), (self(theta),), passes.chunk_rows, "gradient"
        )
        return np.asarray(g, dtype=np.float64)

    def full_loglik_hessian(self, theta: np.ndarray) -> np.ndarray:
        """``B_phi``: the full-data Hessian in ``phi`` at ``phi(theta)`` (one pass of ``p``
        batched directions)."""
        passes = self.passes
        chunk = int(max(256, min(passes.chunk_rows, HESSIAN_BLOCK_ELEMENTS // max(self.dim, 1))))
        hess = passes.rows.reduce(self._chunk_function("hessian"), (self(theta),), chunk, "Hessian")
        return symmetrised(np.asarray(hess, dtype=np.float64))

    def anchor(self, anchor: Anchor, order: int) -> InputAnchor:
        """The full-data sums in ``phi`` at ``anchor`` (kept for the last anchor and order: a
        re-centred anchor costs one gradient pass, a new curvature point a Hessian pass)."""
        last = self._last_anchor
        if last is not None and last[0] is anchor and last[1] == order:
            return last[2]
        hessian = np.zeros((self.dim, self.dim))  # first order: no curvature term
        if order >= 2:
            hessian = self._hessian_at(np.asarray(anchor.curvature_point, dtype=np.float64))
        sums = InputAnchor(self(anchor.theta), self.full_loglik_grad(anchor.theta), hessian)
        self._last_anchor = (anchor, order, sums)
        return sums

    def _hessian_at(self, point: np.ndarray) -> np.ndarray:
        cached = self._hessian_cache
        if cached is not None and np.array_equal(cached[0], point):
            return cached[1]
        hessian = self.full_loglik_hessian(point)
        self._hessian_cache = (point.copy(), hessian)
        return hessian

    def control_variate_sum(
        self, theta: np.ndarray, anchor: Anchor, order: int
    ) -> tuple[float, np.ndarray]:
        """``sum_k q_k(theta)`` over all rows, expanded in ``phi``, and its gradient in
        ``theta``: ``l(theta*) + A_phi . Delta + 1/2 Delta' B_phi Delta`` (up to ``order``)."""
        value, gradient = float(anchor.loglik), np.zeros_like(theta)
        if order < 1:
            return value, gradient
        sums = self.anchor(anchor, order)
        extra, gradient = self._cv_sum_fn(
            theta, anchor.theta, sums.loglik_grad, sums.loglik_hessian
        )
        return value + float(extra), np.asarray(gradient, dtype=np.float64)


def _frontier(graph: Variable, theta: Variable, row_inputs: list[Variable]) -> list[Variable]:
    """The variables that depend on ``theta`` and not on the rows, read by a node that does
    depend on the rows (in graph order, each once)."""
    order = io_toposort([theta, *row_inputs], [graph])
    on_theta, on_rows = {theta}, set(row_inputs)
    for node in order:
        if any(i in on_theta for i in node.inputs):
            on_theta.update(node.outputs)
        if any(i in on_rows for i in node.inputs):
            on_rows.update(node.outputs)
    frontier: list[Variable] = []
    for node in order:
        if not any(o in on_rows for o in node.outputs):
            continue
        for var in node.inputs:
            if var in on_theta and var not in on_rows and var not in frontier:
                frontier.append(var)
    return frontier


def _true_like(var: Variable) -> Variable:
    """A constant True of ``var``'s type (a scalar or a tensor of static shape)."""
    if isinstance(var.type, ScalarType):
        return scalar_constant(True, dtype="bool")
    if any(dim is None for dim in var.type.shape):
        raise _NotAvailable("the likelihood reads a parameter check of unknown shape")
    return pt.constant(np.ones(var.type.shape, dtype=bool))


class _NotAvailable(Exception):
    """The expansion in the likelihood inputs cannot be built (the message says why)."""


def _is_selection(var: Variable, theta: Variable) -> bool:
    """Whether ``var`` is computed from ``theta`` by selections and reshapes only."""
    for node in io_toposort([theta], [var]):
        reads_theta = any(theta in ancestors([i]) for i in node.inputs)
        if reads_theta and not isinstance(node.op, _SELECTION_OPS):
            return False
    return True
