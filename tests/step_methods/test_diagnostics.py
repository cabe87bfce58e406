"""End-of-chain bias alarms (``step_methods/diagnostics.py``)."""

from __future__ import annotations

import numpy as np

from pymc_bigdata.step_methods.diagnostics import ChainMonitor, temperature_alarm


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
