"""The MAP and the Laplace fit: the mode of the full-data log posterior and its curvature.

:func:`find_map` searches for the mode (L-BFGS on a subsample, then Newton on the full data,
with the exact Hessian up to ``DENSE_PRECONDITIONER_DIM`` parameters:
:mod:`pymc_bigdata.model.newton`) and returns a :class:`MapResult`
(:mod:`pymc_bigdata.model.map_result`) whose ``problem`` says when the point is no usable
mode.
"""

from __future__ import annotations

import math

import numpy as np
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM, PRIOR_DIAGONAL_MAX_DIM
from pymc_bigdata.model.map_result import (
    MAP_DECREMENT_TOLERANCE,
    MIN_RELATIVE_CURVATURE,
    MapResult,
    dense_diagnostics,
    diagonal_diagnostics,
    posterior_precision,
    symmetrised,
)
from pymc_bigdata.model.newton import (
    EXACT_NEWTON_PASSES,
    fixed_hessian_newton,
    newton_then_exact,
    subsample_precision,
)
from pymc_bigdata.model.newton_stop import (
    MAP_NEWTON_TOLERANCE,
    predicted_decrement,
    settled_decrement,
)
from pymc_bigdata.model.passes import FullDataPasses
from pymc_bigdata.model.quasi_newton import full_negative_logp, lbfgs, scaled_negative_logp

__all__ = [
    "DENSE_PRECONDITIONER_DIM",
    "EXACT_NEWTON_PASSES",
    "MAP_NEWTON_TOLERANCE",
    "MAP_DECREMENT_TOLERANCE",
    "MIN_RELATIVE_CURVATURE",
    "MapResult",
    "POLISH_STEPS",
    "find_map",
    "posterior_precision",
    "predicted_decrement",
    "settled_decrement",
    "symmetrised",
]

#: up to this many parameters the MAP search also computes the Hessian at the mode itself
DENSE_PRECONDITIONER_DIM = 200

#: Newton steps at most with the exact Hessian where the first Newton stage stopped short of
#: a mode (close to one it converges in a few; where there is none, e.g. a funnel's neck,
#: the bound keeps the cost to a few passes)
POLISH_STEPS = 10

#: the fixed subsample of the MAP search's first stage is drawn with this seed
SUBSAMPLE_SEED = 20140621


def find_map(
    passes: FullDataPasses, start: np.ndarray | None = None, maxiter: int = 500
) -> MapResult:
    """Maximise the full-data log posterior.

    1. Quasi-Newton (L-BFGS) on a fixed random subsample of at most ``chunk_rows`` rows,
       scaled by N/n (all rows when N is small): cheap, and lands within a few posterior
       standard deviations of the mode.
    2. Up to ``DENSE_PRECONDITIONER_DIM`` parameters: Newton with the exact full-data
       Hessian (:func:`~pymc_bigdata.model.newton.newton_then_exact`: one pass per step
       reads the value, the gradient and the Hessian together; where the rows are in
       memory and many, the first step with the subsample's Hessian and one Hessian read),
       until the Newton decrement is settled (:func:`settled_decrement`); the last Hessian
       read is the Laplace precision. Where a step lowers the log posterior (far from the
       mode), and from there up to ``DENSE_HESSIAN_MAX_DIM`` parameters: Newton steps on
       the full data (chunked gradients) with the subsample's Hessian, halving a step that
       does not increase the log posterior, until the Newton decrement ``g^T H^{-1} g`` is
       below ``MAP_NEWTON_TOLERANCE``; then the exact full-data Hessian at the mode. Where
       the Newton decrement there is still above ``MAP_DECREMENT_TOLERANCE`` (the fixed
       Hessian was a poor one), up to ``POLISH_STEPS`` Newton steps with that exact
       Hessian; beyond ``DENSE_HESSIAN_MAX_DIM``, where L-BFGS stopped short, L-BFGS again
       (:func:`_polish`).
       Beyond: L-BFGS on the full data, and a Hutchinson estimate of the Hessian's
       diagonal (no d x d matrix anywhere).
    3. Diagnostics (:attr:`MapResult.problem`): the Newton decrement at the end and the
       relative smallest curvature, so a caller can tell a mode from a point where the
       search gave up (an improper direction, a density unbounded at a boundary).

    Parameters
    ----------
    passes
        The model's full-data passes (and, through them, its compiled quantities).
    start
        Where the search starts (default: the model's initial point).
    maxiter
        L-BFGS iterations at most.

    Returns
    -------
    MapResult
    """
    graph, compiled = passes.compiled.graph, passes.compiled
    n_rows = graph.n_rows
    theta = graph.initial_theta if start is None else np.asarray(start, dtype=np.float64)
    n_sub = min(n_rows, passes.chunk_rows)
    sub_rows = (
        passes.rows.subsample(n_sub, np.random.default_rng(SUBSAMPLE_SEED))
        if n_sub < n_rows
        else next(passes.rows.chunks(n_rows))
    )
    theta = lbfgs(scaled_negative_logp(compiled, sub_rows, n_rows), theta, maxiter, n_rows)
    # the exact stage where the first one saw a subsample (with every row, its Hessian is
    # the full data's already) and a dense Hessian is allowed
    exact = n_sub < n_rows and graph.dim <= min(DENSE_PRECONDITIONER_DIM, DENSE_HESSIAN_MAX_DIM)
    result, n_exact, theta = (
        newton_then_exact(passes, theta, sub_rows) if exact else (None, 0, theta)
    )
    if result is None:
        theta, n_eval, hessian_point, loglik_hess = _refine(passes, theta, sub_rows, maxiter)
        result = _mode_result(passes, theta, n_exact + n_eval, hessian_point, loglik_hess)
    if MAP_DECREMENT_TOLERANCE < result.newton_decrement < math.inf:
        result = _polish(passes, result, maxiter)
    return result


