"""Models the layer cannot subsample, and invalid sampler settings, fail early and clearly.

Each test asserts the exception type (``ModelNotSupportedError`` -- a ``ValueError`` -- for
models, ``ValueError`` / ``TypeError`` for settings) and that the message names the
offending variable or setting and says what to do.  The models are tiny (N = 200 rows); the
model errors are raised while the layer reads the model, before anything is compiled.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import layer_without_map_search

import pymc_bigdata as pmbd

N_ROWS = 200


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N_ROWS, 3))
    y = x @ np.array([1.0, -1.0, 0.5]) + rng.standard_normal(N_ROWS)
    return x, y


@pytest.fixture(scope="module")
def small(data) -> tuple[pm.Model, pmbd.MinibatchModel]:
    """One valid model and its layer, shared by the sampler-settings tests.

    Passing ``layer=`` to the step constructors reuses its compiled functions and its MAP
    (computed once, by the first test whose setting is validated after the MAP search).
    """
    x, y = data
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal("y", x @ beta, 1.0, observed=y)
    return model, pmbd.MinibatchModel(model)


def _model(build) -> pm.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PyMC's imputation warning
        with pm.Model() as model:
            build()
    return model


# ---------------------------------------------------------------------- unsupported models
def test_error_is_a_value_error():
    """ModelNotSupportedError subclasses ValueError, so `except ValueError` catches it."""
    assert issubclass(pmbd.ModelNotSupportedError, ValueError)


@pytest.mark.parametrize("entry", ["layer", "SGLD", "SGHMC"])
def test_discrete_free_variable(data, entry):
    """A discrete free variable is named, with the advice to marginalise it out.

    The error reaches users through MinibatchModel and the step constructors alike.
    """
    x, y = data

    def build():
        pm.Poisson("k", 3.0)
        pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y)

    model = _model(build)
    constructor = {
        "layer": lambda: pmbd.MinibatchModel(model),
        "SGLD": lambda: pmbd.SGLD(model=model),
        "SGHMC": lambda: pmbd.SGHMC(model=model),
    }[entry]
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"'k' is discrete.*[Mm]arginalise"):
        constructor()


def test_free_variable_with_a_row_dimension(data):
    """A local latent variable (one value per row) is named, with the advice to marginalise."""
    _, y = data
    model = _model(lambda: pm.Normal("y", pm.Normal("z", 0.0, 1.0, shape=N_ROWS), 1.0, observed=y))
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"'z' has a per-row dimension.*marginalise"
    ):
        pmbd.MinibatchModel(model)


def test_observed_variables_with_different_row_counts(data):
    """Observed variables of 200 and 150 rows: both are named with their row counts."""
    x, y = data

    def build():
        pm.Normal("y1", x @ pm.Normal("b", 0.0, 1.0, shape=3), 1.0, observed=y)
        pm.Normal("y2", pm.Normal("c", 0.0, 1.0, shape=(1,)), 1.0, observed=y[:150])

    with pytest.raises(
        pmbd.ModelNotSupportedError,
        match=r"different row counts \{'y1': 200, 'y2': 150\}.*share one leading row axis",
    ):
        pmbd.MinibatchModel(_model(build))


def test_model_without_observed_data():
    """A model with no observed variable: there are no rows; pass data with observed=..."""
    model = _model(lambda: pm.Normal("beta", 0.0, 1.0, shape=3))
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"no observed variables.*observed="):
        pmbd.MinibatchModel(model)


def test_scalar_observed_variable():
    """An observed scalar has no row axis; the variable is named."""
    model = _model(
        lambda: pm.Normal("y", pm.Normal("mu", 0.0, 1.0, shape=(1,)).sum(), 1.0, observed=1.0)
    )
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"'y' is a scalar.*no row axis"):
        pmbd.MinibatchModel(model)


@pytest.mark.parametrize("kind", ["nan", "masked"])
def test_missing_observed_values_imputed_by_pymc(data, kind):
    """NaN or masked observed values (PyMC imputes them as 'y_unobserved') are refused.

    The message names the imputed variable and says to drop those rows.
    """
    x, y = data
    if kind == "nan":
        observed = y.copy()
        observed[[4, 50]] = np.nan
    else:
        observed = np.ma.masked_array(y, mask=np.isin(np.arange(N_ROWS), [4, 50]))
    model = _model(
        lambda: pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=observed)
    )
    assert "y_unobserved" in [rv.name for rv in model.free_RVs]
    with pytest.raises(
        pmbd.ModelNotSupportedError,
        match=r"imputes missing observed values \('y_unobserved'\).*"
        r"Drop those rows",
    ):
        pmbd.MinibatchModel(model)


def test_non_finite_observed_values(data):
    """Infinite observed values (PyMC does not impute them) are refused, naming 'y'."""
    x, y = data
    observed = y.copy()
    observed[7] = np.inf
    model = _model(
        lambda: pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=observed)
    )
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"'y' has missing or non-finite.*Drop those rows"
    ):
        pmbd.MinibatchModel(model)


def test_nan_set_into_observed_pm_data(data):
    """NaN written into an observed pm.Data after the model was built is refused, naming 'y'."""
    x, y = data
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y_data)
    bad = y.copy()
    bad[3] = np.nan
    y_data.set_value(bad)
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"'y' has missing or non-finite.*Drop those rows"
    ):
        pmbd.MinibatchModel(model)


def test_nan_in_covariate_pm_data(data):
    """A NaN in a pm.Data covariate is refused, naming 'X', with the advice to drop or impute.

    (pm.Data refuses NaN at creation, so it is written in afterwards with set_value.)
    """
    x, y = data
    with pm.Model() as model:
        x_data = pm.Data("X", x)
        pm.Normal("y", x_data @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y)
    bad = x.copy()
    bad[11, 2] = np.nan
    x_data.set_value(bad)
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"'X'.*NaN.*Drop or impute"):
        pmbd.SGHMC(model=model)  # at the set-up's first read of the rows


def _nan_covariate_model(data) -> pm.Model:
    x, y = data
    bad = x.copy()
    bad[11, 2] = np.nan
    return _model(
        lambda: pm.Normal("y", bad @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y)
    )


def test_nan_in_covariate_array(data):
    """A NaN in a plain-array covariate is refused with the advice to drop or impute."""
    layer = pmbd.MinibatchModel(_nan_covariate_model(data))
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"NaN.*Drop or impute"):
        layer.map_estimate()  # the row source refuses the rows as the first pass reads them


def test_nan_in_covariate_array_message_identifies_the_array(data):
    """The message identifies a nameless covariate by the observed variable or its shape."""
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"'y'|\(200, 3\)"):
        pmbd.MinibatchModel(_nan_covariate_model(data)).rows.check_finite()


def test_multivariate_likelihood_over_the_row_axis(data):
    """MvNormal observed as one N-vector does not factor over rows: named, with the reason."""
    x, y = data
    model = _model(
        lambda: pm.MvNormal(
            "y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), np.eye(N_ROWS), observed=y
        )
    )
    with pytest.raises(
        pmbd.ModelNotSupportedError,
        match=r"'y' has its row axis inside one multivariate draw \(MvNormal.*"
        r"does not factor over rows.*independent rows",
    ):
        pmbd.MinibatchModel(model)


def test_random_walk_likelihood(data):
    """An observed GaussianRandomWalk (rows depend on each other) is refused, naming 'y'."""
    _, y = data
    model = _model(
        lambda: pm.GaussianRandomWalk(
            "y",
            mu=0.0,
            sigma=pm.HalfNormal("s", 1.0, shape=()),
            init_dist=pm.Normal.dist(0.0, 1.0),
            observed=y,
        )
    )
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"'y' .*does not factor over rows.*independent rows"
    ):
        pmbd.MinibatchModel(model)


def test_potential_on_row_data(data):
    """A Potential over the likelihood's row data is refused, naming it: write it as observed."""
    x, y = data
    with pm.Model() as model:
        x_data = pm.Data("X", x)
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Potential("penalty", -((x_data @ beta) ** 2).sum())
        pm.Normal("y", x_data @ beta, 1.0, observed=y)
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"'penalty' depends on row data.*observed variable"
    ):
        pmbd.MinibatchModel(model)


