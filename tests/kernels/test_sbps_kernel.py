"""The SBPS kernel's pieces: Poisson first arrivals, reflection, the regression band, and
the process itself on Gaussians with exact and noisy gradients."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest
import scipy.stats

from pymc_bigdata.kernels.poisson_time import first_arrival, integrated_rate, interpolate_rate
from pymc_bigdata.kernels.sbps import (
    CHECK_AFTER,
    Observation,
    SBPSSettings,
    SBPSState,
    adapt_metric,
    reflect,
    sbps_advance,
    sbps_init,
)
from pymc_bigdata.kernels.sbps_regression import Segment, band_knots, fit_line, prior_step

# ---------------------------------------------------------------- first arrivals

RATES = {
    "rising": (np.array([0.0, 0.5, 1.0, 3.0]), np.array([0.2, 0.5, 2.0, 4.0])),
    "through zero": (np.array([0.0, 1.0, 2.0]), np.array([-1.0, 0.5, 0.2])),
    "falling": (np.array([0.0, 1.0, 2.0]), np.array([3.0, 1.0, -0.5])),
    "flat tail": (np.array([1.0, 2.0, 4.0]), np.array([0.0, 1.0, 1.0])),
}


@pytest.mark.parametrize("name", RATES)
def test_first_arrival_inverts_the_integrated_rate(name):
    """``Lambda(T) = E`` at the returned time, for draws across the range."""
    knots, rates = RATES[name]
    for e in [1e-6, 0.01, 0.3, 1.0, 2.5, 7.0]:
        t = first_arrival(knots, rates, e)
        if math.isinf(t):  # only when the total mass is finite and below e
            assert integrated_rate(knots, rates, 1e9) < e
        else:
            assert integrated_rate(knots, rates, t) == pytest.approx(e, rel=1e-9, abs=1e-12)
            assert t >= knots[0]


@pytest.mark.parametrize("name", RATES)
def test_first_arrival_law(name):
    """KS test: arrival times from ``E ~ Exp(1)`` have ``P(T <= t) = 1 - exp(-Lambda(t))``
    (would fail for an error in any piece's quadratic, e.g. a dropped 1/2)."""
    knots, rates = RATES[name]
    rng = np.random.default_rng(4)
    times = np.array([first_arrival(knots, rates, rng.exponential()) for _ in range(4000)])
    finite = times[np.isfinite(times)]
    total = integrated_rate(knots, rates, 1e9)
    # condition on arriving at all: P(T <= t | T < inf) = (1 - e^-L(t)) / (1 - e^-L(inf))
    cdf = np.vectorize(
        lambda t: -math.expm1(-integrated_rate(knots, rates, t)) / -math.expm1(-total)
    )
    assert scipy.stats.kstest(finite, cdf).pvalue > 1e-3
    expected_missing = math.exp(-total)
    missing = 1 - len(finite) / len(times)
    assert abs(missing - expected_missing) < 4 * math.sqrt(expected_missing / len(times)) + 1e-9


def test_interpolated_rate_is_positive_part_and_extrapolates():
    knots, rates = RATES["through zero"]
    assert interpolate_rate(knots, rates, 0.0) == 0.0
    assert interpolate_rate(knots, rates, 1.0) == pytest.approx(0.5)
    assert interpolate_rate(knots, rates, 3.0) == pytest.approx(0.0 + max(0.2 - 0.3, 0.0))


# ---------------------------------------------------------------- reflection


def test_reflection_keeps_speed_flips_normal_component_and_is_an_involution():
    rng = np.random.default_rng(1)
    for _ in range(20):
        v, g = rng.standard_normal(6), rng.standard_normal(6)
        r = reflect(v, g)
        assert np.linalg.norm(r) == pytest.approx(np.linalg.norm(v))
        assert r @ g == pytest.approx(-(v @ g))
        assert np.allclose(reflect(r, g), v)


def test_metric_is_normalised_and_follows_gradient_scale():
    """Eqs. 17-18: mean metric 1; a coordinate with larger gradients gets a smaller metric."""
    grad_sq = np.zeros(3)
    for _ in range(500):
        grad_sq, metric = adapt_metric(grad_sq, np.array([1.0, 10.0, 100.0]), 0.99, 1e-4)
    assert metric.mean() == pytest.approx(1.0)
    assert metric[0] / metric[1] == pytest.approx(10.0, rel=1e-3)


def _eqs_17_18(gradients: list[np.ndarray], beta: float, eps: float):
    """Eqs. 17-18 written out, from ``a = 0``: ``a <- beta a + (1 - beta) g^2`` (``beta`` on
    the past, as the module docstring reads the printed Eq. 17) and ``M_i = (a_i +
    eps)^(-1/2) / mean_j (a_j + eps)^(-1/2)``."""
    a = np.zeros_like(gradients[0])
    for g in gradients:
        a = beta * a + (1.0 - beta) * g**2
    inv_sd = (a + eps) ** -0.5
    return a, inv_sd / inv_sd.mean()


def test_metric_update_places_beta_on_the_past():
    """Eq. 17's running mean after a few different gradients, against the recursion written
    out: after one gradient ``a = (1 - beta) g^2`` (0.01 g^2 at beta = 0.99, not 0.99 g^2),
    and the metric is Eq. 18's normalised inverse sd.

    A constant gradient cannot tell where ``beta`` goes (both placements converge to ``g^2``,
    which is all the test above sees); this catches ``beta`` on the new gradient, a metric
    that is not updated, or one that is not normalised."""
    rng = np.random.default_rng(3)
    beta, eps = 0.99, 1e-4
    gradients = [rng.normal(scale=[1.0, 10.0, 100.0]) for _ in range(5)]
    grad_sq = np.zeros(3)
    for j, g in enumerate(gradients, start=1):
        grad_sq, metric = adapt_metric(grad_sq, g, beta, eps)
        expected_sq, expected_metric = _eqs_17_18(gradients[:j], beta, eps)
        np.testing.assert_allclose(grad_sq, expected_sq, rtol=1e-12)
        np.testing.assert_allclose(metric, expected_metric, rtol=1e-12)
    first, _ = adapt_metric(np.zeros(3), gradients[0], beta, eps)
    np.testing.assert_allclose(first, (1.0 - beta) * gradients[0] ** 2, rtol=1e-12)


# ---------------------------------------------------------------- regression band


def _segment(times, values, noise):
    seg = Segment()
    for t, g, c in zip(times, values, noise):
        seg = seg.add(t, g, c)
    return seg


def test_line_fit_and_band_match_a_direct_computation():
    """Eqs. 9-12 against the textbook weighted least squares with a slope prior."""
    t = np.array([0.0, 0.3, 0.7, 1.2])
    g = np.array([-1.0, -0.6, -0.1, 0.5])
    c2 = np.array([0.04, 0.05, 0.02, 0.03])
    mu, sigma2 = 1.5, 0.8
    fit = fit_line(_segment(t, g, c2), mu, sigma2, misfit=False)
    x = np.stack([np.ones_like(t), t], axis=1)
    precision = x.T @ np.diag(1 / c2) @ x + np.diag([0.0, 1 / sigma2])
    cov = np.linalg.inv(precision)
    beta = cov @ (x.T @ (g / c2) + np.array([0.0, mu / sigma2]))
    assert [fit.beta0, fit.beta1] == pytest.approx(beta)
    assert [fit.v00, fit.v01, fit.v11] == pytest.approx([cov[0, 0], cov[0, 1], cov[1, 1]])
    query = np.array([1.3, 2.0])
    rho = np.sqrt([np.array([1, s]) @ cov @ np.array([1, s]) + c2[-1] for s in query])
    assert fit.upper_band(query, 3.0) == pytest.approx(beta[0] + beta[1] * query + 3 * rho)
    knots, rates = map(np.asarray, band_knots(fit, 1.2, 1.0, 3.0))
    assert knots[0] == 1.2 and np.all(np.diff(knots) > 0)
    # the band is convex, so its chords lie above it
    middle = 0.5 * (knots[1:] + knots[:-1])
    assert np.all(0.5 * (rates[1:] + rates[:-1]) >= fit.upper_band(middle, 3.0) - 1e-12)


def test_band_knots_bound_a_constant_gradient():
    """Eq. 13's proposal rate at the knots on observations of a constant ``G = 2`` (noise sd
    0.2): ``beta_1 t + beta_0 + k rho(t)`` with the textbook posterior of Eq. 9's line (slope
    prior ``N(0.5, 0.2)``), the rate the thinning uses. Catches the intercept and slope
    swapped, or ``k`` or ``rho`` misplaced, in the knots' band."""
    t = np.linspace(0.0, 1.25, 6)
    g = np.full(6, 2.0)
    c2 = np.full(6, 0.04)
    mu, sigma2, k = 0.5, 0.2, 3.0
    fit = fit_line(_segment(t, g, c2), mu, sigma2, misfit=False)
    x = np.stack([np.ones_like(t), t], axis=1)
    cov = np.linalg.inv(x.T @ np.diag(1 / c2) @ x + np.diag([0.0, 1 / sigma2]))
    beta = cov @ (x.T @ (g / c2) + np.array([0.0, mu / sigma2]))
    knots, rates = map(np.asarray, band_knots(fit, 1.25, 0.5, k))
    design = np.stack([np.ones_like(knots), knots], axis=1)
    rho = np.sqrt(np.einsum("ij,jk,ik->i", design, cov, design) + c2[-1])
    np.testing.assert_allclose(rates, design @ beta + k * rho, rtol=1e-12)
    assert np.all(rates > 2.0)  # a bound above the gradient it has seen


def test_misfit_widens_the_band_only_for_curved_data():
    t = np.linspace(0.0, 1.0, 6)
    c2 = np.full(6, 1e-4)
    straight = fit_line(_segment(t, 2 * t - 1, c2), 1.0, 1.0)
    curved = fit_line(_segment(t, 3 * t**2 - 1, c2), 1.0, 1.0)
    plain = fit_line(_segment(t, 3 * t**2 - 1, c2), 1.0, 1.0, misfit=False)
    assert straight.last_noise_var == pytest.approx(1e-4)
    assert curved.predictive_sd(1.5) > 10 * plain.predictive_sd(1.5)


def test_prior_step_moves_towards_informative_segments_only():
    informative = _segment([0.0, 1.0, 2.0], [-1.0, 1.0, 3.0], [1e-4] * 3)  # slope 2
    uninformative = _segment([0.0, 0.01], [-1.0, 5.0], [100.0, 100.0])
    mu, s2 = prior_step(informative, 1.0, 0.5, 0.1)
    assert mu == pytest.approx(1.1, rel=1e-3) and s2 > 0.5 * 0.9
    mu2, _ = prior_step(uninformative, 1.0, 0.5, 0.1)
    assert abs(mu2 - 1.0) < 1e-3


# ---------------------------------------------------------------- the process


def _gaussian_observer(precision: np.ndarray, noise_sd: float, rng):
    """Exact (or noisy, iid per observation) gradients of U = x^T P x / 2."""

    def observe(x, direction):
        grad = precision @ x + noise_sd * rng.standard_normal(len(x))
        return Observation(
            float(direction @ grad), noise_sd**2 * float(direction @ direction), 1, lambda: grad
        )

    return observe


class _Run(NamedTuple):
    """What :func:`_run` recorded: the draws, the path averages of ``x`` and ``x^2`` per draw,
    the final state, the metric after each draw, and every gradient a bounce used (in
    order)."""

    draws: np.ndarray
    means: np.ndarray
    squares: np.ndarray
    state: SBPSState
    metrics: np.ndarray
    bounce_gradients: list[np.ndarray]


def _run(
    precision: np.ndarray,
    noise_sd: float,
    k: float,
    draws: int,
    seed: int,
    metric_adaptation: tuple[float, float] | None = None,
    **settings_given,
) -> _Run:
    rng = np.random.default_rng(seed)
    d = len(precision)
    state = sbps_init(np.zeros(d), rng, 1.0, 1.0)
    given = {"refresh_rate": 1 / math.sqrt(d), **settings_given}
    settings = SBPSSettings(k=k, metric_adaptation=metric_adaptation, **given)
    gaussian = _gaussian_observer(precision, noise_sd, rng)
    bounce_gradients: list[np.ndarray] = []

    def observe(x, direction):  # the Gaussian observer, keeping the gradients bounces read
        obs = gaussian(x, direction)

        def gradient():
            bounce_gradients.append(obs.gradient())
            return bounce_gradients[-1]

        return obs._replace(gradient=gradient)

    positions, means, squares, metrics = [], [], [], []
    travel = 2.0 * math.sqrt(d)
    for _ in range(draws):
        state, info = sbps_advance(state, observe, travel, settings, rng, lambda x: x)
        assert info.finite
        positions.append(state.position)
        means.append(info.integral / travel)
        squares.append(info.integral_sq / travel)
        metrics.append(state.metric)
    return _Run(
        np.array(positions),
        np.array(means),
        np.array(squares),
        state,
        np.array(metrics),
        bounce_gradients,
    )


def _assert_covariance(draws, cov, ess_floor):
    """Mean within 4.5 sd/sqrt(ESS) and variances within 4.5 relative SEs (sqrt(2/ESS));
    ``draws`` of one chain ``(draw, d)`` or of several ``(chain, draw, d)``."""
    import arviz as az

    chains = draws if draws.ndim == 3 else draws[None]
    sd = np.sqrt(np.diag(cov))
    ess = np.array([float(az.ess(chains[..., j])) for j in range(chains.shape[-1])])
    assert ess.min() > ess_floor
    flat = chains.reshape(-1, chains.shape[-1])
    assert np.all(np.abs(flat.mean(0)) < 4.5 * sd / np.sqrt(ess))
    sq_ess = np.array([float(az.ess(chains[..., j] ** 2)) for j in range(chains.shape[-1])])
    rel = flat.var(0) / sd**2
    assert np.all(np.abs(rel - 1) < 4.5 * np.sqrt(2 / sq_ess)), rel


def test_exact_gradients_reproduce_a_correlated_gaussian():
    """With exact gradients and k = 5 the process targets a correlated 2-D Gaussian: from
    the recorded draws and from the continuous-time (path) averages."""
    cov = np.array([[1.0, 0.8], [0.8, 1.0]])
    draws, means, squares, *_ = _run(np.linalg.inv(cov), 0.0, 5.0, 4000, seed=2)
    _assert_covariance(draws, cov, 500)
    path_var = squares.mean(0) - means.mean(0) ** 2
    assert path_var == pytest.approx(np.diag(cov), rel=0.12)
    assert np.abs(means.mean(0)).max() < 0.15


def test_noisy_gradients_keep_the_target():
    """Theorem 1: zero-mean gradient noise (sd 1 per coordinate) leaves a 5-D unit Gaussian
    invariant; k = 5 keeps bound violations negligible."""
    draws = _run(np.eye(5), 1.0, 5.0, 3000, seed=3).draws
    _assert_covariance(draws, np.eye(5), 500)


def test_a_biased_kernel_fails_the_check():
    """Power: a process whose bounces use twice the gradient (the wrong target) fails."""
    draws = _run(2.0 * np.eye(3), 0.0, 5.0, 3000, seed=4).draws
    with pytest.raises(AssertionError):
        _assert_covariance(draws, np.eye(3), 100)


def test_preconditioned_reflection_keeps_the_target():
    """Eq. 16 with a fixed diagonal metric M: moving along M v and reflecting on M grad U
    still targets the Gaussian (an anisotropic one, sds 1 and 10)."""
    precision = np.diag([1.0, 0.01])
    rng = np.random.default_rng(5)
    state = sbps_init(np.zeros(2), rng, 1.0, 1.0, metric=np.array([0.2, 1.8]))
    settings = SBPSSettings(k=5.0, refresh_rate=0.1)
    observe = _gaussian_observer(precision, 0.0, rng)
    draws = []
    for _ in range(3000):
        state, info = sbps_advance(state, observe, 20.0, settings, rng, lambda x: x)
        draws.append(state.position)
    _assert_covariance(np.array(draws), np.diag([1.0, 100.0]), 300)


def test_psbps_adapts_the_metric_at_every_bounce():
    """pSBPS (Sec. 5) on an axis-aligned Gaussian with sds 1 and 3: after 300 draws the
    state's running mean ``a`` and metric ``M`` are Eqs. 17-18 applied, in order, to the
    gradients of all the bounces (recomputed here, to rounding), and they moved.

    Catches an adaptation that leaves the metric unchanged (or is never called), one that
    reads another gradient than the bounce's, and ``beta`` on the new gradient."""
    beta, eps = 0.99, 1e-4
    run = _run(np.diag([1.0, 1 / 9]), 0.0, 5.0, 300, seed=6, metric_adaptation=(beta, eps))
    assert len(run.bounce_gradients) > 100
    grad_sq, metric = _eqs_17_18(run.bounce_gradients, beta, eps)
    np.testing.assert_allclose(run.state.grad_sq, grad_sq, rtol=1e-10)
    np.testing.assert_allclose(run.state.metric, metric, rtol=1e-10)
    assert metric[1] / metric[0] > 1.5  # it moved (from 1): the check has something to see


def test_psbps_paper_metric_learns_from_every_proposal():
    """The authors' pSBPS (``metric_every_observation``), noisy gradients: every proposal's
    minibatch gradient enters Eqs. 17-18, in order, and a bounce reuses its proposal's gradient
    (computed once). Catches learning at the bounces only (far fewer gradients) and a
    gradient computed twice (counted twice)."""
    beta, eps = 0.99, 1e-4
    run = _run(
        np.diag([1.0, 1 / 9]),
        1.0,
        5.0,
        100,
        seed=6,
        metric_adaptation=(beta, eps),
        metric_every_observation=True,
        refresh_rate=0.0,
    )
    grad_sq, metric = _eqs_17_18(run.bounce_gradients, beta, eps)
    np.testing.assert_allclose(run.state.grad_sq, grad_sq, rtol=1e-10)
    np.testing.assert_allclose(run.state.metric, metric, rtol=1e-10)
    bounces = _run(np.diag([1.0, 1 / 9]), 1.0, 5.0, 100, seed=6, metric_adaptation=(beta, eps))
    assert len(run.bounce_gradients) > 3 * len(bounces.bounce_gradients)


@pytest.mark.parametrize("check_after", [None, CHECK_AFTER])
def test_checks_happen_only_when_asked(check_after):
    """``check_after=None`` (the paper) makes no check observations; the default spacing
    makes some on a wide target with exact gradients (long downhill runs, no proposal)."""
    rng = np.random.default_rng(8)
    state = sbps_init(np.zeros(3), rng, 0.01, 1e-4)
    settings = SBPSSettings(k=3.0, check_after=check_after)
    observe = _gaussian_observer(0.01 * np.eye(3), 0.0, rng)
    checks = 0
    for _ in range(50):
        state, info = sbps_advance(state, observe, 10.0, settings, rng, lambda x: x)
        checks += info.checks
    assert (checks == 0) if check_after is None else (checks > 20), checks


def test_paper_prior_step_is_a_plain_gradient_step():
    """``update="gradient"``: ``mu += rate (m - mu) / sigma^2`` and ``log sigma^2 += rate
    ((m - mu)^2 + s^2 - sigma^2) / (2 sigma^2)``, with no floor (the EM form's floor would
    keep sigma^2 >= 0.01 mu^2 here)."""
    segment = _segment([0.0, 1.0, 2.0], [-1.0, 1.0, 3.0], [1e-4] * 3)  # slope 2
    mu, sigma2, rate = 2.0, 0.03, 0.5
    fit = fit_line(segment, mu, sigma2, misfit=False)
    new_mu, new_s2 = prior_step(segment, mu, sigma2, rate, "gradient")
    assert new_mu == pytest.approx(mu + rate * (fit.beta1 - mu) / sigma2, rel=1e-12)
    gap2 = (fit.beta1 - mu) ** 2 + fit.v11
    assert new_s2 == pytest.approx(sigma2 * math.exp(rate * (gap2 - sigma2) / (2 * sigma2)))
    assert new_s2 < 0.01 * new_mu**2 <= prior_step(segment, mu, sigma2, rate)[1]


def test_psbps_learns_the_scales_and_keeps_the_target():
    """pSBPS on an axis-aligned Gaussian with sds 1 and 3 (16 independent chains of 600
    draws, the first 200 discarded): the metric settles where the preconditioned target is
    isotropic. There bounce gradients ``M_i g_i`` are exchangeable across coordinates, so
    Eq. 18 makes ``M_i`` proportional to ``sigma_i``: the chains' mean ``log(M_2 / M_1)`` is
    within 4.5 standard errors (across chains) of ``log 3``. The draws keep the target (its
    mean and variances within 4.5 Monte Carlo standard errors): with ``beta = 0.99`` the
    metric changes slowly enough for the term the paper drops.

    Catches an adaptation that does nothing (``log(M_2 / M_1) = 0``) or misreads the
    gradient's scale (``M`` proportional to ``sigma^2`` or ``1 / sigma``)."""
    precision = np.diag([1.0, 1 / 9])
    draws, log_ratios = [], []
    for seed in range(16):
        run = _run(precision, 0.0, 5.0, 600, seed=100 + seed, metric_adaptation=(0.99, 1e-12))
        draws.append(run.draws[200:])
        log_ratios.append(np.log(run.metrics[200:, 1] / run.metrics[200:, 0]).mean())
    se = np.std(log_ratios, ddof=1) / math.sqrt(len(log_ratios))
    assert abs(np.mean(log_ratios) - math.log(3.0)) <= 4.5 * se, (np.mean(log_ratios), se)
    _assert_covariance(np.array(draws), np.diag([1.0, 9.0]), 300)


def test_non_finite_observation_stops_with_finite_false():
    rng = np.random.default_rng(0)

    def observe(x, direction):
        return Observation(math.nan, 0.0, 1, lambda: x)

    state = sbps_init(np.zeros(2), rng, 1.0, 1.0)
    _, info = sbps_advance(state, observe, 1.0, SBPSSettings(), rng, lambda x: x)
    assert not info.finite


def test_missed_bounces_measure_the_rate_the_bound_cut_off(monkeypatch):
    """``missed_bounces`` counts what the bound cut off: on ``U = c |x|`` (``G = c`` while
    moving uphill, ``-c`` downhill) with the proposal rate pinned at ``lambda0 < c``, every
    uphill proposal bounces and misses ``(c - lambda0) / lambda0`` of a bounce (the rate
    ``c - lambda0`` the thinning could not realise, per realised ``lambda0``); downhill
    proposals miss nothing."""
    import pymc_bigdata.kernels.sbps as sbps_module

    c, pinned = 3.0, 1.0
    monkeypatch.setattr(
        sbps_module,
        "band_knots",
        lambda fit, start, scale, k: ([start, start + 1.0], [pinned, pinned]),
    )

    def observe(x, direction):
        gradient = np.array([c * np.sign(x[0])])
        return Observation(float(direction @ gradient), 1e-6, 1, lambda: gradient)

    rng = np.random.default_rng(12)
    state = sbps_init(np.array([0.3]), rng, 1.0, 1.0)
    missed = bounces = 0.0
    for _ in range(200):
        state, info = sbps_advance(state, observe, 50.0, SBPSSettings(), rng, lambda x: x)
        missed += info.missed_bounces
        bounces += info.bounces
    assert bounces > 5000
    assert missed / bounces == pytest.approx((c - pinned) / pinned, rel=1e-9)
