"""The gradient oracle's plain estimate as compiled code, for a compiled transition loop.

A kernel's loop in compiled code (:mod:`pymc_bigdata.kernels.baoab_compiled`) calls
``gradient_z(z, k, context)`` (:func:`make_gradient_z`) for the ``k``-th plain estimate of
its draw. It maps ``z`` to ``theta = c + L z``, copies the ``k``-th minibatch's rows into
buffers after the census rows, calls the model's gradient as PyTensor's Numba backend
compiled it (the jitted function behind
:attr:`~pymc_bigdata.model.compiled.CompiledModel.cv_grad_fn`, or ``grad_fn`` without
control variates), adds ``grad L(theta*)`` and maps back with ``L^T``: the arithmetic of
:meth:`~.gradient_oracle.MinibatchEstimator.gradient`, with no return to Python. The rows
of a draw's minibatches are read before the loop by the row source, as the Python loop
reads them (random rows in one gather, or windows of its shuffled copy:
:meth:`CompiledOracle.plan`), so the row source stays the only reader of the data.

Covered: plain or first-order control-variate estimates of a model compiled by the Numba
backend (PyTensor's default). :func:`unsupported_reason` says why a layer is not covered; a
second-order draw runs the Python loop (:meth:`CompiledGradient.covers`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import literal_unroll, njit

from pymc_bigdata.row_windows import WindowStarts
from pymc_bigdata.step_methods.gradient_oracle import GradientOracle, MinibatchEstimator

__all__ = [
    "CompiledGradient",
    "CompiledOracle",
    "make_gradient_z",
    "make_window_gradient_z",
    "unsupported_reason",
]


@njit
def _theta_dense(center, matrix, z):
    return center + matrix @ z


@njit
def _grad_z_dense(matrix, grad_theta):
    return matrix.T @ grad_theta


@njit
def _theta_diagonal(center, scale, z):
    return center + scale * z


@njit
def _grad_z_diagonal(scale, grad_theta):
    return scale * grad_theta


def make_gradient_z(model_grad: Any, dense: bool) -> Any:
    """The jitted ``gradient_z(z, k, context)``: the ``k``-th planned minibatch estimate of
    ``grad log p`` at ``z`` (z units), for the model's jitted gradient ``model_grad`` and a
    dense or diagonal ``L`` (compiled in, so that a call's arguments are arrays only).

    ``context`` is the tuple :meth:`CompiledGradient.plan` gives for rows.
    """
    to_theta = _theta_dense if dense else _theta_diagonal
    to_grad_z = _grad_z_dense if dense else _grad_z_diagonal

    @njit
    def gradient_z(z, k, context):
        (center, transform, anchor_args, anchor_grad, weights, held_args, batch, first_row,
         pairs, buffers) = context  # fmt: skip
        theta = to_theta(center, transform, z)
        for pair in literal_unroll(pairs):  # each array as (rows, values per row)
            gathered, buffer = pair
            for j in range(batch):
                for c in range(gathered.shape[1]):
                    buffer[first_row + j, c] = gathered[k * batch + j, c]
        g = model_grad(theta, *anchor_args, *buffers, weights, *held_args)[0] + anchor_grad
        return to_grad_z(transform, g)

    return gradient_z


@njit
def _window_1(arrays, start, stop):
    return (arrays[0][start:stop],)


@njit
def _window_2(arrays, start, stop):
    return (arrays[0][start:stop], arrays[1][start:stop])


@njit
def _window_3(arrays, start, stop):
    return (arrays[0][start:stop], arrays[1][start:stop], arrays[2][start:stop])


@njit
def _window_4(arrays, start, stop):
    return (
        arrays[0][start:stop],
        arrays[1][start:stop],
        arrays[2][start:stop],
        arrays[3][start:stop],
    )


#: the window's views of the copy's arrays, by their number (more: the rows are copied)
_WINDOW_VIEWS = {1: _window_1, 2: _window_2, 3: _window_3, 4: _window_4}


def make_window_gradient_z(model_grad: Any, dense: bool, n_arrays: int) -> Any:
    """:func:`make_gradient_z` for minibatches that are windows of the row source's
    shuffled copy and no census rows: the ``k``-th estimate reads its rows as views of the
    copy's ``n_arrays`` arrays (``context`` as :meth:`CompiledGradient.plan` gives it for
    a :class:`~pymc_bigdata.row_windows.WindowStarts`), copying nothing."""
    to_theta = _theta_dense if dense else _theta_diagonal
    to_grad_z = _grad_z_dense if dense else _grad_z_diagonal
    views_of = _WINDOW_VIEWS[n_arrays]

    @njit
    def gradient_z(z, k, context):
        (center, transform, anchor_args, anchor_grad, weights, held_args, arrays, starts,
         size) = context  # fmt: skip
        theta = to_theta(center, transform, z)
        views = views_of(arrays, starts[k], starts[k] + size)
        g = model_grad(theta, *anchor_args, *views, weights, *held_args)[0] + anchor_grad
        return to_grad_z(transform, g)

    return gradient_z


def _jitted(fn: Any) -> Any:
    """The Numba-jitted function behind a compiled PyTensor function (None if none)."""
    return getattr(getattr(fn, "vm", None), "jit_fn", None)


def unsupported_reason(layer: Any) -> str | None:
    """Why a layer's estimates cannot run in compiled code (None where they can)."""
    if _jitted(layer.compiled.grad_fn) is None:
        return "its model is not compiled by PyTensor's Numba backend"
    return None