def test_vars_must_be_all_free_variables(data):
    """Sampling a subset of the free variables is refused, naming the ones left out."""
    x, y = data

    def build():
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 1.0, shape=())
        pm.Normal("y", x @ beta, sigma, observed=y)

    model = _model(build)
    with pytest.raises(
        pmbd.ModelNotSupportedError, match=r"\['sigma'\] are not in the step's vars.*all"
    ):
        pmbd.MinibatchModel(model, vars=[model["beta"]])


# ---------------------------------------------------------------------- batch size
STEPS = {"SGLD": pmbd.SGLD, "SGHMC": pmbd.SGHMC}
#: steps with settings of their own checked here (not in the loops over STEPS)
OWN_SETTINGS_STEPS = {**STEPS, "SBPS": pmbd.SBPS}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("batch_size", [0, N_ROWS + 1])
def test_batch_size_out_of_range(small, step, batch_size):
    """batch_size 0 or N + 1: ValueError naming batch_size, the valid range and N."""
    model, layer = small
    with pytest.raises(
        ValueError, match=rf"batch_size must be between 1 and .*N = 200, got {batch_size}\."
    ):
        STEPS[step](model=model, layer=layer, batch_size=batch_size)


@pytest.mark.parametrize("step", list(STEPS))
def test_batch_size_out_of_range_without_layer(data, step):
    """The same error when the step builds its own layer from the model (the usual call)."""
    x, y = data

    def build():
        pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y)

    with pytest.raises(ValueError, match=r"batch_size must be between 1 and .*N = 200, got 0"):
        STEPS[step](model=_model(build), batch_size=0)


