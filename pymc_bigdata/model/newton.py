"""The MAP search's Newton stage on the full data (:func:`newton_then_exact`), from the
optimum of the first stage's subsample: exact Newton (every pass reads the value, the
gradient and the Hessian), or, where the rows are in memory and many more than the
subsample's, a search whose passes read one Hessian (:func:`_subsample_started_newton`);
Newton with a fixed precision (:func:`fixed_hessian_newton`) where exact Newton cannot start.
When a search stops is :mod:`pymc_bigdata.model.newton_stop`'s.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import scipy.linalg
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.model.map_result import (
    MapResult,
    dense_diagnostics,
    posterior_precision,
    symmetrised,
)
from pymc_bigdata.model.newton_stop import (
    FINAL_STEP_DECREMENT,
    FINAL_STEP_FROM,
    MAP_NEWTON_TOLERANCE,
    GradientChange,
    predicted_after_fixed_step,
    predicted_decrement,
    predicted_from_gradient_change,
    settled_decrement,
)
from pymc_bigdata.model.passes import FullDataPasses

__all__ = [
    "EXACT_NEWTON_PASSES",
    "HANDOVER_ROUNDS",
    "HANDOVER_STEPS",
    "INEXACT_FIRST_STEP_RATIO",
    "fixed_hessian_newton",
    "newton_then_exact",
    "subsample_precision",
]

#: passes at most of Newton with the exact full-data Hessian from the subsample's optimum
#: (:func:`_exact_newton`)
EXACT_NEWTON_PASSES = 8

#: where exact Newton fails at the subsample's optimum (the full-data posterior not concave
#: there), Newton steps with the subsample's Hessian this many at a time, then exact Newton
#: again, at most ``HANDOVER_ROUNDS`` times (:func:`newton_then_exact`)
HANDOVER_STEPS = 5
HANDOVER_ROUNDS = 4

#: the search that reads one Hessian (:func:`_subsample_started_newton`) runs where the rows
#: are in memory and at least this many times the subsample's: there a pass with the Hessian
#: is compute-bound (10^6 x 30: 0.32 s, 0.07 s without) and the subsample's Hessian costs at
#: most an eighth of one. From storage a pass costs its reads whatever it computes, and
#: exact Newton's quadratic steps need fewer of them
INEXACT_FIRST_STEP_RATIO = 8


def newton_then_exact(
    passes: FullDataPasses, theta: np.ndarray, sub_rows: list[np.ndarray]
) -> tuple[MapResult | None, int, np.ndarray]:
    """Exact Newton (:func:`_exact_newton`) from the subsample's optimum ``theta``; where it
    fails (the full-data posterior is not yet concave there, e.g. along a non-centred
    hierarchy's scales), ``HANDOVER_STEPS`` Newton steps with the subsample's Hessian, then
    exact Newton again from where they stopped, at most ``HANDOVER_ROUNDS`` times. On
    ``big_hier_logistic_noncentred`` (10^5 rows) the exact Hessian is positive definite
    after 3 such steps, where the fixed-Hessian search alone crept on for 102 passes.
    Where the rows are in memory and at least ``INEXACT_FIRST_STEP_RATIO`` times the
    subsample's, the search that reads one Hessian (:func:`_subsample_started_newton`) goes
    first, exact Newton where it fails. Returns the result (None where every round failed),
    the passes made and where the fixed-Hessian steps got to (the caller's search goes on
    from there)."""
    precision, n_eval = None, 0
    n_rows, n_sub = passes.compiled.graph.n_rows, len(sub_rows[0])
    if passes.rows.in_memory and n_rows >= INEXACT_FIRST_STEP_RATIO * n_sub:
        precision = subsample_precision(passes, theta, sub_rows)
        result, n_eval = _subsample_started_newton(passes, theta, precision)
        if result is not None:
            return result, n_eval, theta
    result, tried = _exact_newton(passes, theta)
    n_eval += tried
    if result is not None:
        return replace(result, n_evaluations=n_eval), n_eval, theta
    if precision is None:
        precision = subsample_precision(passes, theta, sub_rows)
    for _ in range(HANDOVER_ROUNDS):
        theta, more = fixed_hessian_newton(passes, theta, precision, max_iter=HANDOVER_STEPS)
        result, tried = _exact_newton(passes, theta)
        n_eval += more + tried
        if result is not None:
            return replace(result, n_evaluations=n_eval), n_eval, theta
    return None, n_eval, theta


def _exact_newton(passes: FullDataPasses, theta: np.ndarray) -> tuple[MapResult | None, int]:
    """Newton from the subsample's optimum ``theta`` with the exact full-data Hessian: one
    pass per step, reading the value, the gradient and the Hessian together. It stops

    * where the next step is predicted to land within ``FINAL_STEP_DECREMENT`` of the mode
      (:func:`predicted_decrement`, from within ``FINAL_STEP_FROM``): the mode is the point
      after that step, taken without a pass to check it, and the full-data sums, the
      Hessian and the anchor stay at the last point evaluated (``MapResult.sums_point``);
    * where the decrement is below what the log density can resolve
      (:func:`settled_decrement`): the mode is the last point evaluated;
    * after ``EXACT_NEWTON_PASSES`` passes, at the last point evaluated (where the decrement
      is still large, :func:`find_map` polishes it).

    None where a step lowers the log posterior, leaves the support or meets a Hessian that
    is not negative definite: the caller searches with a fixed Hessian instead. Returns the
    result and the passes made.

    From the optimum on ``chunk_rows`` rows, a few posterior sds from the mode when N is
    large, Newton converges quadratically: 2 passes at 10^6 rows, d = 30 (4 when each step
    was checked by a pass, 8 with the fixed-Hessian search).
    """
    compiled, lp, n_eval, previous = passes.compiled, -math.inf, 0, math.inf
    while n_eval < EXACT_NEWTON_PASSES:
        n_eval += 1
        try:
            loglik, loglik_grad, loglik_hess = passes.full_loglik_grad_hessian(theta)
            loglik_hess = symmetrised(loglik_hess)
            precision = posterior_precision(loglik_hess, compiled.prior_hessian(theta))
            factor = scipy.linalg.cho_factor(precision)
            prior_lp, prior_grad = compiled.prior_logp_grad(theta)
        except (ParameterValueError, np.linalg.LinAlgError, ValueError):
            return None, n_eval
        new_lp, grad_lp = loglik + prior_lp, loglik_grad + prior_grad
        if not (np.isfinite(new_lp) and new_lp >= lp - 1e-9 * abs(new_lp)):
            return None, n_eval
        lp, step = new_lp, scipy.linalg.cho_solve(factor, grad_lp)
        decrement, point = float(grad_lp @ step), theta
        if decrement <= settled_decrement(lp):
            mode, mode_lp, mode_decrement = point, lp, decrement
            break
        theta = theta + step
        mode, mode_lp = theta, lp + 0.5 * decrement  # the quadratic model's rise
        mode_decrement = predicted_decrement(previous, decrement)
        if decrement <= FINAL_STEP_FROM and mode_decrement <= FINAL_STEP_DECREMENT:
            break
        previous = decrement
    else:
        mode, mode_lp, mode_decrement = point, lp, decrement  # passes ran out: the last one read
    min_curv = dense_diagnostics(precision, grad_lp)[1]
    result = MapResult(
        theta=mode,
        logp=mode_lp,
        loglik_grad=loglik_grad,
        loglik=loglik,
        hessian=precision,
        n_evaluations=n_eval,
        loglik_hessian=loglik_hess,
        hessian_point=point,
        newton_decrement=mode_decrement,
        min_curvature=min_curv,
        sums_point=point,
    )
    return result, n_eval


class _Evaluation(NamedTuple):
    """The full-data log posterior at a point: value, gradient, and the log-likelihood's
    parts (its Hessian, and the posterior precision, where the pass read it)."""

    lp: float
    grad: np.ndarray
    loglik: float
    loglik_grad: np.ndarray
    loglik_hess: np.ndarray | None = None
    precision: np.ndarray | None = None


def _evaluate(passes: FullDataPasses, theta: np.ndarray, hessian: bool) -> _Evaluation | None:
    """One full-data pass at ``theta`` (with the Hessian where asked); None where a parameter
    leaves its support or the value is not finite."""
    compiled = passes.compiled
    try:
        if hessian:
            loglik, loglik_grad, loglik_hess = passes.full_loglik_grad_hessian(theta)
            loglik_hess = symmetrised(loglik_hess)
            precision = posterior_precision(loglik_hess, compiled.prior_hessian(theta))
        else:
            loglik, loglik_grad = passes.full_loglik_grad(theta)
            loglik_hess = precision = None
        prior_lp, prior_grad = compiled.prior_logp_grad(theta)
    except ParameterValueError:
        return None
    lp = loglik + prior_lp
    if not np.isfinite(lp):
        return None
    return _Evaluation(lp, loglik_grad + prior_grad, loglik, loglik_grad, loglik_hess, precision)


def _cholesky(precision: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """``cho_factor(precision)``; None where it is not positive definite or not finite."""
    try:
        return scipy.linalg.cho_factor(precision)
    except (np.linalg.LinAlgError, ValueError):
        return None


def _rose(after: _Evaluation | None, before: _Evaluation) -> bool:
    """Whether a step did not lower the log posterior (up to its rounding)."""
    return after is not None and after.lp >= before.lp - 1e-9 * abs(after.lp)


def _subsample_started_newton(
    passes: FullDataPasses, theta: np.ndarray, start_precision: np.ndarray
) -> tuple[MapResult | None, int]:
    """Newton from the subsample's optimum ``theta`` whose passes read one Hessian.

    Pass 1 reads the value and gradient and steps with ``start_precision`` (the subsample's
    Hessian, scaled by N/n); pass 2 reads the Hessian too, the Laplace precision; the later
    passes read the value and gradient and step with that Hessian. The search stops where
    the decrement is settled (:func:`settled_decrement`) or the next step is forecast to land
    within ``FINAL_STEP_DECREMENT`` (from within ``FINAL_STEP_FROM``) — forecast from the
    gradient's change along the step just taken (:func:`predicted_from_gradient_change`
    after the first, :func:`predicted_after_fixed_step` after the others: the decrement
    rule of :func:`predicted_decrement` would read an inexact Hessian's error as third
    derivatives) — or after ``EXACT_NEWTON_PASSES`` passes. None where a step lowers the
    log posterior or a precision is not positive definite (the caller then starts exact
    Newton). Returns the result and the passes made.
    """
    before = _evaluate(passes, theta, hessian=False)
    factor = _cholesky(start_precision)
    if before is None or factor is None:
        return None, 1
    step = scipy.linalg.cho_solve(factor, before.grad)
    theta = theta + step
    at, n_eval = _evaluate(passes, theta, hessian=True), 2
    if not _rose(at, before) or (factor := _cholesky(at.precision)) is None:
        return None, n_eval
    hessian_point, loglik_hess = theta, at.loglik_hess
    forecast = predicted_from_gradient_change
    while True:
        previous, step = (before.grad, step), scipy.linalg.cho_solve(factor, at.grad)
        decrement, point = float(at.grad @ step), theta
        if decrement <= settled_decrement(at.lp) or n_eval >= EXACT_NEWTON_PASSES:
            mode, mode_lp, mode_decrement = point, at.lp, decrement
            break
        theta = theta + step
        mode, mode_lp = theta, at.lp + 0.5 * decrement  # the quadratic model's rise
        mode_decrement = forecast(GradientChange(*previous, at.grad, at.precision, factor))
        if decrement <= FINAL_STEP_FROM and mode_decrement <= FINAL_STEP_DECREMENT:
            break
        before, at, n_eval = at, _evaluate(passes, theta, hessian=False), n_eval + 1
        if not _rose(at, before):
            return None, n_eval
        at, forecast = at._replace(precision=before.precision), predicted_after_fixed_step
    result = MapResult(
        theta=mode,
        logp=mode_lp,
        loglik_grad=at.loglik_grad,
        loglik=at.loglik,
        hessian=at.precision,
        n_evaluations=n_eval,
        loglik_hessian=loglik_hess,
        hessian_point=hessian_point,
        newton_decrement=mode_decrement,
        min_curvature=dense_diagnostics(at.precision, at.grad)[1],
        sums_point=point,
    )
    return result, n_eval


def subsample_precision(
    passes: FullDataPasses, theta: np.ndarray, sub_rows: list[np.ndarray]
) -> np.ndarray:
    """The posterior precision at ``theta`` with the log-likelihood Hessian of ``sub_rows``
    scaled by N/n."""
    compiled = passes.compiled
    scale = compiled.graph.n_rows / len(sub_rows[0])
    loglik_hess = scale * _chunked_hessian(passes, theta, sub_rows)
    return posterior_precision(loglik_hess, compiled.prior_hessian(theta))


def _chunked_hessian(
    passes: FullDataPasses, theta: np.ndarray, rows: list[np.ndarray]
) -> np.ndarray:
    """The log-likelihood Hessian of ``rows`` summed over blocks of bounded memory."""
    dim = passes.compiled.graph.dim
    out = np.zeros((dim, dim))
    step = passes.hessian_chunk_rows()
    for start in range(0, len(rows[0]), step):
        out += passes.compiled.loglik_hessian(theta, [r[start : start + step] for r in rows])
    return out


def fixed_hessian_newton(
    passes: FullDataPasses, theta: np.ndarray, precision: np.ndarray, max_iter: int = 50
) -> tuple[np.ndarray, int]:
    """Full-data Newton iterations with a fixed (approximate) precision matrix."""
    n_eval = 1
    lp, g = _checked_logp_grad(passes, theta)
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
        if float(g @ step) < MAP_NEWTON_TOLERANCE or not np.all(np.isfinite(step)):
            break
        for _halving in range(30):
            new_lp, new_g = _checked_logp_grad(passes, theta + step)
            n_eval += 1
            if np.isfinite(new_lp) and new_lp >= lp - 1e-9 * abs(lp):
                break
            step = 0.5 * step
        else:
            break
        theta, lp, g = theta + step, new_lp, new_g
    return theta, n_eval


def _checked_logp_grad(passes: FullDataPasses, theta: np.ndarray) -> tuple[float, np.ndarray]:
    """The full-data log posterior and gradient, ``-inf`` where a parameter leaves its
    support."""
    try:
        return passes.full_logp_grad(theta)
    except ParameterValueError:
        return -math.inf, np.full(passes.compiled.graph.dim, np.nan)
