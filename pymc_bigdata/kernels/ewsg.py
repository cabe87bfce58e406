"""Exponentially weighted stochastic gradients (EWSG; Li, Zhang & Tao, ICLR 2021).

Underdamped Langevin dynamics (Eq. 1) in coordinates with unit mass, ``g(z)`` the gradient of
the log posterior (``-grad V``). One step moves the momentum by a Gaussian whose mean depends
on the gradient used:

    r' = decay * r + kick * g_I(z) + N(0, noise_var),

and the position by a drift that does not see the index ``I`` once ``r'`` is known. Two
integrators have this form:

* ``"euler"``, the paper's Euler-Maruyama step (Eq. 3): ``z' = z + h r`` (old momentum),
  ``decay = 1 - gamma h``, ``kick = h``, ``noise_var = sigma^2 h = 2 gamma h``;
* ``"obabo"``, the OBABO splitting read from one position to the next (half kick, the two
  half O-steps merged into one exact Ornstein-Uhlenbeck step, half kick, drift): ``decay = c
  = exp(-gamma h)``, ``kick = (1 + c) h / 2``, ``z' = z + h r'``. Its noise is at temperature
  ``T = 1 - h^2 / 4`` (``noise_var = T (1 - c^2)``), which makes the stationary law of the
  positions *and* momenta exact for a unit-curvature Gaussian (the posterior shape the
  preconditioner aims at) for every ``h < 2``; Euler-Maruyama's position variance there is
  ``1.11`` at ``h = 0.1``, ``gamma = 1`` (:func:`stationary_covariance`).

Because ``I`` enters only through the mean of a Gaussian ``N_I``, the mixture ``sum_I p_I
N_I(r')`` equals the full-gradient step's density ``N(r')`` at a given ``r'`` when ``p_I``
is proportional to ``N(r') / N_I(r')`` (Theorem 2, Eq. 4):

    p_I  propto  exp(+|r' - decay r - kick g_I|^2 / (2 noise_var)),

an index whose step would make ``r'`` *unlikely* gets more weight. The paper evaluates it at
the guess ``r' = r`` (Sec. 4.2: ``x = sqrt(h) gamma r / sigma`` for Euler-Maruyama, where
``|x + n a_I|^2 / 2`` equals the exponent above). The weights are
never normalised: an index Metropolis chain (Eq. 5) starts from a uniformly drawn minibatch
and makes ``M`` proposals, each a fresh uniform minibatch accepted with probability
``min(1, p_J / p_I)`` (Algorithm 1). ``g_I`` may be any estimate built from minibatch ``I``
(plain ``(N/b) sum`` or control-variate corrected); the chain runs over whole minibatches
(see ``docs/ewsg.md`` for the derivation for ``b > 1``).

Every function works on one chain (arrays of shape ``(d,)``) or on a batch of independent
chains (shape ``(..., d)``; the index chains then decide per chain).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
import scipy.linalg

__all__ = [
    "INDEX_WEIGHTS",
    "INTEGRATORS",
    "EWSGInfo",
    "EWSGState",
    "MomentumUpdate",
    "ewsg_steps",
    "index_chain",
    "index_log_weight",
    "momentum_update",
    "stationary_covariance",
]

INTEGRATORS = ("obabo", "euler")
#: ``"linear"``: Eq. 4's exponent at ``r' = r`` without its term quadratic in the estimate
#: (ours); ``"paper"``: Eq. 4's exponent at ``r' = r`` as the paper writes it
INDEX_WEIGHTS = ("linear", "paper")


class EWSGState(NamedTuple):
    """Position and momentum (unit mass)."""

    position: np.ndarray
    momentum: np.ndarray


class EWSGInfo(NamedTuple):
    """What happened in a run of EWSG steps.

    ``index_accepted`` counts accepted index proposals (out of ``index_proposals``);
    ``finite`` is False when a position or momentum left the floats.
    """

    n_steps: int
    index_proposals: int
    index_accepted: int
    finite: bool


class MomentumUpdate(NamedTuple):
    """``r' = decay r + kick g + N(0, noise_var)``; ``drift_new`` says whether the drift uses
    ``r'`` (OBABO) or ``r`` (Euler-Maruyama)."""

    decay: float
    kick: float
    noise_var: float
    drift_new: bool


