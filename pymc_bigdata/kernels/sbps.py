"""Stochastic Bouncy Particle Sampler (Pakman, Gilboa, Carlson & Paninski, ICML 2017).

The process moves in straight lines ``x(t) = x_0 + M v t`` with a unit velocity ``v`` and bounces
at the events of a Poisson process of rate ``[G]_+``, ``G = v . M grad U(x)`` (Eqs. 1-3;
``U = -log p``; ``M`` a diagonal metric, all ones for plain SBPS).  At a bounce ``v`` is
reflected in the hyperplane normal to ``M grad U`` (Eqs. 4 and 16)::

    v <- v - 2 (v . M g) M g / |M g|^2.

``G`` and ``grad U`` are minibatch estimates (Eqs. 7-8); the bounce events are simulated by
thinning (Sec. 3.2) with the proposal rate of :mod:`~pymc_bigdata.kernels.sbps_regression`
(Eqs. 9-13): a proposal at ``t`` observes ``G_hat(t)`` on a fresh minibatch and is accepted with
probability ``min(1, [G_hat]_+ / lambda(t))``; ``[G_hat]_+ > lambda(t)`` is a *bound
violation*, the sampler's only source of bias besides the minibatch noise's non-Gaussianity
(Sec. 4.1).  An accepted proposal reflects ``v`` with the same minibatch's gradient and restarts
the regression from ``(0, -G_hat, c^2)``; a rejected one joins the regression.  Velocity
refreshments (``v`` uniform on the sphere) arrive at rate ``refresh_rate``.

pSBPS (Sec. 5) adapts ``M`` at every bounce from the gradient ``g`` there (Eqs. 17-18)::

    a <- beta a + (1 - beta) g^2,    M_i = (a_i + eps)^(-1/2) / mean_j (a_j + eps)^(-1/2).

(The printed Eq. 17 weights ``g^2`` by ``beta``; with the paper's ``beta = 0.99`` that would
forget the past at once, against its own remark that ``M`` then changes slowly, so the
exponential average keeps ``beta`` on the past.)

:func:`sbps_advance` runs the process for a fixed travel time and returns, besides the new
state, the exact time integrals of ``embed(x)`` and ``embed(x)^2`` along the path (Eq. 19's
continuous-time estimates; ``embed`` is affine, so the path stays linear in it), accumulated by
:mod:`~pymc_bigdata.kernels.sbps_path`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_bigdata.kernels.poisson_time import first_arrival, interpolate_rate
from pymc_bigdata.kernels.sbps_path import PathIntegrals, Skeleton
from pymc_bigdata.kernels.sbps_regression import LineFit, Segment, band_knots, fit_line, prior_step

__all__ = [
    "Observation",
    "SBPSInfo",
    "SBPSSettings",
    "SBPSState",
    "Skeleton",
    "adapt_metric",
    "reflect",
    "sbps_advance",
    "sbps_init",
]

#: proposals per call beyond which the call stops where the process is (a collapsed rate, or
#: a bound far above the gradient): the info says ``exhausted``, and the next call goes on
#: from that state. Discarding the path instead would make the draws' law depend on it
MAX_PROPOSALS = 100_000

#: ours: the band's noise variance ``c_m^2`` (Eq. 12) is at least the running mean of the
#: observations' ``c^2`` with this weight: a minibatch that happens to miss a few rare,
#: influential rows (the events of a rare outcome) underestimates its own noise
NOISE_MEMORY = 0.05

#: ours: with no proposal within this many knot scales the process observes ``G`` anyway
#: (an observation at a predictable time leaves the thinning valid): a band that predicts no
#: bounce for long (a noisy fit with a falling slope) is then corrected before the particle
#: travels far past where it should have bounced, unseen
CHECK_AFTER = 4.0


class Observation(NamedTuple):
    """A minibatch estimate of ``G = v . M grad U`` at a point, its noise variance ``c^2``
    (Eq. 10), the rows it read, and the same minibatch's ``grad U`` (computed on demand: only
    an accepted bounce needs it)."""

    value: float
    noise_var: float
    rows: int
    gradient: Callable[[], np.ndarray]


class SBPSSettings(NamedTuple):
    """``k`` (Eq. 13), the refreshment rate, the learning rate of the slope prior, the
    regression's misfit widening, pSBPS's ``(beta, eps)`` (None: fixed metric), and whether
    the band's noise variance is at least the running mean of the observed ones."""

    k: float = 3.0
    refresh_rate: float = 0.0
    prior_rate: float = 0.1
    misfit: bool = True
    metric_adaptation: tuple[float, float] | None = None
    noise_memory: bool = True


