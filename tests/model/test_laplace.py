"""The MAP search (``pymc_bigdata/model/laplace.py``): its full-data passes.

Its accuracy is checked where the layer is (``tests/test_layer.py``) and on the hard targets.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
import zarr

import pymc_bigdata as pmbd

N_ROWS, N_COEFS, CHUNK_ROWS, STORE_CHUNK = 20_000, 5, 1_024, 4_096


def _logistic_layer(path, gather: str) -> pmbd.MinibatchModel:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N_ROWS, N_COEFS)).astype(np.float32)
    y = (rng.random(N_ROWS) < 1 / (1 + np.exp(-X @ np.linspace(-1, 1, N_COEFS)))).astype(np.int8)
    for name, array in (("X", X), ("y", y)):
        store = zarr.create_array(
            str(path / f"{name}.zarr"),
            shape=array.shape,
            chunks=(STORE_CHUNK, *array.shape[1:]),
            dtype=array.dtype,
            overwrite=True,
        )
        store[:] = array
    with pm.Model() as model:
        X_data = pmbd.Data("X", path / "X.zarr", gather=gather)
        y_data = pmbd.Data("y", path / "y.zarr", gather=gather)
        beta = pm.Normal("beta", 0.0, 1.0, shape=N_COEFS)
        pm.Bernoulli("obs", logit_p=X_data @ beta, observed=y_data)
    return pmbd.MinibatchModel(model, chunk_rows=CHUNK_ROWS)


def test_the_exact_newton_search_takes_few_passes(tmp_path):
    """From the subsample's optimum, Newton with the exact full-data Hessian (value, gradient
    and Hessian read in one pass) reaches the mode in at most 3 passes, whatever the gather,
    its last step taken without a pass where it is predicted to land within
    ``FINAL_STEP_DECREMENT``. The decrement measured at the result (one more pass, here) is
    below 1e-8, and the full-data sums the anchor takes are those at ``sums_point``.
    Caught: the fixed-Hessian search (``newton_then_exact`` returning None): 8 and 5 passes;
    every step checked by a pass (``FINAL_STEP_DECREMENT = 0``): 4 passes with block
    gathers; the anchor at the stepped point with the sums read before the step."""
    for gather in ("blocks", "rows"):
        layer = _logistic_layer(tmp_path, gather)
        streamed = layer.rows.rows_streamed
        result = layer.map_estimate()
        assert result.n_evaluations <= 3, (gather, result.n_evaluations)
        assert (layer.rows.rows_streamed - streamed) / N_ROWS <= 3
        assert result.newton_decrement < 1e-8
        _, grad = layer.full_logp_grad(result.theta)
        assert float(grad @ np.linalg.solve(result.hessian, grad)) < 1e-8
        anchor = layer.map_anchor()
        loglik, loglik_grad = layer.full_loglik_grad(anchor.theta)
        np.testing.assert_allclose(anchor.loglik_grad, loglik_grad, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(anchor.loglik, loglik, rtol=1e-12)
        np.testing.assert_array_equal(result.hessian_point, anchor.theta)


def test_block_gathers_larger_than_a_chunk_keep_the_search_short(tmp_path, monkeypatch):
    """The fixed-Hessian search (where exact Newton fails, e.g. a step that lowers the log
    posterior; forced here). With a block gather the search's subsample is whole storage
    blocks (here one block of 4,096 rows where 1,024 were asked for). Its Hessian must be
    scaled by the rows it has: scaled by the rows asked for, it was 4 times too large,
    Newton's steps a quarter of Newton's, and the search took 40 full-data passes instead
    of 5 (issue 27: a 1e7-row zarr store with 500,000-row chunks did not finish its set-up).
    The mode is the same."""
    import pymc_bigdata.model.laplace as laplace

    monkeypatch.setattr(laplace, "newton_then_exact", lambda passes, theta, rows: (None, 0, theta))
    blocks = _logistic_layer(tmp_path, "blocks")
    result = blocks.map_estimate()
    rows = _logistic_layer(tmp_path, "rows").map_estimate()
    assert result.n_evaluations <= 12  # 8 here; 53 with the Hessian scaled by 1,024 rows
    assert np.allclose(result.theta, rows.theta, atol=1e-6)
    assert result.newton_decrement < 1e-8


def test_exact_newton_takes_over_where_the_posterior_becomes_concave(monkeypatch):
    """A non-centred hierarchy (17,798 rows, 8,192-row subsample): at the subsample's
    optimum the full-data posterior is not concave, so exact Newton fails there; after a
    few steps with the subsample's Hessian it is, and exact Newton finishes the search. 18
    passes to a decrement of 1e-14, where the fixed-Hessian search alone crept on for 124
    passes to 5e-6. Caught: ``HANDOVER_ROUNDS = 0`` (the fixed-Hessian search alone)."""
    from hard_models import hier_logistic

    import pymc_bigdata.model.newton as newton

    attempts = []
    exact = newton._exact_newton

    def watched(passes, theta):
        result, n_eval = exact(passes, theta)
        attempts.append(result is not None)
        return result, n_eval

    monkeypatch.setattr(newton, "_exact_newton", watched)
    layer = pmbd.MinibatchModel(hier_logistic(centred=False), chunk_rows=8_192)
    streamed = layer.rows.rows_streamed
    result = layer.map_estimate()
    assert attempts[0] is False and attempts[-1] is True
    assert result.n_evaluations <= 25
    assert (layer.rows.rows_streamed - streamed) / layer.n_rows <= 26
    assert result.newton_decrement < 1e-10


def _in_memory_logistic_layer(n_rows: int = 200_000) -> pmbd.MinibatchModel:
    """``n_rows`` rows in memory, a subsample of 8,192 (chunk_rows)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((n_rows, N_COEFS))
    y = (rng.random(n_rows) < 1 / (1 + np.exp(-X @ np.linspace(-1, 1, N_COEFS)))).astype(np.int8)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=N_COEFS)
        pm.Bernoulli("obs", logit_p=pm.Data("X", X) @ beta, observed=pm.Data("y", y))
    return pmbd.MinibatchModel(model, chunk_rows=8_192)


