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
from typing import NamedTuple

import numpy as np

from pymc_bigdata.kernels.poisson_time import first_arrival, interpolate_rate
from pymc_bigdata.kernels.sbps_regression import Segment, band_knots, fit_line, prior_step

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


class Skeleton(NamedTuple):
    """The straight lines travelled in one call: line ``i`` runs from ``starts[i]`` to
    ``ends[i]`` (in ``embed``'s coordinates) in ``durations[i]`` units of travel time, at
    constant speed; consecutive lines join (``ends[i] == starts[i + 1]``)."""

    starts: np.ndarray
    ends: np.ndarray
    durations: np.ndarray


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


class _Path:
    """Time integrals of ``embed(x)`` and its square along the straight pieces travelled,
    and (when ``record``) the skeleton: the lines between changes of direction."""

    def __init__(self, embed: Callable[[np.ndarray], np.ndarray], start: np.ndarray, record):
        self.embed = embed
        self.here = embed(start)
        self.integral = np.zeros_like(self.here)
        self.integral_sq = np.zeros_like(self.here)
        self.record = record
        self.lines: list[tuple[np.ndarray, np.ndarray, float]] = []
        self.line_start, self.line_time = self.here, 0.0

    def move_to(self, position: np.ndarray, duration: float) -> None:
        a, b = self.here, self.embed(position)
        self.integral += 0.5 * duration * (a + b)
        self.integral_sq += duration * (a * a + a * b + b * b) / 3.0
        self.here = b
        self.line_time += duration

    def turn(self) -> None:
        """The direction changes here: close the current line."""
        if self.record and self.line_time > 0.0:
            self.lines.append((self.line_start, self.here, self.line_time))
        self.line_start, self.line_time = self.here, 0.0

    def skeleton(self) -> Skeleton | None:
        if not self.record:
            return None
        self.turn()
        dim = len(self.here)
        if not self.lines:
            empty = np.empty((0, dim))
            return Skeleton(empty, empty.copy(), np.empty(0))
        starts, ends, durations = zip(*self.lines)
        return Skeleton(np.array(starts), np.array(ends), np.array(durations))


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

    ``observe(x, direction)`` estimates ``direction . grad U(x)`` on a fresh minibatch
    (``direction = M v``).  ``knot_scale`` sets the spacing of the proposal rate's knots
    (about the length of a segment).  A non-finite observation or position stops the call
    with ``finite=False`` (the caller rejects the draw); more than ``MAX_PROPOSALS``
    proposals stop it early, the state kept (``exhausted``).  With ``record_skeleton`` the info
    holds the lines travelled (:class:`Skeleton`, in ``embed``'s coordinates), for
    quadrature of other functions along the path (Eq. 19).
    """
    x, v = state.position.copy(), state.velocity.copy()
    segment, clock, mu, sigma2 = state.segment, state.clock, state.mu, state.sigma2
    metric, grad_sq, noise_level = state.metric, state.grad_sq, state.noise_level
    counts = dict(proposals=0, bounces=0, refreshes=0, violations=0, checks=0, rows=0)
    expected = missed = 0.0
    path = _Path(embed, x, record_skeleton)
    left = float(duration)

    def finish(finite: bool, exhausted: bool = False) -> tuple[SBPSState, SBPSInfo]:
        new = SBPSState(x, v, segment, clock, mu, sigma2, metric, grad_sq, noise_level)
        info = SBPSInfo(
            counts["proposals"],
            counts["bounces"],
            counts["refreshes"],
            counts["violations"],
            expected,
            counts["checks"],
            counts["rows"],
            finite,
            path.integral,
            path.integral_sq,
            path.skeleton(),
            missed,
            exhausted,
            float(duration) - left,
        )
        return new, info

    while left > 0.0:
        if not segment.count:  # a fresh start or a refreshment: observe where we are
            obs = observe(x, metric * v)
            counts["rows"] += obs.rows
            if not (math.isfinite(obs.value) and math.isfinite(obs.noise_var)):
                return finish(False)
            segment, clock = Segment().add(0.0, obs.value, obs.noise_var), 0.0
            noise_level = _remember(noise_level, obs.noise_var)
        fit = fit_line(segment, mu, sigma2, settings.misfit)
        if settings.noise_memory and noise_level > fit.last_noise_var:
            fit = fit._replace(last_noise_var=noise_level)
        knots, rates = band_knots(fit, clock, knot_scale, settings.k)
        proposal = first_arrival(knots, rates, rng.exponential())
        refresh = math.inf
        if settings.refresh_rate > 0:
            refresh = clock + rng.exponential() / settings.refresh_rate
        stop, check = clock + left, clock + CHECK_AFTER * knot_scale
        event = min(proposal, refresh, stop, check)
        heading = metric * v
        x = x + (event - clock) * heading
        path.move_to(x, event - clock)
        left -= event - clock
        clock = event
        if not np.all(np.isfinite(x)):
            return finish(False)
        if event == stop:
            break
        if event == refresh:
            path.turn()
            v = _unit_velocity(len(x), rng)
            segment = Segment()
            counts["refreshes"] += 1
            continue
        obs = observe(x, heading)
        counts["rows"] += obs.rows
        if not (math.isfinite(obs.value) and math.isfinite(obs.noise_var)):
            return finish(False)
        observed = segment.add(clock, obs.value, obs.noise_var)
        noise_level = _remember(noise_level, obs.noise_var)
        if event == check:  # no proposal for a long while: look, without a decision
            counts["checks"] += 1
            segment = observed
            continue
        counts["proposals"] += 1
        if counts["proposals"] > MAX_PROPOSALS:  # stop here, keeping the path so far
            return finish(True, exhausted=True)
        bound = interpolate_rate(knots, rates, clock)
        expected += _violation_probability(fit, clock, bound)
        positive = max(obs.value, 0.0)
        if positive > bound:
            counts["violations"] += 1
            missed += (positive - bound) / bound if bound > 0.0 else 1.0
        if rng.uniform() * bound >= positive:  # rejected: the observation joins the fit
            segment = observed
            continue
        gradient = obs.gradient()  # accepted with min(1, [G]_+ / lambda): bounce
        if not np.all(np.isfinite(gradient)):
            return finish(False)
        mu, sigma2 = prior_step(observed, mu, sigma2, settings.prior_rate)
        path.turn()
        v = reflect(v, metric * gradient)
        if settings.metric_adaptation is not None:
            grad_sq, metric = adapt_metric(grad_sq, gradient, *settings.metric_adaptation)
        # the same minibatch after the bounce: -G_hat (Eq. 4), or its value under a new M
        after = float(v @ (metric * gradient))
        segment, clock = Segment().add(0.0, after, obs.noise_var), 0.0
        counts["bounces"] += 1
    return finish(True)


def _remember(level: float, noise_var: float) -> float:
    """Running mean of the observations' noise variances (weight ``NOISE_MEMORY``)."""
    if level == 0.0:
        return noise_var
    return level + NOISE_MEMORY * (noise_var - level)


def _violation_probability(fit, t: float, bound: float) -> float:
    """``P(G(t) > bound)`` under the regression's predictive law (Eq. 11)."""
    sd = fit.predictive_sd_at(t)
    if not sd > 0.0:
        return 0.0
    return 0.5 * math.erfc((bound - fit.mean(t)) / (sd * math.sqrt(2.0)))
