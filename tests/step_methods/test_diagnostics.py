"""End-of-chain bias alarms (``step_methods/diagnostics.py``)."""

from __future__ import annotations

import numpy as np

from pymc_bigdata.step_methods.diagnostics import (
    MIN_FRESH_MEASUREMENTS,
    ChainMonitor,
    temperature_alarm,
)


def test_virial_of_unit_gaussian_draws_raises_no_alarm():
    """-z . grad log p(z) / d = |z|^2 / d averages 1 for exact draws of N(0, I_5)."""
    z = np.random.default_rng(1).standard_normal((1000, 5))
    mean, se, off = temperature_alarm((z**2).mean(axis=1))
    assert abs(mean - 1) < 4 * se and not off


def test_heated_draws_raise_the_alarm():
    """Draws with variance 1.5 (sd 22 % too wide) give a virial near 1.5: alarm."""
    z = np.random.default_rng(2).normal(0, np.sqrt(1.5), size=(1000, 5))
    assert temperature_alarm((z**2).mean(axis=1))[2]


def test_monitor_message_names_each_problem():
    monitor = ChainMonitor(dim=2)
    rng = np.random.default_rng(3)
    for _ in range(400):
        monitor.add(3.0 + 0.1 * rng.standard_normal(), 0.5, 1.0 + 0.01 * rng.standard_normal())
    message = monitor.verdict("SGHMC", noise_bound=0.05)
    assert "virial 3" in message and "50%" in message
    assert "kinetic temperature" not in message
    quiet = ChainMonitor(dim=2)
    for _ in range(400):
        quiet.add(1.0 + 0.1 * rng.standard_normal(), 0.01, np.nan)
    assert quiet.verdict("SGLD", noise_bound=0.05) is None


def _monitor(dim: int, virial: float) -> ChainMonitor:
    monitor = ChainMonitor(dim=dim)
    rng = np.random.default_rng(4)
    for _ in range(1000):
        monitor.add(virial + 0.003 * rng.standard_normal(), 0.01, np.nan)
    return monitor


def test_a_small_heating_in_many_dimensions_raises_the_alarm():
    """A virial of 1.08 in d = 4,004 (SGLD on crossed ratings, residual scale 1.08 sd off)
    puts the draws' log density 3.6 posterior sds off: alarm, naming it. The same virial in
    d = 45, and 1.04 in d = 1,003 (SGLD on 1,000 groups, in its bars; 0.9 sds), raise none.

    Mutation: ``virial_tolerance`` returning ``ALARM_TOLERANCE`` (no dimension): d = 4,004
    raises nothing."""
    message = _monitor(4004, 1.08).verdict("SGLD", noise_bound=0.05)
    assert message is not None and "4004 dimensions" in message and "3.6" in message
    assert _monitor(45, 1.08).verdict("SGLD", noise_bound=0.05) is None
    assert _monitor(1003, 1.04).verdict("SGLD", noise_bound=0.05) is None


def test_noise_alarm_judges_the_measurements_after_tuning():
    """The running-mean ``noise_share`` stat carries tuning's estimate (at the bound, 5 %);
    the measurements after tuning decide: a steady share of 0.2 (4 times the bound) raises
    the alarm; a mean of 0.1 does not; nor does a mean of 0.4 carried by one measurement in
    100 (a heavy tail: the limit is not exceeded by 2 standard errors); with fewer than
    ``MIN_FRESH_MEASUREMENTS`` the stat's median decides (quiet here).

    Mutations: the verdict judging the stat's median whatever the measurements (the rule
    before) leaves the steady chain quiet; the mean without its standard error flags the
    heavy-tailed one."""
    rng = np.random.default_rng(5)

    def chain(measurements: list[float]) -> ChainMonitor:
        monitor = ChainMonitor(dim=3)
        for k in range(1000):
            monitor.add(1.0 + 0.1 * rng.standard_normal(), 0.05, np.nan)
            if k % 10 == 0 and k // 10 < len(measurements):
                monitor.add_noise(np.array([0.01, 0.02, measurements[k // 10]]))
        return monitor

    steady = 0.2 * rng.gamma(20.0, 1 / 20.0, size=100)
    message = chain(list(steady)).verdict("SGHMC", noise_bound=0.05)
    assert message is not None and "after tuning (100 measurements)" in message
    assert chain(list(steady / 2)).verdict("SGHMC", noise_bound=0.05) is None
    one_kick = [0.0] * 99 + [40.0]
    assert chain(one_kick).verdict("SGHMC", noise_bound=0.05) is None
    few = [0.2] * (MIN_FRESH_MEASUREMENTS - 1)
    assert chain(few).verdict("SGHMC", noise_bound=0.05) is None
