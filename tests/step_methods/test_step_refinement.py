"""When a draw is re-run at a finer step (``step_refinement.StepRefinement``)."""

from __future__ import annotations

import math

import pytest

from pymc_bigdata.step_methods.step_refinement import StepRefinement, check_max_refinements


def test_the_typical_curvature_is_the_median_of_the_last_tuning_draws():
    """1 until ``MIN_SEEN`` draws, then the median of the last ``WINDOW``; non-finite and
    non-positive curvatures (a path that did not move, a blow-up) are not counted."""
    policy = StepRefinement(6)
    for _ in range(StepRefinement.MIN_SEEN - 1):
        policy.observe(5.0)
    policy.observe(math.nan)
    policy.observe(-1.0)
    assert policy.typical() == 1.0
    policy.observe(5.0)
    assert policy.typical() == 5.0
    for _ in range(StepRefinement.WINDOW):
        policy.observe(3.0)
    assert policy.typical() == 3.0  # the older 5s have left the window
    policy.restart()
    assert policy.typical() == 1.0


def test_a_path_is_too_stiff_beyond_its_ratio_to_the_typical_curvature_or_near_instability():
    """At the base step 0.5 and typical curvature 1: 2 is allowed, 2.1 is not; at half the
    step (the path's curvature counted at 1/4) up to 8; and ``eps^2`` times the curvature
    above 2 is too stiff whatever the chain's typical curvature."""
    policy = StepRefinement(6)
    assert not policy.too_stiff(2.0, 0.5, 0.5)
    assert policy.too_stiff(2.1, 0.5, 0.5)
    assert not policy.too_stiff(8.0, 0.25, 0.5)
    assert policy.too_stiff(8.5, 0.25, 0.5)
    for _ in range(StepRefinement.MIN_SEEN):
        policy.observe(100.0)
    assert not policy.too_stiff(7.9, 0.5, 0.5)  # typical 100: the ratio would allow 200
    assert policy.too_stiff(8.1, 0.5, 0.5)  # but 0.25 * 8.1 > 2: near instability
    assert not policy.too_stiff(math.nan, 0.5, 0.5)


def test_a_small_step_is_not_re_run_for_its_ratio_alone():
    """At a step of 0.05 a path 40 times as curved as the chain's typical one (``eps^2``
    times it 0.1, below ``MIN_STIFFNESS``) is accurate enough: not re-run. Caught (watched):
    without the floor, SGHMC at a fixed step of 0.05 re-ran draws for their gradient noise
    (``test_ewsg.py::test_noise_is_measured_on_the_last_transition``)."""
    policy = StepRefinement(6)
    assert not policy.too_stiff(40.0, 0.05, 0.05)
    assert policy.too_stiff(40.0, 0.1, 0.1)  # 0.4 above the floor, 40 > 2 x 1


def test_euler_s_stiffness_is_first_order():
    """``order=1`` (SGLD): at the base step 0.2 and typical curvature 1, 2 is allowed and 2.1
    is not; at half the step up to 4 (not 8, as for BAOAB); ``eps kappa`` above 2 is too
    stiff whatever the typical curvature, and below 0.25 never for the ratio alone."""
    policy = StepRefinement(6, order=1)
    assert not policy.too_stiff(2.0, 0.2, 0.2)
    assert policy.too_stiff(2.1, 0.2, 0.2)
    assert not policy.too_stiff(4.0, 0.1, 0.2)
    assert policy.too_stiff(4.1, 0.1, 0.2)
    assert not StepRefinement(6, order=2).too_stiff(7.9, 0.1, 0.2)
    assert not policy.too_stiff(4.0, 0.05, 0.05)  # eps kappa 0.2: below the floor
    for _ in range(StepRefinement.MIN_SEEN):
        policy.observe(100.0)
    assert not policy.too_stiff(9.9, 0.2, 0.2)
    assert policy.too_stiff(10.1, 0.2, 0.2)  # eps kappa 2.02: near Euler's limit of 4
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        StepRefinement(6, order=3)


@pytest.mark.parametrize("bad", [-1, 2.0, True, "6"])
def test_max_refinements_must_be_a_non_negative_int(bad):
    with pytest.raises(ValueError, match="max_refinements must be"):
        check_max_refinements(bad, 6)
    assert check_max_refinements(None, 6) == 6
    assert check_max_refinements(0, 6) == 0
