"""The compiled quantities of a :class:`~pymc_bigdata.model.graph.ModelGraph`.

Every graph is built and compiled lazily, once per model, and shared by every sampler built
on it: the log prior, the summed log-likelihood of given rows, the minibatch estimates (with
or without the control-variate anchor, first or second order), per-row terms, forward-mode
directional derivatives, per-row gradients, Hessian-vector products and dense Hessians.
:func:`compile_function` is the one way the package compiles a graph; a
:class:`ChunkFunction` is a compiled per-chunk function that can travel to dask workers.
Pickled, a :class:`CompiledModel` keeps its graphs and drops its compiled functions (rebuilt
lazily, fast from PyTensor's compile cache). A graph computing what one compiled earlier in
the process computed gets that function back (:mod:`pymc_bigdata.model.function_cache`).
"""

from __future__ import annotations

import os
import threading
import uuid
from functools import cached_property

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile import Function
from pytensor.gradient import grad, pushforward
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace, graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.model.function_cache import FunctionCache
from pymc_bigdata.model.graph import ModelGraph
from pymc_bigdata.model.prior_hessian import hessian_by_differences, holds_linear_algebra

__all__ = ["ChunkFunction", "CompiledModel", "compile_function", "strict_floats"]

#: PyTensor flags every function of the package is compiled under. PyTensor's Numba backend
#: compiles with LLVM's fast-math flags by default (``reassoc``, ``contract``, ...), so the
#: order of a sum's terms was LLVM's choice, and it chose differently when a function was
#: compiled fresh than when its parts came from the compile cache: the same
#: ``random_seed`` gave another MAP and other draws with a cold and a warm cache (measured on
#: ``two_level_logistic``: the log prior differed in its last 3 ulp, the MAP in the 8th
#: digit). With IEEE semantics the result no longer depends on the cache. Measured cost on
#: the README demo (1e6 rows, d = 30): none (sampling 3.2 s either way).
STRICT_FLOAT_FLAGS = {"numba__fastmath": False}


def strict_floats():
    """A context in which PyTensor compiles with :data:`STRICT_FLOAT_FLAGS`."""
    return pytensor.config.change_flags(**STRICT_FLOAT_FLAGS)


#: every function :func:`compile_function` compiled on this process, by what its graph computes
FUNCTIONS = FunctionCache()

#: functions compiled on this process for ChunkFunctions that arrived pickled (dask workers),
#: one per thread (a compiled function is not thread-safe)
_WORKER_FUNCTIONS: dict[tuple, Function] = {}


def compile_function(
    inputs: list[Variable], outputs: Variable | list[Variable], mode: str | None
) -> Function:
    """Compile ``outputs`` of ``inputs``; the result trusts its inputs' types (no checks).

    A graph that computes what an earlier one of this process computed gets that compiled
    function (:data:`FUNCTIONS`), without PyTensor's rewrites and Numba's compile.
    """
    config = pytensor.config
    single = isinstance(outputs, Variable)
    context = (mode, single, config.mode, config.linker, config.optimizer, config.floatX)

    def compile_new() -> Function:
        with strict_floats():
            fn = pytensor.function(
                inputs, outputs, mode=mode, on_unused_input="ignore", trust_input=False
            )
        fn.trust_input = True
        return fn

    return FUNCTIONS.get(inputs, [outputs] if single else outputs, context, compile_new)


class ChunkFunction:
    """A compiled per-chunk function that can travel to dask workers.

    Called here it is the compiled function given. Pickled, it carries its graphs (and the
    held values they read) instead, and a worker compiles them once per thread that calls it
    (a Dask worker runs its tasks in threads; a compiled function is not thread-safe).
    """

    def __init__(self, inputs: list, outputs: list, mode, compiled=None):
        self.inputs, self.outputs, self.mode = inputs, outputs, mode
        #: the compiled function of each thread that called it
        self.compiled: dict[int, Function] = {}
        if compiled is not None:
            self.compiled[threading.get_ident()] = compiled
        self.key = (id(self), os.getpid(), uuid.uuid4().hex)

    @classmethod
    def compile(cls, inputs: list, outputs: list, mode) -> ChunkFunction:
        """Compile ``outputs`` (one array, or a list of several) here."""
        single = outputs if len(outputs) > 1 else outputs[0]
        return cls(inputs, outputs, mode, compile_function(inputs, single, mode))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["compiled"] = {}
        return state

    def __call__(self, *args):
        thread = threading.get_ident()
        if thread not in self.compiled:
            self.compiled[thread] = self._compile_here(thread)
        out = self.compiled[thread](*args)
        return out if len(self.outputs) > 1 else out[0] if isinstance(out, list) else out

    def _compile_here(self, thread: int) -> Function:
        """This thread's function of the graphs (once per process and thread)."""
        held = [
            v.get_value(borrow=True).tobytes()
            for v in ancestors(self.outputs)
            if isinstance(v, TensorSharedVariable)
        ]
        key = (self.key, thread, *held)
        if key not in _WORKER_FUNCTIONS:
            with strict_floats():
                _WORKER_FUNCTIONS[key] = pytensor.function(
                    self.inputs, self.outputs, mode=self.mode, on_unused_input="ignore"
                )
        return _WORKER_FUNCTIONS[key]


