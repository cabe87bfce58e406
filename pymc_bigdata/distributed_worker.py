"""The worker side of :func:`~pymc_bigdata.sample_dask`: one chain, as ``pm.sample`` runs it.

:func:`chain_task` is the Dask task of one attempt at a chain: it refuses to run an attempt
a second time (Dask re-runs the tasks of a worker that left; the caller runs a lost chain
again as a new attempt instead), marks where the attempt started, runs PyMC's single-chain
loop (``_iter_sample``) on the unpickled step and trace, sends its progress to the caller,
stops early when the run is aborted or the task is no longer wanted, and returns the
recorded draws, statistics and warnings.
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
    progress_topic,
    ran_on_name,
    started_name,
)

__all__ = ["ABORT_POLL_SECONDS", "PROGRESS_SECONDS", "chain_task", "plain_stats"]

#: how often (seconds) a running chain asks whether the run was aborted or its task dropped
ABORT_POLL_SECONDS = 1.0

#: how often (seconds) a running chain sends the statistics of its new draws to the caller
PROGRESS_SECONDS = 0.5

#: task states in which a running chain's result is no longer wanted
_UNWANTED = {"cancelled", "released", "forgotten"}


def chain_task(
    payload: bytes,
    *,
    run_id: str,
    chain: int,
    attempt: int,
    rng_state: Any,
    start: dict[str, np.ndarray],
    draws: int,
    tune: int,
    progress: bool = False,
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
    attempt
        The attempt's number (0 the first time; a chain lost with its worker runs again).
    rng_state
        The state of the chain's generator.
    start
        The chain's initial point.
    draws, tune
        Draws (tuning included) and tuning draws, as ``_iter_sample`` takes them.
    progress
        Send the new draws' scalar statistics to the caller every :data:`PROGRESS_SECONDS`
        (a Dask event on :func:`~pymc_bigdata.distributed_protocol.progress_topic`).

    Returns
    -------
    dict
        ``samples``, ``stats`` and ``n_draws`` of the trace, the ``worker``'s address, the
        ``seconds`` taken and the ``warnings`` raised (each once).

    Raises
    ------
    ChainFailedError
        If this attempt already started elsewhere (its worker left the cluster).
    """
    from distributed import Event, get_worker

    worker = get_worker()
    _claim_attempt(run_id, chain, attempt, worker.address)
    abort = Event(event_name(run_id, "abort"))
    t0 = time.perf_counter()
    step, trace = cloudpickle.loads(payload)
    trace.setup(draws, chain, step.stats_dtypes)
    rng = random_generator_from_state(rng_state)
    sender = _ProgressSender(worker, run_id, chain, attempt) if progress else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _sample_chain(
            abort,
            worker,
            sender,
            draws=draws,
            step=step,
            start=start,
            trace=trace,
            chain=chain,
            tune=tune,
            rng=rng,
        )
    return {
        "samples": trace.samples,
        "stats": trace._stats,
        "n_draws": len(trace),
        "worker": worker.address,
        "seconds": time.perf_counter() - t0,
        "warnings": _unique_warnings(caught),
    }


def _claim_attempt(run_id: str, chain: int, attempt: int, worker: str) -> None:
    """Mark the attempt started (on ``worker``), or refuse an attempt that started before."""
    from distributed import Event

    started = Event(started_name(run_id, chain, attempt))
    if started.is_set():
        # Dask re-runs the tasks of a worker that left; the caller runs a new attempt instead
        raise ChainFailedError(
            f"Chain {chain} was lost: the worker that was running it left the Dask cluster "
            "(it crashed, ran out of memory or was shut down).",
            chain=chain,
        )
    started.set()
    Event(ran_on_name(run_id, chain, attempt, worker)).set()


def _sample_chain(
    abort: Any, worker: Any, sender: _ProgressSender | None, **iter_sample_kwargs: Any
) -> None:
    """PyMC's single-chain loop, stopped early once ``abort`` (an event) is set or the task
    is no longer wanted (cancelled, or its client left)."""
    key = worker.get_current_task()
    last_poll = time.monotonic()
    for draw, stats in enumerate(_mcmc._iter_sample(**iter_sample_kwargs)):
        if sender is not None:
            sender.add(draw, stats)
        if time.monotonic() - last_poll > ABORT_POLL_SECONDS:
            last_poll = time.monotonic()
            if abort.is_set() or not _still_wanted(worker, key):
                break  # the caller raises, or nobody waits for this chain any more
    if sender is not None:
        sender.flush()


def _still_wanted(worker: Any, key: Any) -> bool:
    """Whether the scheduler still wants the running task ``key``'s result."""
    task = worker.state.tasks.get(key)
    return task is not None and task.state not in _UNWANTED


class _ProgressSender:
    """Sends a chain's new draws' scalar statistics to the caller, at most every
    :data:`PROGRESS_SECONDS` (a Dask event, which the caller's client subscribes to)."""

    def __init__(self, worker: Any, run_id: str, chain: int, attempt: int):
        self.worker, self.topic = worker, progress_topic(run_id)
        self.chain, self.attempt = chain, attempt
        self.first_draw, self.pending = 0, []
        self.last_sent = time.monotonic()

    def add(self, draw: int, stats: list[dict[str, Any]]) -> None:
        if not self.pending:
            self.first_draw = draw
        self.pending.append([plain_stats(method_stats) for method_stats in stats])
        if time.monotonic() - self.last_sent > PROGRESS_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            message = {
                "chain": self.chain,
                "attempt": self.attempt,
                "first_draw": self.first_draw,
                "stats": self.pending,
            }
            self.worker.log_event(self.topic, message)
        self.pending, self.last_sent = [], time.monotonic()


def plain_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The scalar statistics of one draw as plain Python numbers (what a Dask event
    carries); arrays and objects are left out."""
    plain: dict[str, Any] = {}
    for name, value in stats.items():
        if isinstance(value, bool | int | float | str):
            plain[name] = value
        elif isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0:
            if value.dtype.kind in "biuf":
                plain[name] = value.item()
    return plain


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