@pytest.mark.parametrize("step", list(STEPS))
def test_batch_size_not_an_integer(small, step):
    """A float batch_size is a TypeError, not silently truncated."""
    model, layer = small
    with pytest.raises(TypeError, match=r"batch_size must be an integer, got 50\.5"):
        STEPS[step](model=model, layer=layer, batch_size=50.5)


# ---------------------------------------------------------------------- hyper-parameters
@pytest.mark.parametrize(
    ("step", "kwargs", "match"),
    [
        ("SGHMC", {"friction": 0}, r"friction must be a positive finite number, got 0"),
        ("SGHMC", {"friction": float("inf")}, r"friction must be a positive finite .*got inf"),
        ("SGHMC", {"integrator": "x"}, r"integrator must be 'baoab' or 'sghmc', got 'x'"),
        (
            "SGHMC",
            {"noise_estimate": "x"},
            r"noise_estimate must be 'zero', 'running' or 'fisher', got 'x'",
        ),
        ("SGHMC", {"learning_rate": -0.1}, r"learning_rate must be a positive finite number"),
        (
            "SGHMC",
            {"learning_rate": 0.01, "step_size": 0.1},
            r"either step_size or learning_rate, not both",
        ),
        ("SGHMC", {"preconditioner": "x"}, r"preconditioner must be 'auto', 'dense', 'diag' or "),
        ("SGLD", {"preconditioner": "x"}, r"preconditioner must be .*'identity', got 'x'"),
        ("SGHMC", {"noise_shift_bound": 0}, r"noise_shift_bound must be a positive finite"),
        ("SGLD", {"adapt": "yes"}, r"adapt must be True, False or 'step_size', got 'yes'"),
        ("SGLD", {"noise_shift_bound": "1"}, r"noise_shift_bound must be a positive .*got '1'"),
        ("SBPS", {"slope_prior": "x"}, r"slope_prior must be one of \('em', 'paper'\)"),
        ("SBPS", {"metric_update": "x"}, r"metric_update must be one of \('bounce', "),
        ("SBPS", {"check_after": 0}, r"check_after must be a positive finite number, got 0"),
    ],
)
def test_invalid_setting_checked_before_the_map_search(small, step, kwargs, match):
    """Settings the constructor checks before the MAP search: ValueError naming the setting."""
    model, layer = small
    with pytest.raises(ValueError, match=match):
        OWN_SETTINGS_STEPS[step](model=model, layer=layer, batch_size=50, **kwargs)


@pytest.mark.parametrize(
    ("step", "kwargs", "match"),
    [
        ("SGHMC", {"step_size": -1}, r"step_size must be a positive finite number, got -1"),
        ("SGHMC", {"step_size": float("nan")}, r"step_size must be a positive .*got nan"),
        ("SGLD", {"step_size": 0.0}, r"step_size must be a positive finite number, got 0\.0"),
        ("SGLD", {"inner_steps": 0}, r"inner_steps must be a positive integer, got 0"),
        ("SGLD", {"inner_steps": 2.5}, r"inner_steps must be a positive integer, got 2\.5"),
        ("SGHMC", {"inner_steps": -3}, r"inner_steps must be a positive integer, got -3"),
    ],
)
def test_invalid_step_size_or_inner_steps(small, step, kwargs, match):
    """Invalid step_size / inner_steps: ValueError naming the setting and the valid values.

    (The constructor checks these after the MAP search; the shared layer computes it once.)
    """
    model, layer = small
    with pytest.raises(ValueError, match=match):
        STEPS[step](model=model, layer=layer, batch_size=50, **kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"step_size": -1.0}, {"inner_steps": 0}], ids=["step_size", "inner_steps"]
)
def test_invalid_settings_rejected_before_the_map_search(data, kwargs):
    """An invalid step_size or inner_steps fails before any MAP search (fail fast)."""
    x, y = data

    def build():
        pm.Normal("y", x @ pm.Normal("beta", 0.0, 1.0, shape=3), 1.0, observed=y)

    layer = layer_without_map_search(_model(build))
    with pytest.raises(ValueError, match="must be a positive"):
        pmbd.SGLD(model=layer.model, layer=layer, batch_size=50, **kwargs)


def test_likelihood_using_data_across_rows_is_refused():
    """A covariate centred inside the model (x - mean(x)) makes each row's term depend on
    the other rows: the factorisation check refuses it before any sampling."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=200)
    y = 2.0 * (x - x.mean()) + rng.normal(size=200)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0)
        x_data = pm.Data("x", x)
        pm.Normal("y", b * (x_data - x_data.mean()), 1.0, observed=y)
    layer = pmbd.MinibatchModel(model)
    with pytest.raises(pmbd.ModelNotSupportedError, match="does not factor over rows.*before"):
        layer.map_estimate()
