"""sample_dask: pm.sample's chains as tasks on a real Dask LocalCluster (two worker processes).

The first test pays the cold compile on each worker process (PyTensor's on-disk cache makes
it fast for the later ones and for later sessions).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import dask_client
import numpy as np
import pymc as pm
import pymc.sampling.mcmc as mcmc
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata import distributed_chains
from pymc_bigdata.distributed import ChainFailedError, sample_dask

distributed = pytest.importorskip("distributed")

#: sample statistics that are wall-clock timings (NUTS's), equal in shape only
TIMING_STATS = ("perf_counter_start", "perf_counter_diff", "process_time_diff")
ORIGINAL_SAMPLE_MANY = mcmc._sample_many


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    )
    client = distributed.Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def two_workers(client):
    """The cluster with both workers up (a test may have killed one; its nanny restarts it)."""
    client.wait_for_workers(2, timeout=120)
    return client


@pytest.fixture(scope="module")
def model():
    """2,000-row, 3-coefficient logistic regression, with a Deterministic."""
    return dask_client.build_model()


@pytest.fixture(scope="module")
def sghmc(model):
    with model:
        return pmbd.SGHMC()


SAMPLE = {"draws": 100, "tune": 100, "chains": 2, "random_seed": 20260612}


@pytest.fixture(scope="module")
def sghmc_runs(client, model, sghmc):
    """(pm.sample with cores=1, sample_dask) with the same seed and step."""
    client.wait_for_workers(2, timeout=120)
    with model:
        local = pm.sample(**SAMPLE, cores=1, step=sghmc, progressbar=False)
    t0 = time.perf_counter()
    remote = sample_dask(client, **SAMPLE, step=sghmc, model=model)
    print(f"sample_dask, cold workers: {time.perf_counter() - t0:.1f} s")
    return local, remote


def assert_same_draws(local, remote) -> None:
    """Every group of ``local`` is in ``remote`` with the same variables and equal values."""
    assert set(remote.children) == set(local.children)
    for group in local.children:
        a, b = local[group].to_dataset(), remote[group].to_dataset()
        assert set(a.data_vars) == set(b.data_vars), group
        assert dict(a.sizes) == dict(b.sizes), group
        for name in a.data_vars:
            if name in TIMING_STATS:
                continue
            np.testing.assert_array_equal(b[name].values, a[name].values, err_msg=name)


def test_sghmc_equals_pm_sample_cores_1(sghmc_runs):
    """Same seed, same step: the same draws and sample statistics as pm.sample(cores=1)."""
    local, remote = sghmc_runs
    assert_same_draws(local, remote)
    # not trivially equal: the chains differ from each other and moved
    beta = remote.posterior["beta"].values
    assert not np.array_equal(beta[0], beta[1])
    assert np.all(np.ptp(beta, axis=1) > 0)
    assert remote.posterior.sizes["draw"] == 100
    np.testing.assert_array_equal(remote.posterior["chain"].values, [0, 1])


def test_groups_and_variables_as_pm_sample(sghmc_runs):
    """The DataTree has pm.sample's groups, variables, coordinates and sampler attributes."""
    local, remote = sghmc_runs
    assert {"posterior", "sample_stats", "observed_data"} <= set(remote.children)
    assert list(remote.children) == list(local.children)
    for group in local.children:
        assert list(remote[group].data_vars) == list(local[group].data_vars)
        for coord in local[group].coords:
            np.testing.assert_array_equal(remote[group][coord].values, local[group][coord].values)
    assert set(remote.sample_stats.data_vars) >= {"step_size", "rows_touched", "diverging"}
    assert remote.posterior.attrs["tuning_steps"] == 100
    assert remote.posterior.attrs["inference_library"] == "pymc"


def test_sgld_through_default_client(two_workers, model):
    """client=None uses the current client; SGLD too equals pm.sample(cores=1)."""
    with model:
        step = pmbd.SGLD()
        local = pm.sample(**SAMPLE, cores=1, step=step, progressbar=False)
    with two_workers.as_current():
        remote = sample_dask(None, **SAMPLE, step=step, model=model)
    assert_same_draws(local, remote)