class SBPSState(NamedTuple):
    """Position, unit velocity, the regression's observations since the last bounce (times
    from the bounce), the time elapsed since it, the slope prior, and the metric ``M`` with
    pSBPS's running mean of squared gradients ``a``."""

    position: np.ndarray
    velocity: np.ndarray
    segment: Segment
    clock: float
    mu: float
    sigma2: float
    metric: np.ndarray
    grad_sq: np.ndarray
    noise_level: float = 0.0


class SBPSInfo(NamedTuple):
    """What one call did (counts over the travel time), and the path's time integrals."""

    proposals: int
    bounces: int
    refreshes: int
    violations: int
    expected_violations: float
    checks: int
    rows: int
    finite: bool
    integral: np.ndarray
    integral_sq: np.ndarray
    skeleton: Skeleton | None = None
    #: bounces the bound cut off, in expectation: ``sum over violations ([G]_+ - lambda) /
    #: lambda`` (proposals arrive at rate lambda, so this estimates the time integral of the
    #: rate ``([G]_+ - lambda)_+`` the thinning could not realise)
    missed_bounces: float = 0.0
    #: the call stopped at ``MAX_PROPOSALS`` proposals, after ``travelled`` of its travel
    #: time (the process goes on from there in the next call; nothing is undone)
    exhausted: bool = False
    travelled: float = math.nan


def sbps_init(
    position: np.ndarray, rng: np.random.Generator, mu: float, sigma2: float, metric=None
) -> SBPSState:
    """A state at ``position`` with a uniform velocity and no observations yet."""
    dim = len(position)
    metric = np.ones(dim) if metric is None else np.asarray(metric, dtype=np.float64)
    return SBPSState(
        np.asarray(position, dtype=np.float64),
        _unit_velocity(dim, rng),
        Segment(),
        0.0,
        float(mu),
        float(sigma2),
        metric,
        np.zeros(dim),
    )


