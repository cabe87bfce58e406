"""Chains of ``pm.sample`` as tasks on a Dask cluster, draw for draw equal to ``cores=1``.

:func:`sample_dask` calls :func:`pymc.sample` itself with ``cores=1``, so PyMC derives the
per-chain generators (``get_random_generator(random_seed).spawn(chains)``), initial points,
step assignment (NUTS initialisation included), trace set-up, sample statistics, convergence
checks and the returned ``DataTree`` exactly as it does on one core. Only the sequential
chain loop (``pymc.sampling.mcmc._sample_many``) is routed to the cluster, for the calling
thread and for the duration of the call: each chain runs on a worker as PyMC's own
single-chain loop (``_iter_sample``) on a fresh copy of the step, pickled with cloudpickle as
PyMC's multiprocess sampler does, with that chain's generator state and initial point. The
recorded draws and statistics come back into PyMC's trace objects, and ``pm.sample``
finishes as usual.

A chain whose worker leaves the cluster while the chain runs is run again from its start
on another worker (up to ``retries`` times): its draws are a function of its generator state
and initial point, so the result is still equal to ``cores=1``. A chain that raises, or is
lost more often than that, fails the whole call with :class:`ChainFailedError`; partial
chains are never returned. With ``store=`` each chain is written to disk the moment it
finishes, and a call with the same arguments and store runs only the chains it lacks
(:mod:`pymc_bigdata.distributed_store`).

The chains' routing lives in :mod:`pymc_bigdata.distributed_routing`, the caller's side of
a run in :mod:`pymc_bigdata.distributed_chains` (its watch over lost workers in
:mod:`pymc_bigdata.distributed_watch`, its progress bar in
:mod:`pymc_bigdata.distributed_progress`), the workers' side in
:mod:`pymc_bigdata.distributed_worker`, and what both sides share (:class:`ChainFailedError`,
the scheduler events' names) in :mod:`pymc_bigdata.distributed_protocol`.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pymc as pm

from pymc_bigdata.distributed_chains import ClusterRun
from pymc_bigdata.distributed_protocol import ChainFailedError
from pymc_bigdata.distributed_routing import chains_on_cluster, renamed_sequential_message
from pymc_bigdata.distributed_store import read_store

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ChainFailedError", "read_store", "sample_dask"]

#: pm.sample arguments that cannot work when chains run as remote tasks
_REFUSED = {
    "cores": "each chain is one Dask task; the cluster's workers set the parallelism",
    "callback": "a per-draw callback would run on the workers, away from the caller",
    "trace": "the chains record in memory on the workers (PyMC's default NDArray traces)",
    "mp_ctx": "the chains run in the Dask workers' processes, not in multiprocessing ones",
}


def sample_dask(
    client: Client | None = None,
    *,
    draws: int = 1000,
    tune: int | None = None,
    chains: int = 4,
    random_seed: Any = None,
    step: Any = None,
    model: pm.Model | None = None,
    retries: int = 3,
    store: str | os.PathLike | None = None,
    **sample_kwargs: Any,
):
    """Run ``pm.sample``'s chains as tasks on a Dask cluster.

    The result equals ``pm.sample(draws=draws, tune=tune, chains=chains, cores=1,
    random_seed=random_seed, step=step, model=model, **sample_kwargs)`` draw for draw
    (posterior, sample statistics and every other group) whenever that run is reproducible
    (an integer or array ``random_seed``), because PyMC itself prepares the chains and
    assembles the result; only where each chain runs differs. Each chain is one task; a
    worker runs one chain per thread, so ``threads_per_worker=1`` workers give one chain per
    process.

    Parameters
    ----------
    client
        A connected ``distributed.Client``; ``None`` uses the default client
        (``distributed.get_client()``).
    draws
        Draws kept per chain, as in :func:`pymc.sample`.
    tune
        Tuning draws per chain; ``None`` lets the step choose, as in :func:`pymc.sample`
        (1000 for PyMC's and this package's steps).
    chains
        Number of chains, 4 by default whatever the cluster's size, so that a seed means the
        same draws on any cluster.
    random_seed
        As in :func:`pymc.sample`: an integer (or array of them) makes the run reproducible
        and equal to ``pm.sample(cores=1)`` with that seed.
    step
        The step method(s), as in :func:`pymc.sample`; ``None`` assigns them (NUTS for a
        continuous model).
    model
        The model; ``None`` takes it from the ``with pm.Model():`` context.
    retries
        How many times a chain lost with its worker (killed, out of memory, a lost machine)
        runs again from its start on another worker; each time is logged as a warning on
        the ``pymc_bigdata.distributed`` logger with the worker that left. A chain that
        raises is not run again.
    store
        A directory to which each chain's draws and statistics are written the moment the
        chain finishes. Calling ``sample_dask`` again with the same arguments and store
        (after a failure, or after the calling process itself died) runs only the chains
        the store lacks and returns the same result as an uninterrupted run. A store
        written by another run (model, data, step, seed, draws or package versions) is
        refused. :func:`read_store` reads the finished chains without the model.
    **sample_kwargs
        Any other :func:`pymc.sample` argument (``initvals``, ``init``, ``var_names``,
        ``idata_kwargs``, ``compile_kwargs``, ``discard_tuned_samples``,
        ``compute_convergence_checks``, step arguments such as ``target_accept``...), except
        ``cores``, ``callback``, ``trace`` and ``mp_ctx``. ``nuts_sampler`` may only be
        ``"pymc"`` (the default here). ``progressbar`` defaults to ``False``; ``True`` (or
        any of PyMC's progress-bar modes) shows PyMC's bar, fed by the workers as the chains
        run. Completed chains are logged at INFO level on the ``pymc_bigdata.distributed``
        logger.

    Returns
    -------
    DataTree
        What ``pm.sample`` returns, with chains ``0 .. chains - 1``.

    Raises
    ------
    ChainFailedError
        A chain raised on its worker (the original exception is chained), it was lost more
        than ``retries`` times, or the cluster had no worker for a minute; the other chains
        are cancelled, nothing is returned, and the error names the chains that finished
        (kept in ``store`` when one was given).
    TypeError, ValueError
        A bad argument (``client`` not a ``Client``, ``chains < 1``, ``retries < 0``, a
        refused argument, a ``store`` of another run...).
    RuntimeError
        ``client=None`` and there is no default client.
    NotImplementedError
        The step is a population sampler (``DEMetropolis``), whose chains need each other.

    Notes
    -----
    The model and step are shipped to the workers with cloudpickle: in-memory data travels
    with them, and data read from files must be at the same path on every worker. Workers
    need the same versions of PyMC, PyTensor and pymc-bigdata as the caller; they compile the
    model's functions on first use (PyTensor's on-disk cache makes later compiles on the same
    machine fast).
    """
    client = _resolve_client(client)
    _check_arguments(chains, draws, tune, sample_kwargs)
    _check_recovery(retries, store)
    sample_kwargs.update(draws=draws, tune=tune, chains=chains, random_seed=random_seed)
    run = ClusterRun(client=client, thread=threading.get_ident(), retries=retries, store=store)
    return _sample_on_cluster(run, step=step, model=model, **sample_kwargs)


def _sample_on_cluster(run: ClusterRun, **kwargs: Any) -> Any:
    """``pm.sample(cores=1, nuts_sampler="pymc", **kwargs)``, its chains run on the cluster."""
    with chains_on_cluster(run), renamed_sequential_message(run, kwargs["chains"]):
        return pm.sample(cores=1, nuts_sampler="pymc", **kwargs)


# ---------------------------------------------------------------------------------- arguments
def _resolve_client(client: Any) -> Client:
    try:
        import distributed
    except ImportError as err:  # pragma: no cover - the optional dependency is missing
        raise ImportError(
            "sample_dask needs dask.distributed: pip install 'pymc-bigdata[dask]'."
        ) from err
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError as err:
            raise RuntimeError(
                "sample_dask(client=None) found no default Dask client. Create one first, "
                "e.g. distributed.Client(distributed.LocalCluster()) or "
                "distributed.Client('tcp://scheduler-host:8786'), or pass client=."
            ) from err
    if not isinstance(client, distributed.Client):
        raise TypeError(
            f"client must be a distributed.Client, got {type(client).__name__}; for a "
            "scheduler address use client=distributed.Client('tcp://host:8786')."
        )
    if client.status != "running":
        raise ValueError(
            f"The Dask client is not running (status {client.status!r}): connect a new one, "
            "e.g. distributed.Client('tcp://scheduler-host:8786'), and pass it."
        )
    return client


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")


def _check_recovery(retries: Any, store: Any) -> None:
    """Refuse a retry count that is no integer or is negative, and a store that is no path."""
    _check_count("retries", retries, minimum=0)
    if store is not None and not isinstance(store, str | os.PathLike):
        raise TypeError(f"store must be a directory path, got {type(store).__name__}.")


def _check_arguments(chains: Any, draws: Any, tune: Any, sample_kwargs: dict[str, Any]) -> None:
    """Refuse a chain, draw or tuning count that is no integer or is too small, then check
    (and complete) ``sample_kwargs`` in place."""
    _check_count("chains", chains, minimum=1)
    _check_count("draws", draws, minimum=0)
    if tune is not None:
        _check_count("tune", tune, minimum=0)
    if tune is not None and draws + tune < 1:
        raise ValueError("draws + tune must be at least 1.")
    _check_sample_kwargs(sample_kwargs)


def _check_sample_kwargs(sample_kwargs: dict[str, Any]) -> None:
    """Refuse (and drop) the pm.sample arguments sample_dask cannot honour, and default
    ``progressbar`` to False, in place."""
    for name, why in _REFUSED.items():
        if sample_kwargs.get(name) is not None:
            raise ValueError(f"sample_dask does not take {name}=: {why}.")
    for name in _REFUSED:
        sample_kwargs.pop(name, None)
    nuts_sampler = sample_kwargs.pop("nuts_sampler", None) or "pymc"
    if nuts_sampler != "pymc":
        raise ValueError(
            f"sample_dask runs PyMC's own samplers only (nuts_sampler='pymc'), got "
            f"nuts_sampler={nuts_sampler!r}; external NUTS samplers run their chains themselves."
        )
    sample_kwargs.setdefault("progressbar", False)