def test_pymc_nuts_equals_pm_sample_cores_1(two_workers, model):
    """PyMC's own NUTS (jitter+adapt_diag initialisation on the caller) is equal too."""
    kwargs = {**SAMPLE, "draws": 50, "tune": 50}
    with model:
        local = pm.sample(**kwargs, cores=1, progressbar=False, nuts_sampler="pymc")
    remote = sample_dask(two_workers, **kwargs, model=model)
    assert_same_draws(local, remote)
    assert "tree_depth" in remote.sample_stats


class BrokenSGLD(pmbd.SGLD):
    """An SGLD whose chains raise after five draws."""

    def astep(self, q0):
        self._broken_draws = getattr(self, "_broken_draws", 0) + 1
        if self._broken_draws > 5:
            raise FloatingPointError("the gradient blew up in this chain")
        return super().astep(q0)


# the workers cannot import this test module: ship BrokenSGLD's code with the step
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_failing_chain_raises_chain_failed_error(two_workers, model, sghmc):
    with model:
        step = BrokenSGLD(layer=sghmc.layer)
    with pytest.raises(ChainFailedError, match=r"Chain [01] failed .*FloatingPointError") as info:
        sample_dask(two_workers, **SAMPLE, step=step, model=model)
    assert info.value.chain in (0, 1)
    assert isinstance(info.value.__cause__, FloatingPointError)
    assert mcmc._sample_many is ORIGINAL_SAMPLE_MANY  # pm.sample is left as it was


def _executing_chains(dask_worker) -> list[str]:
    return [str(ts.key) for ts in dask_worker.state.executing]


def _kill_workers_mid_chain(
    client, killed: list[str], *, how_many: int = 1, ready=lambda: True
) -> threading.Thread:
    """A thread that kills ``how_many`` worker processes once every worker runs a chain
    (and ``ready()``), recording their addresses in ``killed``."""

    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                running = client.run(_executing_chains)
                busy = [w for w, keys in running.items() if any("chain" in k for k in keys)]
                if len(busy) == 2 and ready():
                    time.sleep(0.5)  # well into the chains
                    for worker in sorted(busy)[:how_many]:
                        killed.append(worker)
                        with contextlib.suppress(Exception):
                            client.run(os._exit, 1, workers=[worker])
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


#: four chains of a few seconds each on two workers: one is killed while both run a chain
KILLED = dask_client.SAMPLE


@pytest.fixture(scope="module")
def slow_sghmc(model, sghmc):
    """SGHMC at 30 leapfrog steps a draw: about two seconds a chain of KILLED."""
    with model:
        return pmbd.SGHMC(layer=sghmc.layer, inner_steps=30)


@pytest.fixture(scope="module")
def slow_sghmc_reference(model, slow_sghmc):
    """pm.sample(cores=1) of KILLED with the slow step."""
    with model:
        return pm.sample(**KILLED, cores=1, step=slow_sghmc, progressbar=False)


@pytest.mark.parametrize("sampler", ["sghmc", pytest.param("nuts", marks=pytest.mark.slow)])
def test_a_killed_worker_s_chain_runs_again_with_the_same_draws(
    two_workers, model, slow_sghmc, sampler, caplog, request
):
    """One of two workers killed mid-chain: its chain runs again from its start, and the
    result equals pm.sample(cores=1) value for value (the old code raised instead)."""
    if sampler == "sghmc":  # chains of about two seconds: the kill lands mid-chain
        step, kwargs = slow_sghmc, KILLED
        local = request.getfixturevalue("slow_sghmc_reference")
    else:
        step, kwargs = None, {**KILLED, "tune": 1000}
        with model:
            local = pm.sample(**kwargs, cores=1, step=step, progressbar=False)
    killed: list[str] = []
    killer = _kill_workers_mid_chain(two_workers, killed)
    with caplog.at_level(logging.INFO, logger="pymc_bigdata.distributed"):
        remote = sample_dask(two_workers, **kwargs, step=step, model=model)
    killer.join(timeout=5)
    assert killed, "the chains never ran on both workers"
    lost = [r.getMessage() for r in caplog.records if "was lost with worker" in r.getMessage()]
    assert lost and killed[0] in lost[0], lost
    assert "retry 1 of 3" in lost[0]
    assert_same_draws(local, remote)
    assert mcmc._sample_many is ORIGINAL_SAMPLE_MANY