def _unit_velocity(dim: int, rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(dim)
    return v / np.linalg.norm(v)


def reflect(velocity: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """Eq. 4 (Eq. 16 with ``normal = M grad U``): mirror ``velocity`` in the hyperplane
    orthogonal to ``normal``; keeps ``|v|`` and flips ``v . normal``."""
    norm_sq = float(normal @ normal)
    if not norm_sq > 0.0:
        return velocity
    return velocity - 2.0 * float(velocity @ normal) / norm_sq * normal


def adapt_metric(
    grad_sq: np.ndarray, gradient: np.ndarray, beta: float, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 17-18: the running mean of squared gradients and the normalised metric."""
    grad_sq = beta * grad_sq + (1.0 - beta) * gradient * gradient
    inv_sd = 1.0 / np.sqrt(grad_sq + eps)
    return grad_sq, inv_sd / inv_sd.mean()


def sbps_advance(
    state: SBPSState,
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    duration: float,
    settings: SBPSSettings,
    rng: np.random.Generator,
    embed: Callable[[np.ndarray], np.ndarray],
    knot_scale: float = 1.0,
    record_skeleton: bool = False,
) -> tuple[SBPSState, SBPSInfo]:
    """Run the process for ``duration`` units of travel time.

    Parameters
    ----------
    state
        Where the process is (:func:`sbps_init`, or the state a previous call returned).
    observe
        ``observe(x, direction)`` estimates ``direction . grad U(x)`` on a fresh minibatch
        (``direction = M v``; Eqs. 7-8).
    duration
        Travel time to run for.
    settings
        The proposal rate's and the refreshments' settings, and pSBPS's (Sec. 5).
    rng
        The generator of every random draw.
    embed
        The affine map whose time integrals along the path the info holds (Eq. 19).
    knot_scale
        Spacing of the proposal rate's knots (about the length of a segment; Eq. 13).
    record_skeleton
        Keep the lines travelled (:class:`Skeleton`, in ``embed``'s coordinates) in the
        info, for quadrature of other functions along the path (Eq. 19).

    Returns
    -------
    tuple of SBPSState and SBPSInfo
        The state at the end and what the call did. A non-finite observation or position
        stops the call with ``finite=False`` (the caller rejects the draw); more than
        ``MAX_PROPOSALS`` proposals stop it early, the state kept (``exhausted``).
    """
    walk = state._replace(position=state.position.copy(), velocity=state.velocity.copy())
    tally = _Tally()
    path = PathIntegrals(embed, walk.position, record_skeleton)
    left, outcome = float(duration), _GO
    while left > 0.0:
        walk, left, outcome = _leg(walk, left, observe, settings, rng, knot_scale, path, tally)
        if outcome != _GO:
            break
    finite, exhausted = outcome != _NONFINITE, outcome == _EXHAUSTED
    return walk, tally.info(path, finite, exhausted, float(duration) - left)


#: how a leg of the path ends: the process goes on, the travel time is used up, a non-finite
#: observation or position stops the call, or ``MAX_PROPOSALS`` proposals do
_GO, _STOP, _NONFINITE, _EXHAUSTED = "go", "stop", "nonfinite", "exhausted"


class _Tally:
    """What one call did so far: the counts of :class:`SBPSInfo`, the expected number of
    bound violations and the bounces the bound cut off."""

    def __init__(self) -> None:
        self.proposals = self.bounces = self.refreshes = self.violations = 0
        self.checks = self.rows = 0
        self.expected = self.missed = 0.0

    def info(
        self, path: PathIntegrals, finite: bool, exhausted: bool, travelled: float
    ) -> SBPSInfo:
        """The call's info, with the path's integrals and skeleton."""
        return SBPSInfo(
            self.proposals,
            self.bounces,
            self.refreshes,
            self.violations,
            self.expected,
            self.checks,
            self.rows,
            finite,
            path.integral,
            path.integral_sq,
            path.skeleton(),
            self.missed,
            exhausted,
            travelled,
        )


class _Band(NamedTuple):
    """The regression's fit (Eqs. 9-12) and the proposal rate's knots (Eq. 13)."""

    fit: LineFit
    knots: list
    rates: list


def _leg(
    walk: SBPSState,
    left: float,
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    settings: SBPSSettings,
    rng: np.random.Generator,
    knot_scale: float,
    path: PathIntegrals,
    tally: _Tally,
) -> tuple[SBPSState, float, str]:
    """One straight piece of the path (Eq. 1) to the next event, and the event: the end of
    the travel time, a refreshment, a check or a proposal. Returns the state, the travel time
    left and how the leg ends (``_GO`` unless the call stops)."""
    if not walk.segment.count:  # a fresh start or a refreshment: observe where we are
        started = _observe_start(walk, observe, tally)
        if started is None:
            return walk, left, _NONFINITE
        walk = started
    band, event, kind = _next_event(walk, left, settings, rng, knot_scale)
    walk, elapsed = _travel(walk, event, path)
    left -= elapsed
    if not np.all(np.isfinite(walk.position)):
        return walk, left, _NONFINITE
    if kind == _STOP:
        return walk, left, _STOP
    if kind == "refresh":
        tally.refreshes += 1
        return _refresh(walk, rng, path), left, _GO
    walk, outcome = _observe_event(walk, kind, band, observe, settings, rng, path, tally)
    return walk, left, outcome


def _observe_start(
    walk: SBPSState, observe: Callable[[np.ndarray, np.ndarray], Observation], tally: _Tally
) -> SBPSState | None:
    """Start the regression from an observation of ``G`` where the particle is (Eqs. 7-10),
    at time 0; None when the observation is not finite."""
    obs = observe(walk.position, walk.metric * walk.velocity)
    tally.rows += obs.rows
    if not _finite(obs):
        return None
    return walk._replace(
        segment=Segment().add(0.0, obs.value, obs.noise_var),
        clock=0.0,
        noise_level=_remember(walk.noise_level, obs.noise_var),
    )


def _next_event(
    walk: SBPSState,
    left: float,
    settings: SBPSSettings,
    rng: np.random.Generator,
    knot_scale: float,
) -> tuple[_Band, float, str]:
    """The proposal rate's band (Eqs. 9-13), and the time and kind of the next event: the
    first of a proposal (thinning, Sec. 3.2), a refreshment, the end of the travel time and
    a check (``CHECK_AFTER`` knot scales on); on a tie the end, then a refreshment, then a
    check."""
    fit = fit_line(walk.segment, walk.mu, walk.sigma2, settings.misfit)
    if settings.noise_memory and walk.noise_level > fit.last_noise_var:
        fit = fit._replace(last_noise_var=walk.noise_level)
    clock = walk.clock
    knots, rates = band_knots(fit, clock, knot_scale, settings.k)
    proposal = first_arrival(knots, rates, rng.exponential())
    refresh = math.inf
    if settings.refresh_rate > 0:
        refresh = clock + rng.exponential() / settings.refresh_rate
    stop, check = clock + left, clock + CHECK_AFTER * knot_scale
    event = min(proposal, refresh, stop, check)
    kinds = ((stop, _STOP), (refresh, "refresh"), (check, "check"))
    kind = next((kind for time, kind in kinds if event == time), "proposal")
    return _Band(fit, knots, rates), event, kind


def _travel(walk: SBPSState, event: float, path: PathIntegrals) -> tuple[SBPSState, float]:
    """Move in a straight line ``x + (t - clock) M v`` (Eq. 1) to time ``event``, adding the
    piece to the path's integrals; returns the state there and the time travelled."""
    elapsed = event - walk.clock
    position = walk.position + elapsed * (walk.metric * walk.velocity)
    path.move_to(position, elapsed)
    return walk._replace(position=position, clock=event), elapsed


def _refresh(walk: SBPSState, rng: np.random.Generator, path: PathIntegrals) -> SBPSState:
    """A velocity refreshment: ``v`` uniform on the sphere, the regression restarted."""
    path.turn()
    return walk._replace(velocity=_unit_velocity(len(walk.position), rng), segment=Segment())


def _observe_event(
    walk: SBPSState,
    kind: str,
    band: _Band,
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    settings: SBPSSettings,
    rng: np.random.Generator,
    path: PathIntegrals,
    tally: _Tally,
) -> tuple[SBPSState, str]:
    """Observe ``G_hat`` at a check or a proposal (Eqs. 7-8). A check only joins the
    regression; a proposal is accepted with probability ``min(1, [G_hat]_+ / lambda(t))``
    (Sec. 3.2) and bounces (Eq. 4), or joins the regression when rejected."""
    obs = observe(walk.position, walk.metric * walk.velocity)
    tally.rows += obs.rows
    if not _finite(obs):
        return walk, _NONFINITE
    observed = walk.segment.add(walk.clock, obs.value, obs.noise_var)
    walk = walk._replace(noise_level=_remember(walk.noise_level, obs.noise_var))
    if kind == "check":  # no proposal for a long while: look, without a decision
        tally.checks += 1
        return walk._replace(segment=observed), _GO
    tally.proposals += 1
    if tally.proposals > MAX_PROPOSALS:  # stop here, keeping the path so far
        return walk, _EXHAUSTED
    if not _accept(band, walk.clock, obs.value, rng, tally):  # the observation joins the fit
        return walk._replace(segment=observed), _GO
    gradient = obs.gradient()  # accepted with min(1, [G]_+ / lambda): bounce
    if not np.all(np.isfinite(gradient)):
        return walk, _NONFINITE
    tally.bounces += 1
    return _bounce(walk, observed, obs.noise_var, gradient, settings, path), _GO


def _accept(
    band: _Band, clock: float, value: float, rng: np.random.Generator, tally: _Tally
) -> bool:
    """Thinning (Sec. 3.2): accept a proposal observing ``G_hat = value`` with probability
    ``min(1, [G_hat]_+ / lambda(t))``, and count a bound violation ``[G_hat]_+ > lambda(t)``
    (Sec. 4.1) with the bounces it cut off and its predictive probability (Eq. 11)."""
    bound = interpolate_rate(band.knots, band.rates, clock)
    tally.expected += _violation_probability(band.fit, clock, bound)
    positive = max(value, 0.0)
    if positive > bound:
        tally.violations += 1
        tally.missed += (positive - bound) / bound if bound > 0.0 else 1.0
    rejected = rng.uniform() * bound >= positive
    return not rejected


def _bounce(
    walk: SBPSState,
    observed: Segment,
    noise_var: float,
    gradient: np.ndarray,
    settings: SBPSSettings,
    path: PathIntegrals,
) -> SBPSState:
    """An accepted proposal: the slope prior learns from the segment that ends here, ``v`` is
    reflected with the minibatch's gradient (Eqs. 4 and 16), pSBPS adapts ``M`` (Eqs. 17-18),
    and the regression restarts from the same minibatch's ``G`` under the new ``v``."""
    mu, sigma2 = prior_step(observed, walk.mu, walk.sigma2, settings.prior_rate)
    path.turn()
    v = reflect(walk.velocity, walk.metric * gradient)
    grad_sq, metric = walk.grad_sq, walk.metric
    if settings.metric_adaptation is not None:
        grad_sq, metric = adapt_metric(grad_sq, gradient, *settings.metric_adaptation)
    # the same minibatch after the bounce: -G_hat (Eq. 4), or its value under a new M
    after = float(v @ (metric * gradient))
    return walk._replace(
        velocity=v,
        segment=Segment().add(0.0, after, noise_var),
        clock=0.0,
        mu=mu,
        sigma2=sigma2,
        metric=metric,
        grad_sq=grad_sq,
    )


def _finite(obs: Observation) -> bool:
    """Whether an observation's value and noise variance are finite."""
    return math.isfinite(obs.value) and math.isfinite(obs.noise_var)


def _remember(level: float, noise_var: float) -> float:
    """Running mean of the observations' noise variances (weight ``NOISE_MEMORY``)."""
    if level == 0.0:
        return noise_var
    return level + NOISE_MEMORY * (noise_var - level)


def _violation_probability(fit: LineFit, t: float, bound: float) -> float:
    """``P(G(t) > bound)`` under the regression's predictive law (Eq. 11)."""
    sd = fit.predictive_sd_at(t)
    if not sd > 0.0:
        return 0.0
    return 0.5 * math.erfc((bound - fit.mean(t)) / (sd * math.sqrt(2.0)))
