"""HMC with energy conserving subsampling (Dang, Quiroz, Kohn, Tran & Villani, 2019).

One iteration is Algorithm 1, HMC-within-Gibbs on the extended target (3.3),
``exp(-H_hat(theta, p)) p_U(u)`` with ``H_hat = -log |L_hat(theta; u)| - log p(theta) + p'p/2``:

1. a pseudo-marginal Metropolis-Hastings update of the subsample ``u`` at the current
   ``theta`` (3.5), correlated over iterations by refreshing one block of ``G`` (perturbed) or
   ``kappa`` of the ``lambda`` products (signed), so that ``rho ~ 1 - 1/G`` (Sec. 3.3, 5.3);
2. an HMC update of ``theta`` given ``u``: leapfrog dynamics on that subsample's estimated
   Hamiltonian and the accept test (3.7) with the same estimate (Sec. 3.4). A trajectory
   whose energy blows up is rejected: a divergence, unless it blew up at a zero of the
   signed ``L_hat``, where ``log |L_hat|`` has a pole (``ZERO_NEAR``), or at the perturbed
   estimate's variance wall (``VARIANCE_WALL``; both ours, not the paper's: the kernel
   rejects such a trajectory all the same and only names it otherwise).

The estimators (pure numpy, on the per-row residuals ``d_k = l_k - q_k`` the layer computes):

* perturbed (Sec. 4): the difference estimator (4.1)-(4.2) with ``m`` rows drawn uniformly
  with replacement, its variance estimate (4.3) and the bias-corrected
  ``log L_hat = l_hat - sigma_hat^2 / 2`` (4.5);
* signed (Sec. 5): the block-Poisson estimator (5.1) with ``lambda`` products of
  ``X_l ~ Pois(1)`` minibatch estimates of ``m`` rows each and lower bound ``a``, which is
  unbiased but may be negative: the chain targets ``|L_hat|`` (5.2) and the sign of each draw
  corrects expectations afterwards (5.3).

Positions are in the preconditioned coordinates ``z`` (mass matrix ``I`` there, i.e.
``M = (L L')^{-1}`` in ``theta``).  The kernel never reads data: ``evaluate(z, u)`` and
``propose(u, rng)`` come from the step method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr

from pymc_bigdata.dual_averaging import dual_averaging_init, dual_averaging_update

__all__ = [
    "Evaluation",
    "HMCECSInfo",
    "HMCECSState",
    "Subsample",
    "block_poisson_log_abs",
    "block_poisson_nearest_zero",
    "block_poisson_settings",
    "draw_block_subsample",
    "draw_poisson_subsample",
    "dual_averaging_init",
    "dual_averaging_update",
    "hmcecs_step",
    "perturbed_loglik",
    "propose_block",
    "propose_products",
]

#: a leapfrog trajectory whose energy error exceeds this is a divergence (as in NUTS)
MAX_ENERGY_ERROR = 1000.0

#: a blown-up signed trajectory met a zero of ``L_hat`` (not a divergence) when, still sound,
#: it reached a point where a product's factor ``(d_hat - a) / lambda`` was within this of 0
#: (and blew up after it).
#: ``|L_hat|``'s log has a pole there, and the leapfrog's kick across it blows the energy up.
#: Measured (one-off, ``scale_few_rows``, seed 2): blown trajectories came within 0.00-0.03
#: of a zero; a typical factor is ~1 (``a = mu - lambda``)
ZERO_NEAR = 0.05

#: a blown-up perturbed trajectory met the estimate's variance wall (not a divergence) when,
#: still sound, it reached a point where the subsample's ``sigma_hat^2`` exceeded this (and
#: blew up after it). There the estimate's factor ``exp(-sigma_hat^2 / 2)`` (4.5) is below
#: ``exp(-5)``: the perturbed target falls because of this subsample's spread, not the
#: posterior's shape (the paper's analysis takes ``sigma^2`` of order 1), and the kick of
#: ``grad sigma_hat^2`` blows the energy up. Measured (one-off, ``hier_poisson_noncentred``,
#: seed 2, the alarm table's run at 61d9d1c): the path's ``sigma_hat^2`` went 1.63, 24.3,
#: 0.015, 359 while the full-data log-likelihood changed by 12; energy error 1,810
VARIANCE_WALL = 10.0


# ---------------------------------------------------------------------- estimators
def perturbed_loglik(
    cv_sum: float, residuals: np.ndarray, pool: int, census: float = 0.0
) -> tuple[float, float]:
    """Eqs. (4.1)-(4.5): ``(l_hat - sigma_hat^2 / 2, sigma_hat^2)`` from ``sum_k q_k``, the
    residuals of ``m`` rows drawn uniformly with replacement from a pool of ``pool`` rows, and
    the summed residuals ``census`` of the rows outside the pool (counted exactly)."""
    m = len(residuals)
    scale = pool / m
    mean = float(residuals.mean())
    sigma2 = scale * scale * float(np.sum((residuals - mean) ** 2))  # (4.3)
    loglik = cv_sum + census + scale * float(residuals.sum())  # (4.1)-(4.2)
    return loglik - 0.5 * sigma2, sigma2  # (4.5)


def block_poisson_log_abs(
    cv_sum: float,
    residuals: np.ndarray,
    n_rows: int,
    minibatch: int,
    products: int,
    lower_bound: float,
) -> tuple[float, int]:
    """Eq. (5.1): ``(log |L_hat|, sign L_hat)`` for residuals in consecutive minibatches of
    ``minibatch`` rows (``sum_l X_l`` of them over the ``products`` factors ``xi_l``).

    ``log |L_hat| = sum q + (a + lambda) + sum_{l,h} log |d_hat_lh - a| - (sum_l X_l) log lambda``
    and the sign is ``(-1)^(number of d_hat_lh < a)``.
    """
    shifted = _shifted_totals(residuals, n_rows, minibatch, lower_bound)
    log_abs = cv_sum + lower_bound + products + float(np.sum(np.log(np.abs(shifted))))
    log_abs -= len(shifted) * math.log(products)
    sign = -1 if int(np.count_nonzero(shifted < 0)) % 2 else 1
    return log_abs, sign


def block_poisson_nearest_zero(
    residuals: np.ndarray, n_rows: int, minibatch: int, products: int, lower_bound: float
) -> float:
    """The factor of (5.1) nearest zero, ``min |d_hat_lh - a| / lambda`` (inf without one):
    near 0, ``log |L_hat|`` has a pole (the sign changes across it)."""
    shifted = _shifted_totals(residuals, n_rows, minibatch, lower_bound)
    return float(np.min(np.abs(shifted))) / products if len(shifted) else math.inf


def _shifted_totals(
    residuals: np.ndarray, n_rows: int, minibatch: int, lower_bound: float
) -> np.ndarray:
    """``d_hat_lh - a``: each minibatch's estimate of ``sum_k d_k`` less the lower bound."""
    return (n_rows / minibatch) * residuals.reshape(-1, minibatch).sum(axis=1) - lower_bound