def momentum_update(step_size: float, friction: float, integrator: str = "obabo") -> MomentumUpdate:
    """The Gaussian momentum update of one step (see the module docstring)."""
    h, gamma = step_size, friction
    if integrator == "euler":
        return MomentumUpdate(1.0 - gamma * h, h, 2.0 * gamma * h, False)
    if integrator == "obabo":
        c = math.exp(-gamma * h)
        # h >= 2 has no stationary law (the dynamics blow up): no correction there
        temperature = 1.0 - h * h / 4.0 if h < 2.0 else 1.0
        return MomentumUpdate(
            c, 0.5 * (1.0 + c) * h, -temperature * math.expm1(-2.0 * gamma * h), True
        )
    raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}.")


def index_log_weight(
    grad: np.ndarray, momentum: np.ndarray, update: MomentumUpdate, weights: str = "linear"
) -> np.ndarray:
    """Unnormalised ``log p_I`` of an index (over the last axis).

    ``"paper"``: Eq. 4 at the paper's guess ``r' = r``, ``+|(1 - decay) r - kick g_I|^2 / (2
    noise_var)``. ``"linear"`` (ours): the same exponent without its term ``kick^2 |g_I|^2 / (2
    noise_var)``, quadratic in the estimate, which leaves ``-(1 - decay) kick r . g_I /
    noise_var``. Only differences between indices matter, so ``g_I`` may be read as the full
    gradient plus the estimate's noise ``e_I``: the linear weights tilt the chosen noise
    against the momentum (extra friction that balances the noise's extra variance, to first
    order), while the dropped term prefers indices with a large ``|e_I|`` (a mean bias where
    the noise is skewed) and amplifies the gradient (docs/ewsg.md).
    """
    if weights == "linear":
        coefficient = (1.0 - update.decay) * update.kick / update.noise_var
        return -coefficient * np.vecdot(momentum, grad)
    if weights == "paper":
        gap = (1.0 - update.decay) * momentum - update.kick * grad
        return 0.5 * np.vecdot(gap, gap) / update.noise_var
    raise ValueError(f"weights must be one of {INDEX_WEIGHTS}, got {weights!r}.")


def index_chain(
    draw_candidate: Callable[[], np.ndarray],
    momentum: np.ndarray,
    update: MomentumUpdate,
    n_proposals: int,
    rng: np.random.Generator,
    weights: str = "linear",
) -> tuple[np.ndarray, np.ndarray]:
    """The index Metropolis chain of Algorithm 1 (Eq. 5) over minibatch gradient estimates.

    Parameters
    ----------
    draw_candidate
        Draws a fresh uniform minibatch and returns its gradient estimate, shape ``(..., d)``.
    momentum
        Current momentum, shape ``(..., d)``.
    update
        The step's momentum update (its ``decay``, ``kick`` and ``noise_var`` set the weights).
    n_proposals
        ``M``; 0 gives the uniform minibatch gradient (plain SG underdamped Langevin).
    rng
        Source of the accept draws.
    weights
        ``"linear"`` (default) or ``"paper"`` (:func:`index_log_weight`).

    Returns
    -------
    The chosen gradient estimate and the number of accepted proposals (per chain).
    """
    if np.ndim(momentum) == 1:
        return _one_index_chain(draw_candidate, momentum, update, n_proposals, rng, weights)
    current = draw_candidate()
    log_w = index_log_weight(current, momentum, update, weights)
    accepted = np.zeros(np.shape(log_w), dtype=np.int64)
    for _ in range(n_proposals):
        proposal = draw_candidate()
        log_w_new = index_log_weight(proposal, momentum, update, weights)
        with np.errstate(invalid="ignore", over="ignore"):
            take = np.log(rng.uniform(size=np.shape(log_w))) < log_w_new - log_w
        current = np.where(np.asarray(take)[..., None], proposal, current)
        log_w = np.where(take, log_w_new, log_w)
        accepted += take
    return current, accepted


