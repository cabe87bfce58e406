"""Tests of :mod:`pymc_bigdata.model.layer_cache`: a step built without ``layer=`` takes the
layer an earlier step built on the same model, variables and mode while the model's variables
and data are unchanged, and draws what a fresh layer draws."""

import numpy as np
import pymc as pm
import pytest
from pytensor.compile.mode import get_default_mode

import pymc_bigdata as pmbd
from pymc_bigdata.loo_terms import model_and_layer
from pymc_bigdata.model import layer_cache


def _regression(n_rows: int = 400, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n_rows)
    y = 1.0 + 2.0 * x + rng.normal(size=n_rows)
    with pm.Model() as model:
        x_data, y_data = pm.Data("x", x), pm.Data("y_obs", y)
        b = pm.Normal("b", 0.0, 5.0, shape=2)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", b[0] + b[1] * x_data, sigma, observed=y_data, shape=x_data.shape)
    return model


@pytest.fixture(autouse=True)
def _empty_cache():
    pmbd.clear_layer_cache()
    yield
    pmbd.clear_layer_cache()


def _draws(model: pm.Model, step) -> np.ndarray:
    with model:
        idata = pm.sample(
            step=step, tune=60, draws=60, chains=1, random_seed=4, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    return np.concatenate([idata.posterior[v].values.ravel() for v in ("b", "sigma")])


def test_a_second_step_takes_the_first_steps_layer_and_draws_the_same():
    model = _regression()
    first = pmbd.SGHMC(model=model)
    drawn_first = _draws(model, first)
    again = pmbd.SGHMC(model=model)
    other = pmbd.SGLD(model=model)
    assert again.layer is first.layer and other.layer is first.layer
    fresh = pmbd.SGHMC(model=model, layer=pmbd.MinibatchModel(model))
    assert fresh.layer is not first.layer
    np.testing.assert_array_equal(_draws(model, again), drawn_first)
    np.testing.assert_array_equal(_draws(model, fresh), drawn_first)


def test_score_check_reads_the_steps_layer():
    model = _regression()
    step = pmbd.SGHMC(model=model)
    assert model_and_layer(model, None)[1] is step.layer


def test_new_data_get_a_new_layer():
    model = _regression()
    first = pmbd.SGHMC(model=model)
    with model:
        x_new = np.linspace(-1.0, 1.0, 300)
        pm.set_data({"x": x_new, "y_obs": x_new + np.random.default_rng(1).normal(size=300)})
    second = pmbd.SGHMC(model=model)
    assert second.layer is not first.layer
    assert second.layer.n_rows == 300
    with pytest.raises(pmbd.StaleDataError):  # the first step's layer stays refused
        pmbd.SGHMC(model=model, layer=first.layer)


def test_a_variable_added_to_the_model_gets_a_new_layer():
    model = _regression()
    first = pmbd.SGHMC(model=model)
    with model:
        pm.Normal("extra", 0.0, 1.0)
    second = pmbd.SGHMC(model=model)
    assert second.layer is not first.layer
    assert second.layer.dim == first.layer.dim + 1


def test_other_variables_or_another_mode_get_their_own_layer():
    model = _regression()
    whole = layer_cache.cached_layer(model, None, None)
    listed = layer_cache.cached_layer(model, model.value_vars, None)
    assert listed is not whole  # vars given: the layer checks them, so it is its own
    assert layer_cache.cached_layer(model, model.value_vars[::-1], None) is listed  # a set
    mode = get_default_mode()  # a Mode object: matched by identity
    with_mode = layer_cache.cached_layer(model, None, mode)
    assert with_mode is not whole and with_mode.mode is mode
    assert layer_cache.cached_layer(model, None, mode) is with_mode


def test_only_the_last_models_layers_are_kept():
    models = [_regression(seed=s) for s in range(layer_cache.LAYER_CACHE_MODELS + 1)]
    layers = [layer_cache.cached_layer(m, None, None) for m in models]
    assert layer_cache.cached_layer(models[-1], None, None) is layers[-1]
    assert layer_cache.cached_layer(models[0], None, None) is not layers[0]  # dropped
    pmbd.clear_layer_cache()
    assert layer_cache.cached_layer(models[-1], None, None) is not layers[-1]
