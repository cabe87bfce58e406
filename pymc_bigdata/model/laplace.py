"""The MAP and the Laplace fit: the mode of the full-data log posterior and its curvature.

:func:`find_map` searches for the mode (L-BFGS on a subsample, then Newton on the full data,
with the exact Hessian up to ``DENSE_PRECONDITIONER_DIM`` parameters)
and returns a :class:`MapResult` whose ``problem`` says when the point is no usable mode.
:func:`posterior_precision` is the one place the package forms the posterior precision,
``-(H_loglik + H_prior)`` symmetrised, from the full-data log-likelihood Hessian and the
prior's; :func:`symmetrised` is the symmetric part of a Hessian computed by batched
Hessian-vector products (equal to it up to rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.linalg
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.newton_stop import (
    FINAL_STEP_DECREMENT,
    FINAL_STEP_FROM,
    MAP_NEWTON_TOLERANCE,
    predicted_decrement,
    predicted_from_gradient_change,
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

#: a MAP whose Newton decrement exceeds this (log-density units) is not a mode
MAP_DECREMENT_TOLERANCE = 1e-3

#: Newton steps at most with the exact Hessian where the first Newton stage stopped short of
#: a mode (close to one it converges in a few; where there is none, e.g. a funnel's neck,
#: the bound keeps the cost to a few passes)
POLISH_STEPS = 10

#: smallest eigenvalue of the Laplace precision relative to its largest for a usable mode
MIN_RELATIVE_CURVATURE = 1e-12

#: passes at most of Newton with the exact full-data Hessian from the subsample's optimum
#: (up to ``DENSE_PRECONDITIONER_DIM`` parameters; :func:`_exact_newton`)
EXACT_NEWTON_PASSES = 8

#: where exact Newton fails at the subsample's optimum (the full-data posterior not concave
#: there), Newton steps with the subsample's Hessian this many at a time, then exact Newton
#: again, at most ``HANDOVER_ROUNDS`` times (:func:`_newton_then_exact`)
HANDOVER_STEPS = 5
#: exact Newton's first step takes the subsample's Hessian (from a pass without the Hessian)
#: where the rows are in memory and at least this many times the subsample's: there a pass
#: with the Hessian is compute-bound (10^6 x 30: 0.32 s, 0.07 s without) and the subsample's
#: Hessian costs an eighth of one. Measured: the benchmark's MAP search 0.73 -> 0.50 s, the
#: same 2 passes; where it was tried on all rows, 1-3 more passes on hierarchies of 10^5
#: rows (a subsample of 65,536 rows, its Hessian no cheaper) and, read from storage (a
#: pass's cost its reads), it would add passes it cannot pay for
INEXACT_FIRST_STEP_RATIO = 8
HANDOVER_ROUNDS = 4

#: the fixed subsample of the MAP search's first stage is drawn with this seed
SUBSAMPLE_SEED = 20140621


def symmetrised(matrix: np.ndarray) -> np.ndarray:
    """``(M + M^T) / 2``: the symmetric part of a square matrix."""
    return 0.5 * (matrix + matrix.T)


def posterior_precision(loglik_hessian: np.ndarray, prior_hessian: np.ndarray) -> np.ndarray:
    """The posterior precision ``P = -(H_loglik + H_prior)``, symmetrised: ``(P + P^T) / 2``.

    Parameters
    ----------
    loglik_hessian : ndarray, shape (d, d)
        Hessian of the (full-data, or scaled subsample) summed log-likelihood.
    prior_hessian : ndarray, shape (d, d)
        Hessian of the log prior at the same point.

    Returns
    -------
    ndarray, shape (d, d)
        The negative Hessian of the log posterior, exactly symmetric.
    """
    precision = -(loglik_hessian + prior_hessian)
    return 0.5 * (precision + precision.T)


@dataclass(frozen=True)
class MapResult:
    """A MAP estimate with the curvature of the log posterior there.

    Attributes
    ----------
    theta : ndarray, shape (d,)
        The maximiser of the log posterior (unconstrained space).
    logp : float
        The log posterior at ``theta`` (where ``sums_point`` is not ``theta``: at
        ``sums_point`` plus the rise Newton's quadratic model predicts, half the decrement).
    loglik_grad : ndarray, shape (d,)
        Full-data gradient of the summed log-likelihood at ``sums_point`` (the control-variate
        anchor).
    loglik : float
        Full-data summed log-likelihood at ``sums_point``.
    hessian : ndarray, shape (d, d) or (d,)
        Negative Hessian of the log posterior at ``hessian_point`` (the Laplace precision);
        only its diagonal (shape (d,), a stochastic estimate) when
        ``d > DENSE_HESSIAN_MAX_DIM``.
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
        mode); near 0 at a mode, ``inf`` when ``H`` is not positive definite. Where the
        search's last Newton step was taken without a pass (``sums_point`` is not ``theta``),
        the decrement :func:`predicted_decrement` expects there.
    min_curvature : float
        Smallest eigenvalue of ``H`` relative to its largest (diagonal: smallest entry ratio).
    sums_point : ndarray, shape (d,), or None
        Where ``loglik`` and ``loglik_grad`` were read: ``theta`` itself (None), or, where the
        exact search took its last Newton step without a pass to check it
        (``FINAL_STEP_DECREMENT``), the point that step started from. The control variates
        are anchored there, where the full-data sums are exact.
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
    sums_point: np.ndarray | None = None

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


