"""The worker side of :func:`~pymc_bigdata.sample_dask`: one chain, as ``pm.sample`` runs it.

:func:`chain_task` is the Dask task of one chain: it refuses to run a chain a second time
(Dask re-runs the tasks of a worker that left), marks where the chain started, runs PyMC's
single-chain loop (``_iter_sample``) on the unpickled step and trace, stops early when the
run is aborted, and returns the recorded draws, statistics and warnings.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import cloudpickle
import numpy as np
import pymc.sampling.mcmc as _mcmc
from pymc.util import random_generator_from_state

from pymc_bigdata.distributed_protocol import (
    ChainFailedError,
    event_name,
    ran_on_name,
    started_name,
)

__all__ = ["ABORT_POLL_SECONDS", "chain_task"]

#: how often (seconds) a running chain asks the scheduler whether the run was aborted
ABORT_POLL_SECONDS = 1.0


def chain_task(
    payload: bytes,
    *,
    run_id: str,
    chain: int,
    rng_state: Any,
    start: dict[str, np.ndarray],
    draws: int,
    tune: int,
) -> dict[str, Any]:
    """Run chain ``chain`` on a worker as ``pm.sample(cores=1)`` runs it (``_iter_sample``).

    Parameters
    ----------
    payload
        The pickled ``(step, empty trace)``.
    run_id
        The run's id (its events' and keys' names).
    chain
        The chain's number.
    rng_state
        The state of the chain's generator.
    start
        The chain's initial point.
    draws, tune
        Draws (tuning included) and tuning draws, as ``_iter_sample`` takes them.

    Returns
    -------
    dict
        ``samples``, ``stats`` and ``n_draws`` of the trace, the ``worker``'s address, the
        ``seconds`` taken and the ``warnings`` raised (each once).

    Raises
    ------
    ChainFailedError
        If the chain already started elsewhere (its worker left the cluster).
    """
    from distributed import Event, get_worker

    worker = get_worker().address
    _claim_chain(run_id, chain, worker)
    abort = Event(event_name(run_id, "abort"))
    t0 = time.perf_counter()
    step, trace = cloudpickle.loads(payload)
    trace.setup(draws, chain, step.stats_dtypes)
    rng = random_generator_from_state(rng_state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _sample_chain(
            abort, draws=draws, step=step, start=start, trace=trace, chain=chain, tune=tune, rng=rng
        )
    return {
        "samples": trace.samples,
        "stats": trace._stats,
        "n_draws": len(trace),
        "worker": worker,
        "seconds": time.perf_counter() - t0,
        "warnings": _unique_warnings(caught),
    }


def _claim_chain(run_id: str, chain: int, worker: str) -> None:
    """Mark the chain started (on ``worker``), or refuse a chain that started before."""
    from distributed import Event

    started = Event(started_name(run_id, chain))
    if started.is_set():
        # Dask re-runs the tasks of a worker that left; a chain is never silently restarted
        raise ChainFailedError(
            f"Chain {chain} was lost: the worker that was running it left the Dask cluster "
            "(it crashed, ran out of memory or was shut down). No draws are returned; run "
            "sample_dask again.",
            chain=chain,
        )
    started.set()
    Event(ran_on_name(run_id, chain, worker)).set()


def _sample_chain(abort: Any, **iter_sample_kwargs: Any) -> None:
    """PyMC's single-chain loop, stopped early once ``abort`` (an event) is set."""
    last_poll = time.monotonic()
    for _stats in _mcmc._iter_sample(**iter_sample_kwargs):
        if time.monotonic() - last_poll > ABORT_POLL_SECONDS:
            last_poll = time.monotonic()
            if abort.is_set():  # another chain failed: stop quietly, the caller raises
                break


def _unique_warnings(caught: list[warnings.WarningMessage]) -> list[tuple]:
    """``(category, message, filename, lineno)`` of each distinct warning, in order."""
    seen: set[tuple] = set()
    replay = []
    for w in caught:
        key = (w.category, str(w.message), w.filename, w.lineno)
        if key not in seen:
            seen.add(key)
            replay.append(key)
    return replay