@pytest.mark.slow
def test_retries_spent_fail_with_the_finished_chains_in_the_store(
    two_workers, model, slow_sghmc, slow_sghmc_reference, tmp_path
):
    """Both workers killed with retries=0: a clear error naming the finished and lost
    chains; the finished chains stay in the store, readable without the model; the same
    call again runs only the others and equals pm.sample(cores=1)."""
    slow = slow_sghmc  # chains 2 and 3 start once 0 and 1 are kept
    store = tmp_path / "chains"
    killed: list[str] = []
    killer = _kill_workers_mid_chain(
        two_workers, killed, how_many=2, ready=lambda: any(store.glob("chain-*.pickle"))
    )
    with pytest.raises(ChainFailedError, match="more than retries=0") as info:
        sample_dask(two_workers, **KILLED, step=slow, model=model, retries=0, store=store)
    killer.join(timeout=5)
    assert len(killed) == 2, "the kill never came"
    finished = info.value.finished
    assert finished and len(finished) < 4
    assert f"Finished chains {list(finished)} are in store" in str(info.value)
    kept = pmbd.read_store(store)
    np.testing.assert_array_equal(kept.posterior["chain"].values, finished)
    assert kept.posterior.sizes["draw"] == KILLED["draws"]

    two_workers.wait_for_workers(2, timeout=120)
    local = slow_sghmc_reference
    for i in finished:  # the kept chains are the reference's chains
        np.testing.assert_array_equal(
            kept.posterior["beta"].sel(chain=i).values, local.posterior["beta"].sel(chain=i)
        )
    rerun: list[int] = []
    with _chains_submitted(rerun):
        resumed = sample_dask(two_workers, **KILLED, step=slow, model=model, store=store)
    assert sorted(rerun) == sorted(set(range(4)) - set(finished))
    assert_same_draws(local, resumed)


@pytest.mark.slow
def test_a_killed_client_s_run_resumes_from_the_store(two_workers, model, tmp_path):
    """The calling process killed midway (SIGKILL): its finished chains are in the store,
    and the same call from another process runs only the rest and equals cores=1."""
    store = tmp_path / "chains"
    address = two_workers.scheduler.address
    script = Path(dask_client.__file__)
    client_process = subprocess.Popen([sys.executable, str(script), address, str(store)])
    try:
        deadline = time.monotonic() + 300
        while not any(store.glob("chain-*.pickle")) and time.monotonic() < deadline:
            assert client_process.poll() is None, "the client ended before any chain finished"
            time.sleep(0.05)
    finally:
        client_process.kill()
        client_process.wait()
    kept = sorted(int(p.stem.split("-")[1]) for p in store.glob("chain-*.pickle"))
    assert 1 <= len(kept) < 4, kept
    with model:
        slow = pmbd.SGHMC(inner_steps=30)
        local = pm.sample(**KILLED, cores=1, step=slow, progressbar=False)
    rerun: list[int] = []
    with _chains_submitted(rerun):
        resumed = sample_dask(two_workers, **KILLED, step=slow, model=model, store=store)
    assert sorted(rerun) == sorted(set(range(4)) - set(kept))
    assert_same_draws(local, resumed)


