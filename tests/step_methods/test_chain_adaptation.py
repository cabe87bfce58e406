"""What a chain's tuning changes on a step (``step_methods/chain_adaptation.py``).

``adapt=True`` lets the tuning windows replace the preconditioner and move the anchor;
``adapt="step_size"`` (the HMC-ECS paper's set-up, open to every sampler) adapts the step
size only and keeps the Laplace fit's preconditioner and anchor through every window's end.
"""

from __future__ import annotations

import pymc as pm
import pytest

import pymc_bigdata as pmbd

#: 40 tuning draws: two windows end (at 8 and 36)
TUNE = 40


def _tune(model, step):
    """One chain of ``TUNE`` tuning draws and 5 kept ones."""
    with model:
        return pm.sample(
            step=step,
            tune=TUNE,
            draws=5,
            chains=1,
            random_seed=7,
            progressbar=False,
            compute_convergence_checks=False,
        )


@pytest.mark.parametrize("cls", [pmbd.SGLD, pmbd.SGHMC], ids=lambda c: c.__name__)
@pytest.mark.parametrize("adapt", [True, "step_size"], ids=["geometry", "step_size"])
def test_windows_replace_the_geometry_only_when_it_adapts(cls, adapt, small_logistic):
    """With ``adapt=True`` a window's end replaces the preconditioner (the anchor moves only
    when the window's mean is far from it); with ``adapt="step_size"`` both are the Laplace
    fit's at the end of tuning."""
    model, layer = small_logistic
    step = cls(model=model, layer=layer, adapt=adapt)
    precond, anchor = step.precond, step.anchor
    _tune(model, step)
    if adapt is True:
        assert step.precond is not precond
        return
    assert step.precond is precond and step.anchor is anchor