class CompiledGradient:
    """A layer's minibatch gradient in compiled code: the model's jitted gradient functions
    and buffers for a minibatch's rows.

    Parameters
    ----------
    layer
        The model layer (:func:`unsupported_reason` must be None for it).
    """

    def __init__(self, layer: Any):
        reason = unsupported_reason(layer)
        if reason is not None:
            raise ValueError(f"The transition loop cannot be compiled: {reason}.")
        self._layer = layer
        #: (batch size, id of the census's first array): (the census arrays, the buffers)
        self._buffers: dict[tuple[int, int], tuple[Any, tuple[np.ndarray, ...]]] = {}
        self._gradients: dict[tuple[int, bool], tuple[Any, Any]] = {}

    @staticmethod
    def covers(estimator: MinibatchEstimator) -> bool:
        """Whether ``estimator``'s plain estimate is compiled here (not second order)."""
        return estimator.cv_order < 2

    def reads_views(self, estimator: MinibatchEstimator) -> bool:
        """Whether windows of the shuffled copy can be read as views of it (no census rows
        to put in front of them, at most four data arrays); else their rows are copied."""
        return estimator.census_rows is None and len(self._layer.rows.columns) in _WINDOW_VIEWS

    def plan(
        self,
        estimator: MinibatchEstimator,
        rows: list[np.ndarray] | WindowStarts,
        n_batches: int,
    ) -> tuple[Any, tuple]:
        """The jitted gradient (:func:`make_gradient_z` or, for windows read as views,
        :func:`make_window_gradient_z`) and its context for ``n_batches`` minibatches whose
        ``rows`` (each array's, one minibatch after the other, as the row source read them;
        or the windows' starts in the shuffled copy) are taken under ``estimator``'s
        settings (its anchor, weights, census rows and preconditioner)."""
        anchor = estimator.anchor
        compiled = self._layer.compiled
        fn = compiled.grad_fn if anchor is None else compiled.cv_grad_fn
        center, transform = estimator.precond.linear_map()
        common = (
            center,
            np.ascontiguousarray(transform),
            () if anchor is None else (anchor.theta,),
            np.zeros_like(center) if anchor is None else anchor.loglik_grad,
            estimator.weights,
            _held_values(fn),
        )
        dense = transform.ndim == 2
        if isinstance(rows, WindowStarts):
            context = (*common, tuple(rows.arrays), rows.starts, rows.size)
            return self._gradient_for(fn, dense, len(rows.arrays)), context
        batch = len(rows[0]) // n_batches
        buffers = self._buffers_for(estimator, rows, batch)
        context = (
            *common,
            batch,
            0 if estimator.census_rows is None else len(estimator.census_rows[0]),
            tuple((r.reshape(len(r), -1), b.reshape(len(b), -1)) for r, b in zip(rows, buffers)),
            buffers,
        )
        return self._gradient_for(fn, dense), context

    def _gradient_for(self, fn: Any, dense: bool, window_arrays: int = 0) -> Any:
        """:func:`make_gradient_z` (or :func:`make_window_gradient_z` for windows of
        ``window_arrays`` arrays) for a compiled function's jitted form (built once)."""
        jitted = _jitted(fn)
        key = (id(jitted), dense, window_arrays)
        if key not in self._gradients:  # the jitted function is kept: its id stays its own
            made = (
                make_window_gradient_z(jitted, dense, window_arrays)
                if window_arrays
                else make_gradient_z(jitted, dense)
            )
            self._gradients[key] = (jitted, made)
        return self._gradients[key][1]

    def _buffers_for(
        self, estimator: MinibatchEstimator, rows: list[np.ndarray], n: int
    ) -> tuple[np.ndarray, ...]:
        """Buffers of ``census + n`` rows per array (shaped and typed as ``rows``), the
        census rows in front (reused)."""
        census = estimator.census_rows
        n_census = 0 if census is None else len(census[0])
        key = (n, id(census[0]) if census is not None else 0)
        held = self._buffers.get(key)
        if held is None:  # the entry holds its census, so no other array can take its id
            buffers = tuple(np.empty((n_census + n, *r.shape[1:]), dtype=r.dtype) for r in rows)
            for buffer, census_rows in zip(buffers, census or ()):
                buffer[:n_census] = census_rows
            held = self._buffers[key] = (census or (None,), buffers)
        return held[1]


def _held_values(fn: Any) -> tuple[np.ndarray, ...]:
    """The current values of a compiled function's implicit inputs (the held variables'
    shared vector), which its jitted function takes after the explicit ones."""
    return tuple(
        storage.data for spec, storage in zip(fn.maker.inputs, fn.input_storage) if spec.implicit
    )


class CompiledOracle:
    """A draw's gradient oracle with its plain estimates in compiled code: what
    :func:`~pymc_bigdata.kernels.baoab_compiled.compiled_baoab_steps` asks of it.

    Parameters
    ----------
    oracle
        The draw's oracle (it draws the minibatches and keeps the record).
    compiled
        The layer's compiled gradient.
    """

    def __init__(self, oracle: GradientOracle, compiled: CompiledGradient):
        self.oracle, self._compiled = oracle, compiled

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """A plain estimate at ``z`` from Python (the oracle's own)."""
        return self.oracle(z)

    def plan(self, n_calls: int) -> tuple[Any, tuple]:
        """The jitted estimate (:func:`make_gradient_z`) and its context for the next
        ``n_calls`` plain estimates."""
        estimator = self.oracle.estimator
        if self._compiled.reads_views(estimator):
            rows = self.oracle.draw_windows(n_calls)
        else:
            rows = self.oracle.draw_rows(n_calls)
        return self._compiled.plan(estimator, rows, n_calls)

    def last_is_plain(self) -> bool:
        """Whether the draw's last estimate is a plain one (it does not measure)."""
        return not self.oracle.last_measures

    def finished(self, z: np.ndarray, g: np.ndarray) -> None:
        """The last compiled estimate: ``g`` at ``z``, recorded by the oracle."""
        self.oracle.computed(z, g)
