"""``PAPER_SETTINGS`` switch every project extension off (issue 26).

Each extension is checked on a model where the defaults switch it on (a non-centred
hierarchy with a 5-row group: re-centred coordinates, census rows, control variates, a
dense preconditioner, reshuffled minibatches, minibatches read as windows of a shuffled copy,
the windows' re-estimated preconditioner and anchor), so that a setting left out of a
sampler's ``PAPER_SETTINGS`` fails the test.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.row_windows import WindowPermutation

#: SBPS's own choices in the paper (Sec. 4 and 7.1): k = 3 not tuned, no refreshment,
#: Eq. 12's band, no checks, the paper's slope-prior update
_SBPS_PAPER = {
    "k": 3.0,
    "refresh_rate": 0.0,
    "misfit": False,
    "noise_memory": False,
    "check_after": None,
    "slope_prior": "paper",
    "batch_size": 100,
    "adapt": False,
}

#: what each sampler's paper fixes besides the shared extensions, and the values it needs
#: given (the papers tune nothing: the user gives the step)
PAPERS = {
    pmbd.SGLD: ({"adapt": False, "max_refinements": 0}, {"step_size": 1e-4}),
    pmbd.SGHMC: (
        {"integrator": "sghmc", "noise_estimate": "zero", "adapt": False, "max_refinements": 0},
        {"learning_rate": 1e-6, "alpha": 0.1},
    ),
    pmbd.EWSG: (
        {"integrator": "euler", "index_weights": "paper", "adapt": False},
        {"step_size": 1e-3, "friction": 50.0},
    ),
    pmbd.AusterityMH: ({"test": "plain", "proposal": "rw", "adapt": False}, {"step_size": 0.05}),
    # the paper tunes the step size by dual averaging and uses Taylor control variates and
    # a full mass matrix: only the geometry's re-estimation is ours
    pmbd.HMCECS: ({"taylor_space": "parameters", "adapt": True}, {}),
    pmbd.SBPS: (_SBPS_PAPER, {}),
    pmbd.pSBPS: (
        {**_SBPS_PAPER, "metric_update": "minibatch", "adapt_metric_after_tuning": True},
        {},
    ),
}

#: extensions a sampler does not have (nothing to switch off)
NOT_APPLICABLE = {
    pmbd.AusterityMH: {"reshuffled minibatches"},
    # HMC-ECS draws its subsample with replacement: uniform rows, never windows
    pmbd.HMCECS: {"reshuffled minibatches", "control variates", "preconditioner", "window gathers"},
    # SBPS refuses reshuffled minibatches (Theorem 1); pSBPS's metric is its own, and in the
    # model's coordinates its defaults pick no census rows here (checked on SBPS)
    pmbd.SBPS: {"reshuffled minibatches"},
    pmbd.pSBPS: {"reshuffled minibatches", "preconditioner", "census rows"},
}


@pytest.fixture(autouse=True)
def small_pools_read_windows(monkeypatch):
    """The 3,000 rows hold 3 default minibatches, below the windows' floor of 100: lowered,
    so that the defaults read windows here and the paper's settings must switch them off."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 1)


@pytest.fixture(scope="module")
def hierarchy():
    """A non-centred varying intercept, 3,000 rows in 8 groups of 5 to 1,025 rows."""
    rng = np.random.default_rng(5)
    sizes = np.array([5, 20, 50, 100, 300, 600, 900, 1025])
    group = np.repeat(np.arange(8), sizes)
    x = rng.normal(size=group.size)
    y = rng.normal(0.5, 0.7, size=8)[group] + 0.4 * x + rng.normal(size=group.size)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=8)
        slope = pm.Normal("slope", 0.0, 1.0)
        pm.Normal("y", mu + tau * z[group] + slope * x, 1.0, observed=y)
    return model, pmbd.MinibatchModel(model)


def _extensions(step) -> dict[str, bool]:
    """Which shared extensions a constructed step has on."""
    reparam = step.layer.reparam
    recentred = reparam is not None and reparam.moves_coordinates
    return {
        "control variates": step.cv_mode != "none",
        "preconditioner": step.precond.kind != "identity",
        "census rows": len(step.census) > 0,
        "reshuffled minibatches": bool(step.reshuffle),
        # AusterityMH's test reads its rows through a permutation of its own
        "window gathers": step.minibatches.windows
        or isinstance(getattr(step, "_permutation", None), WindowPermutation),
        "re-centred coordinates": recentred,
        "re-estimated preconditioner and anchor": bool(step.adapt_geometry),
    }


@pytest.mark.parametrize("cls", list(PAPERS), ids=lambda c: c.__name__)
def test_paper_settings_switch_every_extension_off(cls, hierarchy):
    """With the defaults every extension is on on this model; with ``PAPER_SETTINGS`` every
    one is off, the paper's own choices are made, and the given step is kept while sampling
    with plain minibatch gradients."""
    model, layer = hierarchy
    own, given = PAPERS[cls]
    skip = NOT_APPLICABLE.get(cls, set())
    default = _extensions(cls(model=model, layer=layer))
    default = {k: v for k, v in default.items() if k not in skip}
    assert all(default.values()), f"the defaults leave some extension off here: {default}"
    step = cls(model=model, layer=layer, **cls.PAPER_SETTINGS, **given)
    paper = {k: v for k, v in _extensions(step).items() if k not in skip}
    assert not any(paper.values()), paper
    for name, value in own.items():
        assert getattr(step, name) == value, name
    precond = step.precond
    with model:
        idata = pm.sample(
            step=step,
            tune=40,  # two windows end (at 8 and 36): neither may replace the geometry
            draws=10,
            chains=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    if cls.PAPER_SETTINGS.get("control_variates", True) is False:
        assert np.all(stats["cv_order"].values == 0)
    if not step.adapt:
        assert np.all(stats["step_size"].values == stats["step_size"].values[0, 0])
    assert step.precond is precond  # no window replaced the starting preconditioner
    if "checks" in stats:
        assert np.all(stats["checks"].values == 0)


def test_signed_hmcecs_takes_the_same_paper_settings(hierarchy):
    """The signed estimator (Sec. 5 of Dang et al.) shares the perturbed one's settings."""
    model, layer = hierarchy
    step = pmbd.HMCECS(model=model, layer=layer, estimator="signed", **pmbd.HMCECS.PAPER_SETTINGS)
    extensions = _extensions(step)
    assert not extensions["census rows"] and not extensions["re-centred coordinates"]
    assert step.estimator == "signed" and step.taylor_space == "parameters"


def test_austerity_gibbs_paper_settings_use_the_papers_level():
    """The paper's per-look level (0.05) instead of our 0.001; its 500-row minibatches; its
    uniform permutation of the rows, also our default (watched failing with
    ``window_gathers`` ignored)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=600)
    with pm.Model() as model:
        on = pm.Bernoulli("on", 0.5)
        pm.Normal("y", on * x, 1.0, observed=x + rng.normal(size=600))
    default = pmbd.AusterityGibbs([on], model=model)
    paper = pmbd.AusterityGibbs([on], model=model, **pmbd.AusterityGibbs.PAPER_SETTINGS)
    assert default.epsilon == 0.001 and paper.epsilon == 0.05
    assert paper.batch_size == 500
    # each update's rows: the paper's permutation (windows only when asked, also by default)
    asked = pmbd.AusterityGibbs([on], model=model, window_gathers=True)
    assert isinstance(asked._permutation, WindowPermutation)
    assert not isinstance(default._permutation, WindowPermutation)
    assert not isinstance(paper._permutation, WindowPermutation)