def find_map(
    passes: FullDataPasses, start: np.ndarray | None = None, maxiter: int = 500
) -> MapResult:
    """Maximise the full-data log posterior.

    1. Quasi-Newton (L-BFGS) on a fixed random subsample of at most ``chunk_rows`` rows,
       scaled by N/n (all rows when N is small): cheap, and lands within a few posterior
       standard deviations of the mode.
    2. Up to ``DENSE_PRECONDITIONER_DIM`` parameters: Newton with the exact full-data
       Hessian (:func:`_exact_newton`: one pass per step reads the value, the gradient and
       the Hessian together; the first step with the subsample's Hessian where that pays,
       ``INEXACT_FIRST_STEP_RATIO``), until the Newton decrement is settled
       (:func:`settled_decrement`); the last pass's Hessian is the Laplace precision. Where
       a step lowers the log posterior (far from the mode), and from there up to
       ``DENSE_HESSIAN_MAX_DIM`` parameters: Newton steps on the full data (chunked
       gradients) with the subsample's Hessian, halving a step that does not increase the
       log posterior, until the Newton decrement ``g^T H^{-1} g`` is below
       ``MAP_NEWTON_TOLERANCE``; then the exact full-data Hessian at the mode. Where the
       Newton decrement there is still above ``MAP_DECREMENT_TOLERANCE`` (the fixed Hessian
       was a poor one), up to ``POLISH_STEPS`` Newton steps with that exact Hessian;
       beyond ``DENSE_HESSIAN_MAX_DIM``, where L-BFGS stopped short, L-BFGS again
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
        _newton_then_exact(passes, theta, sub_rows) if exact else (None, 0, theta)
    )
    if result is None:
        theta, n_eval, hessian_point, loglik_hess = _refine(passes, theta, sub_rows, maxiter)
        result = _mode_result(passes, theta, n_exact + n_eval, hessian_point, loglik_hess)
    if MAP_DECREMENT_TOLERANCE < result.newton_decrement < math.inf:
        result = _polish(passes, result, maxiter)
    return result


def _newton_then_exact(
    passes: FullDataPasses, theta: np.ndarray, sub_rows: list[np.ndarray]
) -> tuple[MapResult | None, int, np.ndarray]:
    """Exact Newton (:func:`_exact_newton`) from the subsample's optimum ``theta``; where it
    fails (the full-data posterior is not yet concave there, e.g. along a non-centred
    hierarchy's scales), ``HANDOVER_STEPS`` Newton steps with the subsample's Hessian, then
    exact Newton again from where they stopped, at most ``HANDOVER_ROUNDS`` times. On
    ``big_hier_logistic_noncentred`` (10^5 rows) the exact Hessian is positive definite
    after 3 such steps, where the fixed-Hessian search alone crept on for 102 passes.
    Returns the result (None where every round failed), the passes made and where the
    fixed-Hessian steps got to (the caller's search goes on from there)."""
    precision = None
    if passes.rows.in_memory and passes.compiled.graph.n_rows >= INEXACT_FIRST_STEP_RATIO * len(
        sub_rows[0]
    ):
        precision = _subsample_precision(passes, theta, sub_rows)
    result, n_eval = _exact_newton(passes, theta, precision)
    if result is not None:
        return result, n_eval, theta
    if precision is None:
        precision = _subsample_precision(passes, theta, sub_rows)
    for _ in range(HANDOVER_ROUNDS):
        theta, more = _newton(passes, theta, precision, max_iter=HANDOVER_STEPS)
        result, tried = _exact_newton(passes, theta)
        n_eval += more + tried
        if result is not None:
            return replace(result, n_evaluations=n_eval), n_eval, theta
    return None, n_eval, theta


def _exact_newton(
    passes: FullDataPasses, theta: np.ndarray, start_precision: np.ndarray | None = None
) -> tuple[MapResult | None, int]:
    """Newton from the subsample's optimum ``theta`` with the exact full-data Hessian: one
    pass per step, reading the value, the gradient and the Hessian together.

    With ``start_precision`` (the subsample's, scaled by N/n) the first step is taken with
    it, from a pass that reads the value and the gradient alone: at 10^6 rows, d = 30, that
    pass takes 0.07 s where one with the Hessian takes 0.32 s, and it moves the point as
    far (decrements 388, then 0.033 after an exact step and about 0.07 after this one, both
    within ``FINAL_STEP_FROM``). Where the steps from there fail, the search starts again
    from ``theta`` with an exact first step (a subsample that misses a small group's rows
    gives a poor step along that group). It stops

    * where the next step is predicted to land within ``FINAL_STEP_DECREMENT`` of the mode
      (:func:`predicted_decrement`, from within ``FINAL_STEP_FROM``; after an inexact first
      step the prediction's constant is overestimated, never under): the mode is the point
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
    if start_precision is None:
        return _exact_newton_passes(passes, theta, None)
    result, n_eval = _exact_newton_passes(passes, theta, start_precision)
    if result is not None:
        return result, n_eval
    result, more = _exact_newton_passes(passes, theta, None)
    return result, n_eval + more


def _exact_newton_passes(
    passes: FullDataPasses, theta: np.ndarray, start_precision: np.ndarray | None
) -> tuple[MapResult | None, int]:
    """:func:`_exact_newton`'s passes, the first step with ``start_precision`` where given."""
    compiled, lp, n_eval, previous = passes.compiled, -math.inf, 0, math.inf
    inexact_step: tuple[np.ndarray, np.ndarray] | None = None  # (gradient there, step)
    while n_eval < EXACT_NEWTON_PASSES:
        n_eval += 1
        inexact = n_eval == 1 and start_precision is not None
        try:
            if inexact:
                loglik, loglik_grad = passes.full_loglik_grad(theta)
                precision = start_precision
            else:
                loglik, loglik_grad, loglik_hess = passes.full_loglik_grad_hessian(theta)
                loglik_hess = symmetrised(loglik_hess)
                precision = posterior_precision(loglik_hess, compiled.prior_hessian(theta))
            factor = scipy.linalg.cho_factor(precision)  # ValueError where not finite
            prior_lp, prior_grad = compiled.prior_logp_grad(theta)
        except (ParameterValueError, np.linalg.LinAlgError, ValueError):
            return None, n_eval
        new_lp, grad_lp = loglik + prior_lp, loglik_grad + prior_grad
        if not (np.isfinite(new_lp) and new_lp >= lp - 1e-9 * abs(new_lp)):
            return None, n_eval
        lp, step = new_lp, scipy.linalg.cho_solve(factor, grad_lp)
        decrement, point = float(grad_lp @ step), theta
        if not inexact and decrement <= settled_decrement(lp):
            mode, mode_lp, mode_decrement = point, lp, decrement
            break
        theta = theta + step
        mode, mode_lp = theta, lp + 0.5 * decrement  # the quadratic model's rise
        if inexact_step is None:
            mode_decrement = predicted_decrement(previous, decrement)
        else:  # the first exact pass after the inexact step: the gradient's change tells
            mode_decrement = predicted_from_gradient_change(
                *inexact_step, grad_lp, precision, factor
            )
        if decrement <= FINAL_STEP_FROM and mode_decrement <= FINAL_STEP_DECREMENT:
            break  # (never after the inexact step: nothing to extrapolate from yet)
        inexact_step = (grad_lp, step) if inexact else None
        previous = decrement
    else:
        mode, mode_lp, mode_decrement = point, lp, decrement  # passes ran out: the last one read
    min_curv = _dense_diagnostics(precision, grad_lp)[1]
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
        theta, more = _newton(passes, result.theta, result.hessian, max_iter=POLISH_STEPS)
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
        decrement, min_curv = _dense_diagnostics(precision, grad_lp)
    else:
        prior_diag = np.diag(compiled.prior_hessian(theta)) if dim <= 20_000 else 0.0
        precision = -(passes.full_loglik_hessian_diagonal(theta) + prior_diag)
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
        theta, n_eval = _newton(passes, theta, _subsample_precision(passes, theta, sub_rows))
        return theta, n_eval, theta, None
    if dim <= DENSE_HESSIAN_MAX_DIM:  # one full Hessian, used by Newton and kept
        loglik_hess = symmetrised(passes.full_loglik_hessian(theta))
        # not symmetrised: Newton's fixed precision as it has always been formed
        precision = -(loglik_hess + compiled.prior_hessian(theta))
        new_theta, n_eval = _newton(passes, theta, precision)
        return new_theta, n_eval, theta, loglik_hess
    new_theta = lbfgs(full_negative_logp(passes), theta, maxiter, compiled.graph.n_rows)
    return new_theta, maxiter, theta, None  # maxiter: an upper bound (scipy does not say)


def _subsample_precision(
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


def _newton(
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
    """The diagonal versions of :func:`_dense_diagnostics`."""
    if not np.all(np.isfinite(precision_diag)) or precision_diag.max() <= 0:
        return math.inf, -math.inf
    min_curvature = float(precision_diag.min() / precision_diag.max())
    if min_curvature <= MIN_RELATIVE_CURVATURE:
        return math.inf, min_curvature
    return float(np.sum(grad_lp**2 / precision_diag)), min_curvature