@contextlib.contextmanager
def _chains_submitted(chains: list[int]):
    """Record the chains whose tasks the caller submits."""
    original = distributed_chains.ChainTasks._submit

    def submit(self, chain, attempt):
        chains.append(chain)
        return original(self, chain, attempt)

    distributed_chains.ChainTasks._submit = submit
    try:
        yield
    finally:
        distributed_chains.ChainTasks._submit = original


def test_a_store_of_another_run_is_refused(two_workers, model, sghmc, tmp_path):
    small = {"draws": 20, "tune": 20, "chains": 2}
    sample_dask(two_workers, **small, random_seed=1, step=sghmc, model=model, store=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("chain-*")) == ["chain-0.pickle", "chain-1.pickle"]
    with pytest.raises(ValueError, match="holds chains of another run: its chain_states differ"):
        sample_dask(two_workers, **small, random_seed=2, step=sghmc, model=model, store=tmp_path)
    with pytest.raises(ValueError, match="its draws differ"):
        sample_dask(
            two_workers,
            **{**small, "draws": 21},
            random_seed=1,
            step=sghmc,
            model=model,
            store=tmp_path,
        )


def test_progress_comes_from_the_workers(two_workers, model, sghmc, monkeypatch):
    """progressbar=True: PyMC's bar is fed by the chains' events while they run."""
    bars: list[distributed_chains.ClusterProgress] = []

    class Recorded(distributed_chains.ClusterProgress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(distributed_chains, "ClusterProgress", Recorded)
    kwargs = {**KILLED, "chains": 2}
    sample_dask(two_workers, **kwargs, step=sghmc, model=model, progressbar=True)
    (bar,) = bars
    assert bar.shown == [900, 900]
    # most draws were shown from the workers' events, before the chains' results came back
    assert bar.from_workers > 900, bar.from_workers


def test_no_worker_fails_with_a_clear_error(model, sghmc, monkeypatch):
    monkeypatch.setattr(distributed_chains, "NO_WORKER_SECONDS", 1.0)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as c:
        with distributed.Client(c, set_as_default=False) as empty:
            with pytest.raises(ChainFailedError, match="had no worker for 1 s; chain 0"):
                sample_dask(empty, draws=10, tune=10, chains=2, step=sghmc, model=model)


def test_bad_arguments(two_workers, model, sghmc):
    kwargs = {"draws": 10, "tune": 10, "step": sghmc, "model": model}
    with pytest.raises(ValueError, match="chains must be at least 1"):
        sample_dask(two_workers, chains=0, **kwargs)
    with pytest.raises(TypeError, match="chains must be an integer"):
        sample_dask(two_workers, chains=2.0, **kwargs)
    with pytest.raises(ValueError, match="draws must be at least 0"):
        sample_dask(two_workers, chains=2, draws=-1, step=sghmc, model=model)
    with pytest.raises(TypeError, match="client must be a distributed.Client"):
        sample_dask("tcp://127.0.0.1:8786", chains=2, **kwargs)
    with pytest.raises(ValueError, match="does not take cores="):
        sample_dask(two_workers, chains=2, cores=2, **kwargs)
    with pytest.raises(ValueError, match="does not take callback="):
        sample_dask(two_workers, chains=2, callback=print, **kwargs)
    with pytest.raises(ValueError, match="retries must be at least 0"):
        sample_dask(two_workers, chains=2, retries=-1, **kwargs)
    with pytest.raises(TypeError, match="store must be a directory path"):
        sample_dask(two_workers, chains=2, store=3, **kwargs)
    with pytest.raises(ValueError, match="nuts_sampler='pymc'"):
        sample_dask(two_workers, chains=2, nuts_sampler="numpyro", **kwargs)
    assert mcmc._sample_many is ORIGINAL_SAMPLE_MANY


def test_no_default_client(model, sghmc):
    """The module's client is not the default one: client=None has nothing to use."""
    with pytest.raises(RuntimeError, match="no default Dask client"):
        sample_dask(None, draws=10, tune=10, chains=2, step=sghmc, model=model)