class CompiledModel:
    """The graphs and compiled functions of one :class:`ModelGraph` (all lazy).

    Parameters
    ----------
    graph
        The model's row log-likelihood and log-prior graphs.
    mode
        PyTensor compile mode (default: PyTensor's default, Numba).
    """

    def __init__(self, graph: ModelGraph, mode: str | pytensor.compile.Mode | None = None):
        self.graph = graph
        self.mode = mode

    def compile(self, inputs: list[Variable], outputs: Variable | list[Variable]) -> Function:
        """:func:`compile_function` in this model's mode."""
        return compile_function(inputs, outputs, self.mode)

    def __getstate__(self) -> dict:
        # Compiled functions are rebuilt lazily after unpickling (fast from the compile cache).
        state = self.__dict__.copy()
        for key in [k for k in state if k.endswith(("_fn", "_fns"))]:
            del state[key]
        return state

    def chunk_function(self, name: str) -> ChunkFunction:
        """The compiled ``<name>_fn`` with its graphs, to reduce over row blocks anywhere
        (a dask worker compiles it from the graphs, once)."""
        cache = self.__dict__.setdefault("_chunk_functions", {})
        if name not in cache:
            cache[name] = ChunkFunction(
                *getattr(self, f"{name}_graphs"), self.mode, getattr(self, f"{name}_fn")
            )
        return cache[name]

    # ------------------------------------------------------------------ numbers
    def prior_logp(self, theta: np.ndarray) -> float:
        """Log prior (with Jacobians of the transforms), without its gradient."""
        return float(self.prior_logp_fn(theta))

    def prior_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior (with Jacobians of the transforms) and its gradient."""
        lp, g = self.prior_logp_grad_fn(theta)
        return float(lp), g

    def loglik_grad(self, theta: np.ndarray, rows: list[np.ndarray]) -> tuple[float, np.ndarray]:
        """Summed log-likelihood of the given rows and its gradient."""
        lp, g = self.loglik_grad_fn(theta, *rows)
        return float(lp), g

    def row_logp(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row log-likelihood terms ``l_i(theta)``, shape (n,)."""
        return self.row_logp_fn(theta, *rows)

    def row_directional_derivatives(
        self, theta: np.ndarray, direction: np.ndarray, rows: list[np.ndarray]
    ) -> np.ndarray:
        """``direction . grad l_i(theta)`` for every given row, shape (n,), by forward mode."""
        return self.row_jvp_fn(theta, np.asarray(direction, dtype=np.float64), *rows)

    def loglik_hessian(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Dense Hessian (d, d) of the summed log-likelihood of the given rows."""
        return self.hessian_fn(theta, *rows)

    def prior_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Dense Hessian (d, d) of the log prior: exact (:attr:`prior_hessian_fn`), or by
        central differences of the compiled gradient where the prior holds linear algebra
        (:attr:`prior_hessian_by_differences`, :mod:`~pymc_bigdata.model.prior_hessian`)."""
        if self.prior_hessian_by_differences:
            return hessian_by_differences(lambda x: self.prior_logp_grad_fn(x)[1], theta)
        return self.prior_hessian_fn(theta)

    @cached_property
    def prior_hessian_by_differences(self) -> bool:
        """Whether :meth:`prior_hessian` reads the Hessian by differences: the prior holds
        linear algebra, whose exact Hessian graph is slow to compile."""
        return holds_linear_algebra(self.graph.prior_graph, self.graph.theta)

    # ------------------------------------------------------------------ prior and sums
    @cached_property
    def prior_logp_fn(self) -> Function:
        """``(theta) -> log prior``."""
        return self.compile([self.graph.theta], self.graph.prior_graph)

    @cached_property
    def prior_logp_grad_fn(self) -> Function:
        """``(theta) -> [log prior, its gradient]``."""
        prior, theta = self.graph.prior_graph, self.graph.theta
        return self.compile([theta], [prior, grad(prior, theta)])

    @cached_property
    def loglik_grad_graphs(self) -> tuple[list, list]:
        """Inputs and outputs of :attr:`loglik_grad_fn`."""
        g = self.graph
        total = g.row_logp_graph.sum()
        return [g.theta, *g.row_inputs], [total, grad(total, g.theta)]

    @cached_property
    def loglik_grad_fn(self) -> Function:
        """``(theta, *rows) -> [sum_i l_i, its gradient]``."""
        return self.compile(*self.loglik_grad_graphs)

    # ------------------------------------------------------------------ estimates
    @cached_property
    def weights(self) -> pt.TensorVariable:
        """Per-row weights of a minibatch sum (N/n for a uniform sample)."""
        return pt.vector("row_weights", dtype="float64")

    @cached_property
    def _anchor_row_logp_graph(self) -> pt.TensorVariable:
        return clone_replace(self.graph.row_logp_graph, {self.graph.theta: self.graph.anchor})

    def _estimate_graph(self, control_variates: bool) -> pt.TensorVariable:
        """prior + sum_i w_i l_i, or with control variates prior + sum_i w_i [l_i - l_i*]."""
        rows = self.graph.row_logp_graph
        if control_variates:
            rows = rows - self._anchor_row_logp_graph
        return self.graph.prior_graph + (self.weights * rows).sum()

    def _estimate_grad_graph(self, control_variates: bool) -> pt.TensorVariable:
        g, weights = self.graph, self.weights
        gradient = grad(g.prior_graph, g.theta) + grad((weights * g.row_logp_graph).sum(), g.theta)
        if control_variates:
            gradient = gradient - grad((weights * self._anchor_row_logp_graph).sum(), g.anchor)
        return gradient

    def _estimate_inputs(self, control_variates: bool) -> list[pt.TensorVariable]:
        anchor = [self.graph.anchor] if control_variates else []
        return [self.graph.theta, *anchor, *self.graph.row_inputs, self.weights]

    def _estimate_fn(self, control_variates: bool, value: bool, gradient: bool) -> Function:
        outputs = [self._estimate_graph(control_variates)] if value else []
        if gradient:
            outputs.append(self._estimate_grad_graph(control_variates))
        single = outputs if len(outputs) > 1 else outputs[0]
        return self.compile(self._estimate_inputs(control_variates), single)

    @cached_property
    def grad_fn(self) -> Function:
        """``(theta, *rows, weights) -> grad prior + sum_i w_i grad l_i``."""
        return self._estimate_fn(False, value=False, gradient=True)

    @cached_property
    def cv_grad_fn(self) -> Function:
        """``(theta, anchor, *rows, weights)``: the control-variate gradient, without
        ``grad L(theta*)``."""
        return self._estimate_fn(True, value=False, gradient=True)

    @cached_property
    def logp_est_fn(self) -> Function:
        """``(theta, *rows, weights) -> prior + sum_i w_i l_i``."""
        return self._estimate_fn(False, value=True, gradient=False)

    @cached_property
    def cv_logp_est_fn(self) -> Function:
        """``(theta, anchor, *rows, weights) -> prior + sum_i w_i [l_i - l_i*]``."""
        return self._estimate_fn(True, value=True, gradient=False)

    @cached_property
    def logp_grad_est_fn(self) -> Function:
        """:attr:`logp_est_fn` and :attr:`grad_fn` from one call."""
        return self._estimate_fn(False, value=True, gradient=True)

    @cached_property
    def cv_logp_grad_fn(self) -> Function:
        """:attr:`cv_logp_est_fn` and :attr:`cv_grad_fn` from one call."""
        return self._estimate_fn(True, value=True, gradient=True)

    @cached_property
    def curvature_point(self) -> pt.TensorVariable:
        """The symbolic point where second-order control variates take the rows' Hessian."""
        return pt.vector("theta_curvature", dtype="float64")

    @cached_property
    def _cv2_graphs(self) -> tuple[list, list]:
        """Inputs, and outputs (first-order CV value, gradient, and
        ``sum_i w_i H_i(theta_h) (theta - theta*)``, the minibatch part of the second-order
        correction) of the second-order estimate."""
        g, point = self.graph, self.curvature_point
        at_h = clone_replace(g.row_logp_graph, {g.theta: point})
        grad_at_h = grad((self.weights * at_h).sum(), point)
        hvp = pushforward(grad_at_h, point, g.theta - g.anchor)
        outputs = [self._estimate_graph(True), self._estimate_grad_graph(True), hvp]
        inputs = [g.theta, g.anchor, point, *g.row_inputs, self.weights]
        return inputs, outputs

    @cached_property
    def cv2_parts_fn(self) -> Function:
        """``(theta, anchor, curvature point, *rows, weights)``: the first-order
        control-variate value and gradient, and ``sum_i w_i H_i(theta_h) (theta - theta*)``."""
        inputs, outputs = self._cv2_graphs
        return self.compile(inputs, outputs)

    @cached_property
    def cv2_grad_parts_fn(self) -> Function:
        """:attr:`cv2_parts_fn` without the value (which costs about as much as the gradient)."""
        inputs, outputs = self._cv2_graphs
        return self.compile(inputs, outputs[1:])

    # ------------------------------------------------------------------ per-row terms
    @cached_property
    def row_logp_fn(self) -> Function:
        """``(theta, *rows) -> l_i(theta)``, shape (n,)."""
        g = self.graph
        return self.compile([g.theta, *g.row_inputs], g.row_logp_graph)

    @cached_property
    def _row_jvp_graph(self) -> pt.TensorVariable:
        return pushforward(self.graph.row_logp_graph, self.graph.theta, self.graph.direction)

    @cached_property
    def row_jvp_fn(self) -> Function:
        """``(theta, direction, *rows) -> direction . grad l_i(theta)``, shape (n,)."""
        g = self.graph
        return self.compile([g.theta, g.direction, *g.row_inputs], self._row_jvp_graph)

    @cached_property
    def directional_grad_fns(self) -> dict[bool, Function]:
        """The prior's directional derivative, the rows' ones (minus the anchor's) and the
        weighted gradient estimate of :attr:`grad_fn` (:attr:`cv_grad_fn` with an anchor) on
        the same rows, one call: ``(theta, [anchor,] direction, *rows, weights)``."""
        g = self.graph
        prior = pushforward(g.prior_graph, g.theta, g.direction)
        rows = self._row_jvp_graph
        plain = [g.theta, g.direction, *g.row_inputs, self.weights]
        anchored = [g.theta, g.anchor, g.direction, *g.row_inputs, self.weights]
        residual = rows - clone_replace(rows, {g.theta: g.anchor})
        return {
            False: self.compile(plain, [prior, rows, self._estimate_grad_graph(False)]),
            True: self.compile(anchored, [prior, residual, self._estimate_grad_graph(True)]),
        }

    @cached_property
    def row_grads_fn(self) -> Function:
        """``(theta, *rows) -> grad l_i(theta)``, shape (n, d)."""
        # A batch of forward-mode passes, one per coordinate: vectorising the pushforward
        # over its tangent turns each matrix-vector product into one matrix-matrix product.
        g = self.graph
        basis = pt.matrix("basis", dtype="float64")
        per_row = vectorize_graph(self._row_jvp_graph, {g.direction: basis})
        eye = pt.eye(g.theta.shape[0], dtype="float64")
        out = graph_replace(per_row, {basis: eye}).T
        return self.compile([g.theta, *g.row_inputs], out)

    # ------------------------------------------------------------------ curvature
    @cached_property
    def _hvp_graph(self) -> pt.TensorVariable:
        g = self.graph
        return pushforward(grad(g.row_logp_graph.sum(), g.theta), g.theta, g.direction)

    @cached_property
    def hvp_graphs(self) -> tuple[list, list]:
        """Inputs and outputs of :attr:`hvp_fn`."""
        g = self.graph
        return [g.theta, g.direction, *g.row_inputs], [self._hvp_graph]

    @cached_property
    def hvp_fn(self) -> Function:
        """``(theta, direction, *rows)``: the summed log-likelihood Hessian times ``direction``."""
        inputs, [out] = self.hvp_graphs
        return self.compile(inputs, out)

    @cached_property
    def hessian_graphs(self) -> tuple[list, list]:
        """Inputs and outputs of :attr:`hessian_fn`."""
        g = self.graph
        basis = pt.matrix("basis", dtype="float64")
        return [g.theta, *g.row_inputs], [self._basis_batched(self._hvp_graph, basis)]

    @cached_property
    def hessian_fn(self) -> Function:
        """``(theta, *rows)``: the summed log-likelihood's dense Hessian (d, d)."""
        inputs, [out] = self.hessian_graphs
        return self.compile(inputs, out)

    @cached_property
    def prior_hessian_fn(self) -> Function:
        """``(theta)``: the log prior's dense Hessian (d, d)."""
        g = self.graph
        prior_grad = grad(g.prior_graph, g.theta)
        basis = pt.matrix("basis", dtype="float64")
        hv = pushforward(prior_grad, g.theta, g.direction)
        return self.compile([g.theta], self._basis_batched(hv, basis))

    def _basis_batched(self, hvp: pt.TensorVariable, basis: pt.TensorVariable) -> pt.TensorVariable:
        """The Hessian-vector product ``hvp`` along every ``basis`` direction, evaluated at
        the identity: the dense matrix."""
        g = self.graph
        batched = vectorize_graph(hvp, {g.direction: basis})
        eye = pt.eye(g.theta.shape[0], dtype="float64")
        return graph_replace(batched, {basis: eye})