def _polish(passes: FullDataPasses, result: MapResult, maxiter: int) -> MapResult:
    """A second full-data stage from where the first stopped short of a mode.

    Up to ``DENSE_HESSIAN_MAX_DIM`` parameters, Newton with a subsample's (or the start's)
    Hessian stopped short (a group with few rows, rarely in the subsample, makes that Hessian
    a poor one): up to ``POLISH_STEPS`` Newton steps with the exact Hessian where it stopped,
    already computed for the diagnostics. Beyond, L-BFGS stopped on its relative-reduction
    rule (``ftol``) a few thousandths of a log-density unit short in d = 4,004: L-BFGS again
    from there, on the gradient rule alone.
    """
    passes_before = result.n_evaluations
    if passes.compiled.graph.dim <= DENSE_HESSIAN_MAX_DIM:
        theta, more = fixed_hessian_newton(
            passes, result.theta, result.hessian, max_iter=POLISH_STEPS
        )
        return _mode_result(passes, theta, passes_before + more, theta, None)
    negative = full_negative_logp(passes)
    theta = lbfgs(negative, result.theta, maxiter, passes.compiled.graph.n_rows, ftol=0.0)
    return _mode_result(passes, theta, passes_before + maxiter, theta, None)


def _mode_result(
    passes: FullDataPasses,
    theta: np.ndarray,
    n_eval: int,
    hessian_point: np.ndarray,
    loglik_hess: np.ndarray | None,
) -> MapResult:
    """The :class:`MapResult` at ``theta``: the full-data log posterior, its gradient, the
    Laplace precision (from ``loglik_hess`` where given, else computed here) and the
    diagnostics; ``n_eval`` passes made before."""
    compiled, dim = passes.compiled, passes.compiled.graph.dim
    try:
        loglik, loglik_grad = passes.full_loglik_grad(theta)
        prior_lp, prior_grad = compiled.prior_logp_grad(theta)
    except ParameterValueError:  # ended where a parameter left its support: no mode
        nan = np.full(dim, np.nan)
        return MapResult(theta, -math.inf, nan, -math.inf, np.ones(dim), n_eval + 1)
    lp, grad_lp = loglik + prior_lp, loglik_grad + prior_grad
    if dim <= DENSE_HESSIAN_MAX_DIM:
        if loglik_hess is None:
            loglik_hess = symmetrised(passes.full_loglik_hessian(theta))
        precision = posterior_precision(loglik_hess, compiled.prior_hessian(theta))
        decrement, min_curv = dense_diagnostics(precision, grad_lp)
    else:
        prior_diag = (
            np.diag(compiled.prior_hessian(theta)) if dim <= PRIOR_DIAGONAL_MAX_DIM else 0.0
        )
        precision = -(passes.full_loglik_hessian_diagonal(theta) + prior_diag)
        decrement, min_curv = diagonal_diagnostics(precision, grad_lp)
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


def _refine(
    passes: FullDataPasses,
    theta: np.ndarray,
    sub_rows: list[np.ndarray],
    maxiter: int,
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray | None]:
    """The full-data stage of :func:`find_map` from the optimum ``theta`` on the subsample
    ``sub_rows`` (a block gather's whole blocks: about ``chunk_rows`` rows).

    Returns the new point, the full-data passes made, where the kept log-likelihood Hessian
    was (or is to be) taken, and that Hessian (None when it is to be computed at the new
    point, or never beyond ``DENSE_HESSIAN_MAX_DIM``).
    """
    compiled, dim = passes.compiled, passes.compiled.graph.dim
    if dim <= DENSE_PRECONDITIONER_DIM:  # cheap: subsample Hessian for Newton
        theta, n_eval = fixed_hessian_newton(
            passes, theta, subsample_precision(passes, theta, sub_rows)
        )
        return theta, n_eval, theta, None
    if dim <= DENSE_HESSIAN_MAX_DIM:  # one full Hessian, used by Newton and kept
        loglik_hess = symmetrised(passes.full_loglik_hessian(theta))
        # not symmetrised: Newton's fixed precision as it has always been formed
        precision = -(loglik_hess + compiled.prior_hessian(theta))
        new_theta, n_eval = fixed_hessian_newton(passes, theta, precision)
        return new_theta, n_eval, theta, loglik_hess
    new_theta = lbfgs(full_negative_logp(passes), theta, maxiter, compiled.graph.n_rows)
    return new_theta, maxiter, theta, None  # maxiter: an upper bound (scipy does not say)
