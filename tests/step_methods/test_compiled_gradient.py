"""SGHMC's compiled transition loop (step_methods/compiled_gradient.py with
kernels/baoab_compiled.py) through ``pm.sample``: the same draws as the Python loop for the
same seed, with census rows, first-order or no control variates, a dense or diagonal
preconditioner, and held variables; and its settings' errors."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods import sghmc as sghmc_module


def _count_compiled_runs(monkeypatch) -> list[int]:
    """Count the draws' runs of the compiled loop (a one-item list)."""
    runs, kernel = [0], sghmc_module.compiled_baoab_steps

    def counted(*args, **kwargs):
        runs[0] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(sghmc_module, "compiled_baoab_steps", counted)
    return runs


def _draws(model, step, seed: int = 5) -> np.ndarray:
    """One chain of 150 tuning draws (their last estimates measure, in Python) and 150
    draws (every tenth measures), all the free variables' draws stacked."""
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(
            step=step, tune=150, draws=150, chains=1, random_seed=seed, progressbar=False,
            compute_convergence_checks=False, discard_tuned_samples=False,
        )  # fmt: skip
    posterior = idata.warmup_posterior if "warmup_posterior" in idata else idata.posterior
    return np.concatenate([posterior[v].values.reshape(-1) for v in posterior.data_vars])


def _census_influence(layer, monkeypatch) -> None:
    """200 rows stand out: the census takes 100 of them (half of a 200-row minibatch)."""
    influence = np.ones(layer.n_rows)
    influence[:200] = 1e6
    monkeypatch.setattr(
        layer.passes, "influence_chunks", lambda theta, directions: [(0, influence)]
    )


@pytest.mark.parametrize("preconditioner, control_variates", [("dense", "first"), ("diag", False)])
def test_compiled_loop_gives_the_python_loops_draws(
    small_logistic, monkeypatch, preconditioner, control_variates
):
    """Caught: the census rows left out of the compiled minibatch, the anchor's gradient
    not added, ``L`` instead of ``L^T`` on the way back, a minibatch's rows read at another
    draw's position."""
    model, layer = small_logistic
    _census_influence(layer, monkeypatch)
    kwargs = dict(
        model=model, layer=layer, batch_size=200, preconditioner=preconditioner,
        control_variates=control_variates, low_rank=0,  # the compiled maps take no correction
    )  # fmt: skip
    python = pmbd.SGHMC(**kwargs)
    compiled = pmbd.SGHMC(compiled_loop=True, **kwargs)
    assert len(compiled.census) == (100 if control_variates else 0)
    runs = _count_compiled_runs(monkeypatch)
    expected = _draws(model, python)
    assert runs[0] == 0
    got = _draws(model, compiled)
    assert runs[0] >= 300  # every draw (a refined one re-runs)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert np.std(got) > 0.01  # the chains moved


@pytest.mark.parametrize("census", [True, False])
def test_compiled_loop_reads_windows_as_the_python_loop_does(small_logistic, monkeypatch, census):
    """With window gathers the compiled loop reads a draw's minibatches as windows of the
    shuffled copy, the Python loop's rows, and never gathers rows by index; without census
    rows to put in front of them, as slices of the copy itself (no rows copied). Caught: the
    compiled loop gathering a window's row indices from the source (9be68e6: 739 against
    the Python loop's 492 µs per draw at 10^6 rows), a window read at another offset, the
    copy's slices never read without a census (``reads_views`` always False)."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 1)  # 5,000 rows: 25 windows
    model, layer = small_logistic
    if census:
        _census_influence(layer, monkeypatch)
    kwargs = dict(model=model, layer=layer, batch_size=200)
    python = pmbd.SGHMC(**kwargs)
    compiled = pmbd.SGHMC(compiled_loop=True, **kwargs)
    assert compiled.minibatches.windows and len(compiled.census) == (100 if census else 0)
    expected = _draws(model, python)
    gathered, sliced, take, arrays = [], [0], layer.rows.take, layer.rows.window_arrays

    def recorded(rows):
        gathered.append(type(rows).__name__)
        return take(rows)

    def slices_of(window):
        sliced[0] += 1
        return arrays(window)

    monkeypatch.setattr(layer.rows, "take", recorded)
    monkeypatch.setattr(layer.rows, "window_arrays", slices_of)
    got = _draws(model, compiled)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert set(gathered) == {"RowWindow"}
    if census:  # every window's rows copied behind the census rows
        assert len(gathered) >= 4 * 300 and sliced[0] == 0
    else:  # the plain estimates' windows sliced, but where one wraps around the copy's
        # end (one window in 25 here, so about a draw in six: copied)
        assert sliced[0] >= 200 and len(gathered) < 4 * 300


def _arrays_model(n_arrays: int) -> pm.Model:
    """A Gaussian regression on 2,000 rows read from ``n_arrays`` data arrays (the outcome,
    then a covariate and up to two group indices)."""
    rng = np.random.default_rng(n_arrays)
    n = 2_000
    x, g, h = rng.normal(size=n), rng.integers(5, size=n), rng.integers(4, size=n)
    with pm.Model() as model:
        mean = pm.Normal("mu", 0.0, 10.0)
        if n_arrays >= 2:
            mean = mean + pm.Normal("b", 0.0, 1.0) * x
        if n_arrays >= 3:
            mean = mean + pm.Normal("a", 0.0, 1.0, shape=5)[g]
        if n_arrays >= 4:
            mean = mean + pm.Normal("c", 0.0, 1.0, shape=4)[h]
        pm.Normal("y", mean, 1.0, observed=rng.normal(0.3 + 0.5 * x, 1.0))
    return model


@pytest.mark.parametrize("n_arrays", [1, 4])
def test_compiled_loop_slices_windows_of_each_number_of_arrays(monkeypatch, n_arrays):
    """Windows read as slices of the copy's 1 or 4 arrays (2: the test above) give
    the Python loop's draws. Caught: an array's slice swapped for another's or left out."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 1)
    model = _arrays_model(n_arrays)
    layer = pmbd.MinibatchModel(model)
    assert len(layer.rows.columns) == n_arrays
    kwargs = dict(model=model, layer=layer, batch_size=100)
    compiled = pmbd.SGHMC(compiled_loop=True, **kwargs)
    assert compiled.minibatches.windows and len(compiled.census) == 0
    expected = _draws(model, pmbd.SGHMC(**kwargs))
    np.testing.assert_allclose(_draws(model, compiled), expected, rtol=1e-10, atol=1e-12)


