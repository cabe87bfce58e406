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
        control_variates=control_variates,
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


def test_compiled_loop_reads_windows_as_the_python_loop_does(small_logistic, monkeypatch):
    """With window gathers the compiled loop reads a draw's minibatches as windows of the
    shuffled copy, the Python loop's rows, and never gathers rows by index. Caught: the
    compiled loop gathering a window's row indices from the source (9be68e6: 739 against
    the Python loop's 492 µs per draw at 10^6 rows), a window read at another offset."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 1)  # 5,000 rows: 25 windows
    model, layer = small_logistic
    _census_influence(layer, monkeypatch)
    kwargs = dict(model=model, layer=layer, batch_size=200)
    python = pmbd.SGHMC(**kwargs)
    compiled = pmbd.SGHMC(compiled_loop=True, **kwargs)
    assert compiled.minibatches.windows and len(compiled.census) == 100
    expected = _draws(model, python)
    gathered, take = [], layer.rows.take

    def recorded(rows):
        gathered.append(type(rows).__name__)
        return take(rows)

    monkeypatch.setattr(layer.rows, "take", recorded)
    got = _draws(model, compiled)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert set(gathered) == {"RowWindow"} and len(gathered) >= 4 * 300


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
