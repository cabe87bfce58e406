"""pmbd.Data: big row arrays declared once in a PyMC model, read through the row source."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pymc as pm
import pytest
import zarr

import pymc_bigdata as pmbd
from pymc_bigdata.errors import ModelNotSupportedError

N_ROWS, N_COEFS = 4000, 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A logistic regression's rows in memory, in .npy files and in zarr stores."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((N_ROWS, N_COEFS))
    y = (rng.random(N_ROWS) < 1 / (1 + np.exp(-X @ np.array([0.5, -1.0, 0.25])))).astype(np.int8)
    path = tmp_path_factory.mktemp("data")
    np.save(path / "X.npy", X)
    np.save(path / "y.npy", y)
    for name, array in (("X", X), ("y", y)):
        store = zarr.create_array(
            str(path / f"{name}.zarr"),
            shape=array.shape,
            chunks=(512, *array.shape[1:]),
            dtype=array.dtype,
        )
        store[:] = array
    return X, y, path


def logistic(X, y, **data_kwargs) -> pm.Model:
    with pm.Model() as model:
        X_data = pmbd.Data("X", X, **data_kwargs)
        y_data = pmbd.Data("y", y, **data_kwargs)
        beta = pm.Normal("beta", 0.0, 1.0, shape=N_COEFS)
        pm.Bernoulli("obs", logit_p=X_data @ beta, observed=y_data)
    return model


def sghmc_draws(model) -> tuple[np.ndarray, object]:
    with model:
        idata = pm.sample(
            step=pmbd.SGHMC(),
            tune=100,
            draws=100,
            chains=1,
            random_seed=17,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return idata.posterior["beta"].values, idata


def test_sbps_refuses_block_gathers_and_takes_uniform_rows(data):
    """SBPS needs independent minibatches: a zarr store read by block gathers (the default)
    is refused with a clear message before the MAP search; with ``gather="rows"`` the same
    store is accepted."""
    X, y, path = data
    blocked = logistic(str(path / "X.zarr"), str(path / "y.zarr"))
    with pytest.raises(ValueError, match=r"SBPS needs independent minibatches .*gather=\"rows\""):
        pmbd.SBPS(model=blocked)
    rows = logistic(str(path / "X.zarr"), str(path / "y.zarr"), gather="rows")
    assert pmbd.SBPS(model=rows).layer.rows.gather == "rows"


def test_same_seed_same_draws_from_memory_npy_and_zarr(data):
    """With row-uniform gathers the draws are identical whatever holds the rows, and the
    result holds no copy of the data (zero-row stand-ins). A zarr store's default block
    gather draws other rows, so other (still finite, nearby) draws. (In-memory rows read
    through windows where the pool holds 100 minibatches, not these 4,000 rows:
    ``tests/test_row_windows.py``.)"""
    X, y, path = data
    in_memory, idata = sghmc_draws(logistic(X, y, gather="rows"))
    from_npy, _ = sghmc_draws(logistic(path / "X.npy", str(path / "y.npy")))
    from_zarr, _ = sghmc_draws(logistic(path / "X.zarr", path / "y.zarr", gather="rows"))
    np.testing.assert_array_equal(from_npy, in_memory)
    np.testing.assert_array_equal(from_zarr, in_memory)
    assert idata.constant_data["X"].shape == (0, N_COEFS)
    assert idata.observed_data["obs"].shape == (0,)
    blocks, _ = sghmc_draws(logistic(path / "X.zarr", path / "y.zarr"))
    assert np.isfinite(blocks).all() and not np.array_equal(blocks, in_memory)
    assert np.abs(blocks.mean(axis=(0, 1)) - in_memory.mean(axis=(0, 1))).max() < 0.1


def test_large_blocks_get_fewer_active_blocks(data, monkeypatch):
    """By default a block gather holds 16 blocks, or as many (at least 2) as fit in
    rows.ACTIVE_BYTES of decoded rows of every array; an explicit active_blocks stands."""
    X, y, path = data
    model = logistic(path / "X.zarr", path / "y.zarr")
    assert pmbd.MinibatchModel(model).rows.active_blocks == 16
    block_bytes = 512 * (N_COEFS * 8 + 1)  # 512-row chunks of X (float64) and y (int8)
    monkeypatch.setattr(pmbd.rows, "ACTIVE_BYTES", 3 * block_bytes + 100)
    layer = pmbd.MinibatchModel(model)
    assert layer.rows.active_blocks == 3
    sampler = layer.rows.index_sampler(100, np.random.default_rng(0))
    assert sampler.active_blocks == 3
    assert all(c.cache.capacity >= 4 for c in layer.rows.columns)  # the 3 and the next
    monkeypatch.setattr(pmbd.rows, "ACTIVE_BYTES", 1)
    assert pmbd.MinibatchModel(model).rows.active_blocks == 2
    explicit = logistic(path / "X.zarr", path / "y.zarr", active_blocks=5)
    assert pmbd.MinibatchModel(explicit).rows.active_blocks == 5


def test_layer_reads_the_stored_rows(data):
    """N, the rows and the full-data log-likelihood come from the store, not the stand-in."""
    X, y, path = data
    layer = pmbd.MinibatchModel(logistic(path / "X.zarr", path / "y.zarr"))
    assert layer.n_rows == N_ROWS
    assert layer.rows.gather == "blocks"
    got_y, got_X = layer.take_rows(np.array([7, 3999, 0]))  # observed first
    np.testing.assert_array_equal(got_X, X[[7, 3999, 0]])
    np.testing.assert_array_equal(got_y, y[[7, 3999, 0]])
    beta = np.array([0.3, -0.2, 0.1])
    eta = X @ beta
    exact = np.sum(y * eta - np.logaddexp(0, eta))
    assert layer.full_loglik_grad(beta)[0] == pytest.approx(exact, rel=1e-12)


def test_row_deterministics_are_refused(data):
    """A Deterministic over the rows would be evaluated on all N rows at every draw."""
    X, y, _ = data
    for wrap in (pm.Data, pmbd.Data):
        with pm.Model() as model:
            X_data = wrap("X", X)
            beta = pm.Normal("beta", 0.0, 1.0, shape=N_COEFS)
            pm.Deterministic("scale", 2 * beta)  # not over rows: fine
            eta = pm.Deterministic("eta", X_data @ beta)
            pm.Bernoulli("obs", logit_p=eta, observed=y)
        with pytest.raises(ModelNotSupportedError, match="Deterministic 'eta'.*'X'.*N = 4000"):
            pmbd.MinibatchModel(model)


def test_bad_data_gets_a_clear_error_naming_the_array(data, tmp_path):
    X, y, path = data
    with pytest.raises(ValueError, match="different row counts.*'y': 3999, 'X': 4000"):
        pmbd.MinibatchModel(logistic(X, y[:-1]))
    bad = X.copy()
    bad[1234, 1] = np.nan
    store = zarr.create_array(
        str(tmp_path / "bad.zarr"), shape=bad.shape, chunks=(512, 3), dtype=bad.dtype
    )
    store[:] = bad
    with pytest.raises(ModelNotSupportedError, match=r"\['X'\].*NaN"):
        pmbd.MinibatchModel(logistic(tmp_path / "bad.zarr", y)).map_estimate()
    with pytest.raises(FileNotFoundError, match="'X'"):
        logistic(tmp_path / "missing.zarr", y)
    for kwargs, argument in (
        ({"gather": "random"}, "gather"),
        ({"block_rows": 0}, "block_rows"),
        ({"active_blocks": 0}, "active_blocks"),
        ({"reuse": -1.0}, "reuse"),
    ):
        with pytest.raises(ValueError, match=f"'X'.*{argument}"):
            logistic(X, y, **kwargs)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        ) as local,
        distributed.Client(local) as client,
    ):
        yield client


def test_dask_passes_on_a_cluster_equal_in_memory_ones(data, cluster):
    """On dask arrays the full-data passes run as dask reductions on the cluster's workers
    (each compiles the chunk functions once): the MAP, the Laplace precision and the
    control-variate sums at the MAP equal the in-memory ones to rounding."""
    X, y, _ = data
    here = pmbd.MinibatchModel(logistic(X, y))
    there = pmbd.MinibatchModel(
        logistic(da.from_array(X, chunks=(1000, N_COEFS)), da.from_array(y, chunks=1000))
    )
    fit_here, fit_there = here.map_estimate(), there.map_estimate()
    np.testing.assert_allclose(fit_there.theta, fit_here.theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fit_there.hessian, fit_here.hessian, rtol=1e-10)
    anchor_here, anchor_there = here.map_anchor(), there.map_anchor()
    assert anchor_there.loglik == pytest.approx(anchor_here.loglik, rel=1e-12)
    np.testing.assert_allclose(anchor_there.loglik_grad, anchor_here.loglik_grad, atol=1e-8)
    compiled = cluster.run(lambda: len(__import__("pymc_bigdata").model.compiled._WORKER_FUNCTIONS))
    assert len(compiled) == 2 and all(n >= 1 for n in compiled.values())