def block_poisson_settings(
    mean: float,
    sd: float,
    variance_target: float,
    sign_tolerance: float,
    max_products: int | None = None,
) -> tuple[int, float]:
    """``(lambda, a)`` for the block-Poisson estimator from the mean and sd of one minibatch
    estimate ``d_hat`` (measured in tuning, across draws).

    With ``d_hat ~ N(mu, sigma^2)`` and ``a = mu - lambda``, each factor is
    ``1 + (d_hat - mu) / lambda``, so ``Var log |L_hat| ~ sigma^2 / lambda`` (``lambda`` factors
    of ``Pois(1)`` minibatches), a factor is negative with probability ``p = Phi(-lambda /
    sigma)``, and ``E[sign] = 2 tau - 1 = exp(-2 lambda p)`` (a ``Pois(lambda p)`` count of
    negative factors is even with probability ``(1 + exp(-2 lambda p)) / 2``).  The rule takes
    the smallest ``lambda`` with ``sigma^2 / lambda <= variance_target`` and ``1 - exp(-2 lambda
    p) <= sign_tolerance``: the cost ``lambda m`` grows with ``lambda`` while the inefficiency
    ``IF / (2 tau - 1)^2`` of (5.4) stays within a few percent of its floor.  ``lambda`` is at
    most ``max_products`` (e.g. one pass over the data per estimate).
    """
    sigma = max(float(sd), 1e-12)
    cap = max_products if max_products is not None else math.inf
    if not math.isfinite(sigma) or sigma * sigma / variance_target >= cap:
        lam = int(cap) if math.isfinite(cap) else 1
        return lam, float(mean) - lam
    lam = max(1, math.ceil(sigma * sigma / variance_target))
    while lam < cap and 1.0 - math.exp(-2.0 * lam * float(ndtr(-lam / sigma))) > sign_tolerance:
        lam += max(1, lam // 20)
    lam = int(min(lam, cap))
    return lam, float(mean) - lam


# ---------------------------------------------------------------------- subsamples
@dataclass(frozen=True)
class Subsample:
    """The auxiliary variable ``u``: row indices, the rows themselves, and their layout.

    Perturbed: ``bounds`` are the ``G + 1`` block boundaries of the ``m`` indices.  Signed:
    ``counts[l]`` minibatches of ``minibatch`` rows for each product ``l``, the indices laid
    out product after product (minibatches are consecutive runs of ``minibatch`` rows).
    """

    indices: np.ndarray
    rows: tuple[np.ndarray, ...]
    bounds: np.ndarray | None = None
    counts: np.ndarray | None = None
    minibatch: int = 0


RowReader = Callable[[np.ndarray], list[np.ndarray]]


def draw_block_subsample(
    n_rows: int, size: int, blocks: int, take: RowReader, rng: np.random.Generator
) -> Subsample:
    """A fresh ``u``: ``size`` rows uniformly with replacement, in ``blocks`` near-equal blocks."""
    indices = rng.integers(n_rows, size=size)
    bounds = np.linspace(0, size, blocks + 1).round().astype(np.int64)
    return Subsample(indices, tuple(take(indices)), bounds=bounds)


def propose_block(
    u: Subsample, n_rows: int, take: RowReader, rng: np.random.Generator
) -> Subsample:
    """``u'``: one block, chosen uniformly, redrawn (Sec. 3.3, Tran et al. 2017)."""
    block = int(rng.integers(len(u.bounds) - 1))
    start, stop = int(u.bounds[block]), int(u.bounds[block + 1])
    fresh = rng.integers(n_rows, size=stop - start)
    indices = u.indices.copy()
    indices[start:stop] = fresh
    rows = []
    for old, new in zip(u.rows, take(fresh)):
        array = old.copy()
        array[start:stop] = new
        rows.append(array)
    return Subsample(indices, tuple(rows), bounds=u.bounds)


def draw_poisson_subsample(
    n_rows: int, minibatch: int, products: int, take: RowReader, rng: np.random.Generator
) -> Subsample:
    """A fresh ``u`` of the block-Poisson estimator: ``X_l ~ Pois(1)`` minibatches per product."""
    counts = rng.poisson(1.0, size=products)
    indices = rng.integers(n_rows, size=int(counts.sum()) * minibatch)
    return Subsample(indices, tuple(take(indices)), counts=counts, minibatch=minibatch)


def propose_products(
    u: Subsample, n_rows: int, refreshed: int, take: RowReader, rng: np.random.Generator
) -> Subsample:
    """``u'``: ``refreshed`` (kappa) of the products, chosen uniformly, redrawn with new counts
    and rows, the others kept (``rho ~ 1 - kappa / lambda``, Sec. 5.3)."""
    m, counts = u.minibatch, u.counts
    chosen = rng.choice(len(counts), size=refreshed, replace=False)
    new_counts = counts.copy()
    new_counts[chosen] = rng.poisson(1.0, size=refreshed)
    starts = np.concatenate([[0], np.cumsum(counts)]) * m
    pieces_idx, pieces_rows = [], []
    fresh_idx = rng.integers(n_rows, size=int(new_counts[chosen].sum()) * m)
    fresh_rows = take(fresh_idx)
    fresh_starts = dict(zip(chosen.tolist(), np.cumsum([0, *new_counts[chosen][:-1]]) * m))
    for product in range(len(counts)):
        if product in fresh_starts:
            lo = int(fresh_starts[product])
            hi = lo + int(new_counts[product]) * m
            pieces_idx.append(fresh_idx[lo:hi])
            pieces_rows.append([r[lo:hi] for r in fresh_rows])
        else:
            lo, hi = int(starts[product]), int(starts[product + 1])
            pieces_idx.append(u.indices[lo:hi])
            pieces_rows.append([r[lo:hi] for r in u.rows])
    indices = np.concatenate(pieces_idx)
    rows = tuple(np.concatenate(parts) for parts in zip(*pieces_rows))
    return Subsample(indices, rows, counts=new_counts, minibatch=m)


# ---------------------------------------------------------------------- the kernel
class Evaluation(NamedTuple):
    """The estimated log posterior ``log |L_hat| + log p`` at ``(z, u)``, its gradient in
    ``z``, the variance of ``log |L_hat|`` (``sigma_hat^2`` of (4.3) when perturbed), the
    estimate's sign, ``level``: the subsample's estimate ``N mean(d)`` of ``sum_k d_k``, and
    ``nearest_zero``: how near ``L_hat``'s nearest factor is to 0 (signed; else inf)."""

    logp: float
    grad: np.ndarray
    loglik_var: float
    sign: int
    level: float = math.nan
    nearest_zero: float = math.inf


class HMCECSState(NamedTuple):
    position: np.ndarray
    subsample: Subsample
    evaluation: Evaluation


class HMCECSInfo(NamedTuple):
    """One iteration's outcome. A blown-up trajectory (energy error above
    ``MAX_ENERGY_ERROR`` or a non-finite value) is rejected; it is ``diverging`` unless it
    blew up at a zero of the signed ``L_hat`` (``at_estimator_zero``, see ``ZERO_NEAR``) or
    at the perturbed estimate's variance wall (``at_variance_wall``, see ``VARIANCE_WALL``)."""

    accept_prob: float
    accepted: bool
    subsample_accept: float
    energy_error: float
    diverging: bool
    evaluations: int
    at_estimator_zero: bool = False
    at_variance_wall: bool = False


Evaluate = Callable[[np.ndarray, Subsample], Evaluation]
Propose = Callable[[Subsample, np.random.Generator], Subsample]


def _finite(e: Evaluation) -> bool:
    return math.isfinite(e.logp) and bool(np.all(np.isfinite(e.grad)))


class _Path(NamedTuple):
    position: np.ndarray
    end: Evaluation
    energy_error: float
    evaluations: int
    met_zero: bool
    met_wall: bool


def _leapfrog(
    z: np.ndarray,
    momentum: np.ndarray,
    here: Evaluation,
    u: Subsample,
    evaluate: Evaluate,
    step_size: float,
    n_steps: int,
    energy0: float,
    variance_wall: float,
) -> _Path:
    """``n_steps`` leapfrog steps on ``u``'s ``H_hat`` from ``(z, momentum)``; the energy error
    is inf at a non-finite value. ``met_zero``: the path reached a point with a factor of
    ``L_hat`` within ``ZERO_NEAR`` of 0 with the energy error at every point up to it (with
    the half-step momentum) below ``MAX_ENERGY_ERROR``: the blow-up came after, from the
    pole's kick. ``met_wall``: it reached a point with ``sigma_hat^2`` above
    ``variance_wall`` with the energy error less the estimate's variance term (4.5),
    ``(sigma_hat^2 - sigma_hat_0^2) / 2``, below ``MAX_ENERGY_ERROR`` at every point up to
    it: the blow-up is the variance term's, there or after (the wall's kick)."""
    position, current = z, here
    momentum = momentum + 0.5 * step_size * current.grad
    sound, sound_inside, met_zero, met_wall, evaluations = True, True, False, False, 1
    for step in range(n_steps):
        position = position + step_size * momentum
        current = evaluate(position, u)
        evaluations += 1
        if not _finite(current):
            return _Path(position, current, math.inf, evaluations, met_zero, met_wall)
        energy_error = -current.logp + 0.5 * float(momentum @ momentum) - energy0
        sound = sound and energy_error < MAX_ENERGY_ERROR  # the half-step momentum's
        met_zero = met_zero or (sound and current.nearest_zero < ZERO_NEAR)
        if variance_wall < math.inf:
            variance_term = 0.5 * (current.loglik_var - here.loglik_var)
            sound_inside = sound_inside and energy_error - variance_term < MAX_ENERGY_ERROR
            met_wall = met_wall or (sound_inside and current.loglik_var > variance_wall)
        scale = step_size if step < n_steps - 1 else 0.5 * step_size
        momentum = momentum + scale * current.grad
    energy_error = -current.logp + 0.5 * float(momentum @ momentum) - energy0
    return _Path(position, current, energy_error, evaluations, met_zero, met_wall)


def hmcecs_step(
    state: HMCECSState,
    evaluate: Evaluate,
    propose: Propose,
    step_size: float,
    n_steps: int,
    rng: np.random.Generator,
    variance_wall: float = math.inf,
) -> tuple[HMCECSState, HMCECSInfo]:
    """One iteration of Algorithm 1: the subsample update (3.5), then leapfrog HMC (3.7).
    ``variance_wall``: the perturbed estimate's ``VARIANCE_WALL`` (inf: no wall, as for the
    signed estimate, whose variance enters no factor)."""
    z, u, here = state
    # (1) u | theta: pseudo-marginal MH; the prior and momentum cancel in the ratio (3.5)
    proposed_u = propose(u, rng)
    there = evaluate(z, proposed_u)
    log_ratio = there.logp - here.logp if _finite(there) else -math.inf
    subsample_accept = math.exp(min(0.0, log_ratio)) if not math.isnan(log_ratio) else 0.0
    if math.log(rng.uniform()) < log_ratio:
        u, here = proposed_u, there
    # (2) theta, p | u: leapfrog on this subsample's H_hat, accepted by the same H_hat
    momentum = rng.standard_normal(z.shape[0])
    energy0 = -here.logp + 0.5 * float(momentum @ momentum)
    path = _leapfrog(z, momentum, here, u, evaluate, step_size, n_steps, energy0, variance_wall)
    blown = not path.energy_error < MAX_ENERGY_ERROR  # NaN and inf too
    at_zero, at_wall = blown and path.met_zero, blown and path.met_wall and not path.met_zero
    diverging = blown and not (at_zero or at_wall)
    accept_prob = 0.0 if blown else math.exp(min(0.0, -path.energy_error))
    accepted = not blown and rng.uniform() < accept_prob
    end = HMCECSState(path.position, u, path.end)
    new_state = end if accepted else HMCECSState(z, u, here)
    info = HMCECSInfo(
        accept_prob,
        accepted,
        subsample_accept,
        path.energy_error,
        diverging,
        path.evaluations,
        at_zero,
        at_wall,
    )
    return new_state, info