def test_compiled_loop_reads_the_held_variables(monkeypatch):
    """A compound step (SGHMC on the coefficients, Gibbs on the inclusion indicators they
    hold): the compiled gradient reads the held values (its jitted function's implicit
    input) as the Python one does, at every draw."""
    from pymc_bigdata.datasets import variable_selection_data, variable_selection_model

    X, y, _ = variable_selection_data(2_000, seed=3)
    model = variable_selection_model(X, y)

    def steps(compiled_loop: bool):
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sghmc = pmbd.SGHMC(
                vars=[model["beta"]], batch_size=200, control_variates="first",
                compiled_loop=compiled_loop,
            )  # fmt: skip
            return [pm.BinaryGibbsMetropolis([model["include"]]), sghmc]

    expected = _draws(model, steps(False))
    compiled, runs = steps(True), _count_compiled_runs(monkeypatch)
    np.testing.assert_allclose(_draws(model, compiled), expected, rtol=1e-10, atol=1e-12)
    assert runs[0] >= 300
    assert len(compiled[1].held_configurations.fits) > 1  # the indicators moved


def test_compiled_loop_settings_errors(small_logistic):
    """Clear errors: a non-boolean, the Eq. 15 integrator (no BAOAB loop), a model not
    compiled by the Numba backend."""
    model, layer = small_logistic
    with pytest.raises(ValueError, match="True or False"):
        pmbd.SGHMC(model=model, layer=layer, compiled_loop="yes")
    with pytest.raises(ValueError, match="integrator='sghmc' has none"):
        pmbd.SGHMC(model=model, layer=layer, integrator="sghmc", compiled_loop=True)
    with pytest.raises(ValueError, match="not compiled by PyTensor's Numba backend"):
        pmbd.SGHMC(model=model, mode="FAST_COMPILE", compiled_loop=True)


def _array_at_the_id_of(freed_id: int, value: float) -> np.ndarray:
    """A new 2 x 3 array of ``value``, at the place of a freed array (``freed_id``) where
    CPython gives one within 10,000 tries (it does once that array is freed)."""
    kept = []  # arrays at other places stay alive, so each try takes a new place
    for _ in range(10_000):
        array = np.empty((2, 3))  # np.full's temporary would take the place first
        array.fill(value)
        if id(array) == freed_id:
            return array
        kept.append(array)
    return array


def test_row_buffers_follow_a_new_census(small_logistic):
    """A census freed and another made at its place: the buffers hold the new census's
    rows (caught: a cache keyed on the census's id alone served the freed census's rows)."""
    from types import SimpleNamespace

    from pymc_bigdata.step_methods.compiled_gradient import CompiledGradient

    _, layer = small_logistic
    compiled = CompiledGradient(layer)
    rows = [np.zeros((4, 3))]
    first = SimpleNamespace(census_rows=[np.full((2, 3), 1.0)])
    compiled._buffers_for(first, rows, 4)
    freed_id = id(first.census_rows[0])
    del first  # freed here, unless the cache holds it
    census = [_array_at_the_id_of(freed_id, 7.0)]
    (buffer,) = compiled._buffers_for(SimpleNamespace(census_rows=census), rows, 4)
    assert buffer.shape == (6, 3)
    np.testing.assert_array_equal(buffer[:2], 7.0)