def _one_index_chain(
    draw_candidate: Callable[[], np.ndarray],
    momentum: np.ndarray,
    update: MomentumUpdate,
    n_proposals: int,
    rng: np.random.Generator,
    weights: str,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`index_chain` for one chain (``momentum`` of shape ``(d,)``) in Python floats:
    the same decisions from the same random numbers as the batched form, at a fifth of its
    cost per proposal (the batched form's ``np.where`` and 0-d arrays dominate at ``d = 30``)."""
    current = draw_candidate()
    log_w = float(index_log_weight(current, momentum, update, weights))
    accepted = 0
    for _ in range(n_proposals):
        proposal = draw_candidate()
        log_w_new = float(index_log_weight(proposal, momentum, update, weights))
        u = rng.uniform()
        log_u = math.log(u) if u > 0.0 else -math.inf
        if log_u < log_w_new - log_w:  # False where the difference is NaN, as batched
            current, log_w = proposal, log_w_new
            accepted += 1
    return current, np.asarray(accepted, dtype=np.int64)


def ewsg_steps(
    state: EWSGState,
    draw_candidate: Callable[[np.ndarray], np.ndarray],
    step_size: float,
    friction: float,
    n_steps: int,
    index_proposals: int,
    rng: np.random.Generator,
    integrator: str = "obabo",
    weights: str = "linear",
    last_candidate: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[EWSGState, EWSGInfo]:
    """Run ``n_steps`` EWSG steps (Algorithm 1).

    Parameters
    ----------
    state
        Position and momentum, shape ``(..., d)``.
    draw_candidate
        ``draw_candidate(z)``: the gradient estimate of a fresh uniform minibatch at ``z``.
    step_size, friction
        ``h`` and ``gamma`` (``sigma = sqrt(2 gamma)``, unit temperature).
    n_steps
        Steps to run.
    index_proposals
        ``M``, index-chain proposals per step (each one more minibatch gradient).
    rng
        Source of the index decisions and the injected noise.
    integrator
        ``"obabo"`` (default) or ``"euler"`` (Eq. 3).
    weights
        The index weights: ``"linear"`` (default) or ``"paper"`` (:func:`index_log_weight`).
    last_candidate
        ``draw_candidate`` for the last step's candidates (default ``draw_candidate``): where
        the step method measures its estimator's noise.
    """
    update = momentum_update(step_size, friction, integrator)
    noise_sd = math.sqrt(update.noise_var)
    z, r = state
    accepted = 0
    for step in range(n_steps):
        last = last_candidate is not None and step == n_steps - 1
        candidate = partial(last_candidate if last else draw_candidate, z)
        grad, took = index_chain(candidate, r, update, index_proposals, rng, weights)
        accepted += int(took.sum())
        r_new = update.decay * r + update.kick * grad + noise_sd * rng.standard_normal(r.shape)
        z = z + step_size * (r_new if update.drift_new else r)
        r = r_new
    finite = bool(np.isfinite(z).all() and np.isfinite(r).all())
    chains = int(np.prod(np.shape(z)[:-1], dtype=np.int64))
    proposals = n_steps * index_proposals * chains
    return EWSGState(z, r), EWSGInfo(n_steps, proposals, accepted, finite)


@lru_cache(maxsize=256)
def stationary_covariance(
    step_size: float, friction: float, integrator: str = "obabo"
) -> np.ndarray:
    """Stationary covariance of ``(z, r)`` on a unit Gaussian with exact gradients (a
    discrete Lyapunov equation: one step is linear in ``(z, r)``); cached and read-only (the
    Euler integrator's kinetic-temperature check asks for it every draw)."""
    h = step_size
    u = momentum_update(step_size, friction, integrator)
    if u.drift_new:  # r' = decay r - kick z + e,  z' = z + h r'
        step = np.array([[1.0 - h * u.kick, h * u.decay], [-u.kick, u.decay]])
        into = np.array([h, 1.0])
    else:  # z' = z + h r,  r' = decay r - kick z + e
        step = np.array([[1.0, h], [-u.kick, u.decay]])
        into = np.array([0.0, 1.0])
    cov = scipy.linalg.solve_discrete_lyapunov(step, u.noise_var * np.outer(into, into))
    cov.flags.writeable = False  # cached: shared by every caller
    return cov
