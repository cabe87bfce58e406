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
continuous-time estimates; ``embed`` is affine, so the path stays linear in it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
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

#: ours (``check_after``; None turns the checks off, as in the paper): with no proposal
#: within this many knot scales the process observes ``G`` anyway
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
    regression's misfit widening, pSBPS's ``(beta, eps)`` (None: fixed metric), whether the
    band's noise variance is at least the running mean of the observed ones, the checks'
    spacing in knot scales (ours; None: no checks, as in the paper), the slope prior's update
    (``"em"``, ours, or ``"gradient"``, the paper's; :func:`~.sbps_regression.prior_step`)
    and whether pSBPS's metric learns from every observation's minibatch (the authors'
    code) rather than from the bounces' only."""

    k: float = 3.0
    refresh_rate: float = 0.0
    prior_rate: float = 0.05
    misfit: bool = True
    metric_adaptation: tuple[float, float] | None = None
    noise_memory: bool = True
    check_after: float | None = CHECK_AFTER
    prior_update: str = "em"
    metric_every_observation: bool = False


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
        (``direction = M v``; Eqs. 7-8), with the same minibatch's ``grad U`` on demand.
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
    path, tally = PathIntegrals(embed, state.position, record_skeleton), _Tally()
    end, left = _travel(state, observe, float(duration), settings, rng, knot_scale, path, tally)
    return end, tally.info(path, float(duration) - left)


def _travel(
    state: SBPSState,
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    left: float,
    settings: SBPSSettings,
    rng: np.random.Generator,
    knot_scale: float,
    path: PathIntegrals,
    tally: _Tally,
) -> tuple[SBPSState, float]:
    """:func:`sbps_advance`'s loop: straight lines (Eq. 1) between events, bounces by thinning
    (Sec. 3.2) the regression's proposal rate (Eqs. 9-13), refreshments and checks; the
    lines go to ``path``, the counts to ``tally``.

    Returns
    -------
    tuple of SBPSState and float
        The state where the process stopped and the travel time left (0 unless it stopped
        early: ``tally.finite`` is False, or ``tally.exhausted`` True).
    """
    x, v = state.position.copy(), state.velocity.copy()
    segment, clock, mu, sigma2 = state.segment, state.clock, state.mu, state.sigma2
    metric, grad_sq, noise_level = state.metric, state.grad_sq, state.noise_level
    try:
        while left > 0.0:
            if not segment.count:  # a fresh start or a refreshment: observe where we are
                segment, noise_level = _first_point(observe, x, metric * v, noise_level, tally)
                clock = 0.0
            fit = fit_line(segment, mu, sigma2, settings.misfit)
            if settings.noise_memory and noise_level > fit.last_noise_var:
                fit = fit._replace(last_noise_var=noise_level)
            knots, rates = band_knots(fit, clock, knot_scale, settings.k)
            proposal = first_arrival(knots, rates, rng.exponential())
            refresh = math.inf
            if settings.refresh_rate > 0:
                refresh = clock + rng.exponential() / settings.refresh_rate
            stop, check = clock + left, math.inf
            if settings.check_after is not None:
                check = clock + settings.check_after * knot_scale
            event = min(proposal, refresh, stop, check)
            heading = metric * v
            x = x + (event - clock) * heading
            path.move_to(x, event - clock)
            left -= event - clock
            clock = event
            if not np.isfinite(x).all():
                raise _NonFinite
            if event == stop:
                break
            if event == refresh:  # v uniform on the sphere, the regression starts again
                path.turn()
                v, segment = _unit_velocity(len(x), rng), Segment()
                tally.refreshes += 1
                continue
            obs = _observation(observe, x, heading, tally)
            if settings.metric_every_observation and settings.metric_adaptation is not None:
                grad_sq, metric, obs = _learn_metric(grad_sq, obs, settings.metric_adaptation)
            observed = segment.add(clock, obs.value, obs.noise_var)
            noise_level = _remember(noise_level, obs.noise_var)
            if event == check:  # no proposal for a long while: look, without a decision
                tally.checks += 1
                segment = observed
                continue
            tally.proposals += 1
            if tally.proposals > MAX_PROPOSALS:  # stop here, keeping the path so far
                tally.exhausted = True
                break
            bound = interpolate_rate(knots, rates, clock)
            positive = max(obs.value, 0.0)
            tally.bound_check(fit, clock, bound, positive)
            if rng.uniform() * bound >= positive:  # rejected: the observation joins the fit
                segment = observed
                continue
            # accepted with probability min(1, [G]_+ / lambda): bounce
            v, metric, grad_sq, after = _bounce(v, metric, grad_sq, obs.gradient(), settings)
            mu, sigma2 = prior_step(
                observed, mu, sigma2, settings.prior_rate, settings.prior_update
            )
            path.turn()
            segment, clock = Segment().add(0.0, after, obs.noise_var), 0.0
            tally.bounces += 1
    except _NonFinite:
        tally.finite = False
    return SBPSState(x, v, segment, clock, mu, sigma2, metric, grad_sq, noise_level), left


class _NonFinite(Exception):
    """A non-finite observation, position or gradient: :func:`_travel` stops there."""


@dataclass(slots=True)
class _Tally:
    """What one :func:`sbps_advance` call did so far: the counts of :class:`SBPSInfo`, the
    expected number of bound violations, the bounces the bound cut off, and how it ended."""

    proposals: int = 0
    bounces: int = 0
    refreshes: int = 0
    violations: int = 0
    checks: int = 0
    rows: int = 0
    expected: float = 0.0
    missed: float = 0.0
    finite: bool = True
    exhausted: bool = False

    def bound_check(self, fit: LineFit, t: float, bound: float, positive: float) -> None:
        """Count a proposal's bound violation ``[G_hat]_+ > lambda(t)`` (Sec. 4.1), the
        bounces it cut off, and its probability under the regression's predictive law.

        Parameters
        ----------
        fit
            The regression's fit (Eqs. 9-12).
        t
            The proposal's time.
        bound
            The proposal rate ``lambda(t)`` (Eq. 13, interpolated).
        positive
            The observed ``[G_hat(t)]_+``.
        """
        self.expected += _violation_probability(fit, t, bound)
        if positive > bound:
            self.violations += 1
            self.missed += (positive - bound) / bound if bound > 0.0 else 1.0

    def info(self, path: PathIntegrals, travelled: float) -> SBPSInfo:
        """The call's :class:`SBPSInfo`, with the path's integrals and skeleton."""
        return SBPSInfo(
            self.proposals,
            self.bounces,
            self.refreshes,
            self.violations,
            self.expected,
            self.checks,
            self.rows,
            self.finite,
            path.integral,
            path.integral_sq,
            path.skeleton(),
            self.missed,
            self.exhausted,
            travelled,
        )


def _observation(
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    x: np.ndarray,
    heading: np.ndarray,
    tally: _Tally,
) -> Observation:
    """``observe(x, heading)`` (``heading = M v``), its rows counted in ``tally``.

    Raises
    ------
    _NonFinite
        When the observed ``G_hat`` or its noise variance ``c^2`` is not finite.
    """
    obs = observe(x, heading)
    tally.rows += obs.rows
    if not (math.isfinite(obs.value) and math.isfinite(obs.noise_var)):
        raise _NonFinite
    return obs


def _first_point(
    observe: Callable[[np.ndarray, np.ndarray], Observation],
    x: np.ndarray,
    heading: np.ndarray,
    noise_level: float,
    tally: _Tally,
) -> tuple[Segment, float]:
    """The regression's first point (time 0, the segment's start): ``G_hat`` observed at
    ``x`` in the direction ``heading = M v``.

    Returns
    -------
    tuple of Segment and float
        The segment of that one observation, and the running mean of the noise variances
        with its ``c^2``.

    Raises
    ------
    _NonFinite
        When the observation is not finite.
    """
    obs = _observation(observe, x, heading, tally)
    return Segment().add(0.0, obs.value, obs.noise_var), _remember(noise_level, obs.noise_var)


def _bounce(
    v: np.ndarray,
    metric: np.ndarray,
    grad_sq: np.ndarray,
    gradient: np.ndarray,
    settings: SBPSSettings,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """A bounce on the accepted proposal's minibatch gradient ``g``: ``v`` reflected in the
    hyperplane normal to ``M g`` (Eqs. 4 and 16), then pSBPS's metric adapted (Eqs. 17-18).

    Returns
    -------
    tuple of three arrays and a float
        The new ``v``, ``M`` and running mean of squared gradients, and the same minibatch's
        ``G`` after the bounce, ``v . M g``: ``-G_hat`` (Eq. 4), or its value under a new ``M``.

    Raises
    ------
    _NonFinite
        When ``g`` is not finite.
    """
    if not np.isfinite(gradient).all():
        raise _NonFinite
    v = reflect(v, metric * gradient)
    if settings.metric_adaptation is not None and not settings.metric_every_observation:
        grad_sq, metric = adapt_metric(grad_sq, gradient, *settings.metric_adaptation)
    return v, metric, grad_sq, float(v @ (metric * gradient))


def _learn_metric(
    grad_sq: np.ndarray, obs: Observation, adaptation: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, Observation]:
    """pSBPS's metric (Eqs. 17-18) learnt from a proposal's minibatch gradient, as the
    authors' code does at every minibatch (``metric_every_observation``). One difference
    of order: the proposal's ``G_hat`` was observed along the metric before this update (the
    authors' code observes it after); with ``beta = 0.99`` the update moves the metric by
    about 1 %.

    Returns
    -------
    tuple of two arrays and an Observation
        The running mean of squared gradients, the metric, and the observation with its
        gradient kept (a bounce reuses it).

    Raises
    ------
    _NonFinite
        When the gradient is not finite.
    """
    gradient = obs.gradient()
    if not np.isfinite(gradient).all():
        raise _NonFinite
    grad_sq, metric = adapt_metric(grad_sq, gradient, *adaptation)
    return grad_sq, metric, obs._replace(gradient=lambda: gradient)


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
