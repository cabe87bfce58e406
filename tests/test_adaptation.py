"""The pure pieces of tuning: window schedule, running moments, covariance blend and the
noise-bounded step-size rule (closed forms)."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.adaptation import (
    RunningMoments,
    blend_covariance,
    largest_step_within_noise_bound,
    mean_share_bound,
    rescale_laplace,
    window_ends,
)


def test_window_schedule_for_pm_sample_default():
    """1000 tuning draws: 75-draw initial buffer, doubling windows, 100-draw terminal buffer."""
    assert window_ends(1000) == (75, [100, 150, 250, 450, 900], 900)


@pytest.mark.parametrize("tune", [40, 100, 333, 2000, 5000])
def test_windows_are_increasing_and_end_at_terminal_buffer(tune):
    init, ends, terminal = window_ends(tune)
    assert 0 < init < ends[0] and ends == sorted(ends) and ends[-1] == terminal < tune


def test_no_windows_for_short_tuning():
    assert window_ends(39) == (0, [], 0)


@pytest.mark.parametrize("dense", [True, False])
def test_running_moments_match_numpy(dense):
    x = np.random.default_rng(0).standard_normal((50, 3)) @ np.array(
        [[1, 0.5, 0], [0, 1, 0], [0, 0, 2]]
    )
    moments = RunningMoments(3, dense=dense)
    for row in x:
        moments.add(row)
    np.testing.assert_allclose(moments.mean, x.mean(axis=0))
    expected = np.cov(x.T) if dense else x.var(axis=0, ddof=1)
    np.testing.assert_allclose(moments.covariance(), expected)


def test_blend_weights_draws_against_prior():
    assert blend_covariance(np.array([4.0]), 30, np.array([1.0]), 10)[0] == pytest.approx(3.25)


def sgld_share(step, var):
    return step * var / 4.0


def test_step_rule_solves_the_noise_bound():
    """SGLD's share eps V / 4 = 0.05 at V = 4 gives eps = 0.05; the worst coordinate rules."""
    step = largest_step_within_noise_bound(sgld_share, np.array([0.1, 4.0]), 0.2, bound=0.05)
    assert step == pytest.approx(0.05, rel=2e-3)
    assert sgld_share(step, 4.0) <= 0.05


def test_step_rule_bounds_the_mean_share_in_many_dimensions():
    """4,000 coordinates of equal noise V = 1: the worst-coordinate bound alone allows SGLD's
    eps = 0.2 (share 0.05); the log-density shift bound 0.5 allows a mean share of
    0.5 / sqrt(2000) = 0.0112, i.e. eps = 4 x 0.0112. One noisy coordinate among them does not
    move the mean: the worst-coordinate bound rules again."""
    flat = np.ones(4000)
    assert mean_share_bound(4000) == pytest.approx(0.5 / np.sqrt(2000.0))
    assert largest_step_within_noise_bound(sgld_share, flat, 0.2, bound=0.05) == 0.2
    step = largest_step_within_noise_bound(
        sgld_share, flat, 0.2, bound=0.05, mean_bound=mean_share_bound(4000)
    )
    assert step == pytest.approx(4 * 0.5 / np.sqrt(2000.0), rel=2e-3)
    one_noisy = np.concatenate([[4.0], np.full(3999, 1e-3)])
    step = largest_step_within_noise_bound(
        sgld_share, one_noisy, 0.2, bound=0.05, mean_bound=mean_share_bound(4000)
    )
    assert step == pytest.approx(0.05, rel=2e-3)


def test_step_rule_keeps_the_default_when_noise_is_small():
    assert largest_step_within_noise_bound(sgld_share, np.array([0.01]), 0.2) == 0.2


def test_step_rule_floor_for_overwhelming_noise():
    step = largest_step_within_noise_bound(sgld_share, np.array([1e9]), 0.2, smallest=1e-4)
    assert step == pytest.approx(0.2 * 1e-4)


def test_rescale_keeps_laplace_unless_draws_clearly_disagree():
    """Marginal variance ratios within 3 standard errors of a log variance keep the Laplace
    covariance exactly (correlations included); a clearly wider coordinate is rescaled."""
    laplace = np.array([[1.0, 0.5], [0.5, 2.0]])
    n = 200  # se of a log variance: sqrt(2/200) = 0.1, so ratios within exp(+-0.3) are kept
    same = rescale_laplace(laplace, np.array([1.2, 1.6]), n)
    np.testing.assert_array_equal(same, laplace)
    wider = rescale_laplace(laplace, np.array([4.0, 2.1]), n)
    np.testing.assert_allclose(np.diag(wider), [4.0, 2.0])
    np.testing.assert_allclose(wider[0, 1], 0.5 * 2.0)  # correlation kept