def _hessian_passes(monkeypatch) -> list[int]:
    """Counts the passes that read the Hessian (a list holding one count)."""
    from pymc_bigdata.model.passes import FullDataPasses

    count = [0]
    read = FullDataPasses.full_loglik_grad_hessian

    def counted(self, theta):
        count[0] += 1
        return read(self, theta)

    monkeypatch.setattr(FullDataPasses, "full_loglik_grad_hessian", counted)
    return count


@pytest.mark.parametrize("n_rows, n_passes", [(200_000, 2), (100_000, 3)])
def test_the_search_reads_one_hessian_in_memory(monkeypatch, n_rows: int, n_passes: int):
    """Rows in memory, 24 and 12 times the subsample's: the first Newton step takes the
    subsample's Hessian from a pass that reads no Hessian, the second pass reads the
    Hessian (the Laplace precision), later passes step with it reading the gradient alone.
    200,000 rows: 2 passes, the last step taken where the gradient's change along the
    first forecasts it lands within ``FINAL_STEP_DECREMENT``; 100,000: that forecast is
    above it (1e-7), so a third pass, without the Hessian. Either way one Hessian, and the
    exact search's mode (within 1e-4 posterior sds, where the last step is taken) with the
    exact Hessian at ``hessian_point``. Caught: ``INEXACT_FIRST_STEP_RATIO`` so large that
    the gate never opens (2 or 3 Hessian passes); the subsample's Hessian kept as the
    Laplace precision (the precision check); :func:`predicted_decrement` after the inexact
    step (200,000 rows: 3 passes); a third pass that reads the Hessian."""
    import pymc_bigdata.model.laplace as laplace
    import pymc_bigdata.model.newton as newton

    hessians = _hessian_passes(monkeypatch)
    layer = _in_memory_logistic_layer(n_rows)
    result = layer.find_map(None)
    assert (hessians[0], result.n_evaluations) == (1, n_passes)
    exact_hessian = layer.passes.full_loglik_hessian(result.hessian_point)
    precision = laplace.posterior_precision(
        laplace.symmetrised(exact_hessian), layer.compiled.prior_hessian(result.hessian_point)
    )
    np.testing.assert_allclose(result.hessian, precision, rtol=1e-10)
    monkeypatch.setattr(newton, "INEXACT_FIRST_STEP_RATIO", np.inf)
    exact = layer.find_map(None)
    assert hessians[0] > 2  # the exact search reads one per pass
    sd = np.sqrt(np.diag(np.linalg.inv(exact.hessian)))
    assert np.max(np.abs(result.theta - exact.theta) / sd) < 1e-4


def test_a_poor_first_step_starts_the_exact_search_again(monkeypatch):
    """Where the step with the subsample's Hessian lowers the log posterior (forced: that
    Hessian divided by 100, a step 100 times too long), the search starts again from the
    subsample's optimum with an exact step and ends at the same mode. Caught: a search that
    gives up there (the fixed-Hessian search instead: more passes than the bound)."""
    import pymc_bigdata.model.newton as newton

    subsample_precision = newton.subsample_precision
    monkeypatch.setattr(
        newton, "subsample_precision", lambda *args: subsample_precision(*args) / 100.0
    )
    layer = _in_memory_logistic_layer()
    result = layer.find_map(None)
    assert result.n_evaluations <= 4  # 2 for the failed start, 2 exact ones
    assert result.newton_decrement < 1e-8
    _, grad = layer.full_logp_grad(result.theta)
    assert float(grad @ np.linalg.solve(result.hessian, grad)) < 1e-8
