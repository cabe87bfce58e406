"""The caller's side of a :func:`~pymc_bigdata.sample_dask` run: its chains as Dask tasks.

:func:`run_chains` does what ``pymc.sampling.mcmc._sample_many`` does, one task per chain:
it pickles the step and an empty trace once, puts them on the workers
(:func:`scatter_payload`), submits :func:`~pymc_bigdata.distributed_worker.chain_task` for
every chain, waits for them under a :class:`~pymc_bigdata.distributed_watch.LostChainWatch`
(aborting the run on any failure), fills PyMC's traces with what came back and replays the
chains' warnings in the caller (:func:`replay_warnings`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np
from pymc.backends.ndarray import NDArray
from pymc.stats.convergence import log_warning_stats
from pymc.util import get_state_from_generator

from pymc_bigdata.distributed_protocol import chain_key, event_name
from pymc_bigdata.distributed_watch import LostChainWatch
from pymc_bigdata.distributed_worker import chain_task

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["LOST_WORKER_POLL_SECONDS", "ClusterRun", "replay_warnings", "run_chains"]

#: the logger docs/distributed.md names (chains finished, where and when)
_log = logging.getLogger("pymc_bigdata.distributed")

#: how often (seconds) the caller checks that the workers running its chains are still there
LOST_WORKER_POLL_SECONDS = 1.0


@dataclass
class ClusterRun:
    """One sample_dask call: where its chains go, and what came back."""

    client: Client
    thread: int
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def run_chains(
    run: ClusterRun,
    *,
    draws: int,
    chains: int,
    traces: Sequence[Any],
    start: Sequence[dict[str, np.ndarray]],
    rngs: Sequence[np.random.Generator],
    step: Any,
    tune: int = 0,
    **_: Any,
) -> None:
    """What ``_sample_many`` does, one task per chain: fill ``traces`` with every chain's
    ``draws`` (tuning included) draws, or raise
    :class:`~pymc_bigdata.distributed.ChainFailedError`."""
    if not all(type(trace) is NDArray for trace in traces):
        raise ValueError("sample_dask records into PyMC's default in-memory traces only.")
    client = run.client
    # the chain function's inputs, taken before anything runs: the step in its initial
    # state (what _sample_many restores before each chain) and an empty trace to record into
    payload = cloudpickle.dumps((step, _empty_trace(traces[0])), protocol=-1)
    watch = LostChainWatch(client, run.run_id)
    payload_future = scatter_payload(client, payload, chains)
    futures = {
        client.submit(
            chain_task,
            payload_future,
            run_id=run.run_id,
            chain=i,
            rng_state=get_state_from_generator(rngs[i]),
            start=start[i],
            draws=draws,
            tune=tune,
            key=chain_key(run.run_id, i),
            pure=False,
        ): i
        for i in range(chains)
    }
    results = _gather(run, watch, futures, payload_future, draws)
    for i in range(chains):
        trace, result = traces[i], results[i]
        trace.samples = result["samples"]
        trace._stats = result["stats"]
        trace.draw_idx = result["n_draws"]
    replay_warnings([results[i] for i in range(chains)])


def _empty_trace(first: NDArray) -> NDArray:
    """A new, empty in-memory trace like ``first``, for a chain to record into."""
    return NDArray(
        name=first.name,
        model=first.model,
        vars=first.vars,
        fn=first.fn,
        var_shapes=first.var_shapes,
        var_dtypes=first.var_dtypes,
    )


def _gather(
    run: ClusterRun,
    watch: LostChainWatch,
    futures: dict[Any, int],
    payload_future: Any,
    draws: int,
) -> dict[int, dict[str, Any]]:
    """Every chain's result by chain; on any failure the run is aborted and its chains
    cancelled. The payload and the run's events are freed either way."""
    from distributed import Event

    client, chains = run.client, len(futures)
    results: dict[int, dict[str, Any]] = {}
    failed = True
    try:
        _wait(watch, dict(futures), results, draws)
        failed = False
    except BaseException:
        with contextlib.suppress(Exception):
            Event(event_name(run.run_id, "abort"), client=client).set()
        with contextlib.suppress(Exception):
            client.cancel(list(futures), force=True)
        raise
    finally:
        with contextlib.suppress(Exception):
            client.cancel([payload_future])
        watch.clear_events(chains, results, keep_abort=failed)
    return results


def _wait(
    watch: LostChainWatch,
    pending: dict[Any, int],
    results: dict[int, dict[str, Any]],
    draws: int,
) -> None:
    """Collect the chains into ``results`` as they finish (releasing each future), checking
    every :data:`LOST_WORKER_POLL_SECONDS` that no pending chain's worker left."""
    chains = len(pending)
    t0 = time.perf_counter()
    next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
    while pending:
        done = [future for future in pending if future.done()]
        for future in done:
            i = pending.pop(future)
            results[i] = watch.collect(future, i, draws)
            future.release()  # its worker may go now without the chain being run again
            _log.info(
                "chain %d finished on %s in %.1f s (%d of %d chains done, %.1f s elapsed)",
                i,
                results[i]["worker"],
                results[i]["seconds"],
                len(results),
                chains,
                time.perf_counter() - t0,
            )
        if pending and time.monotonic() >= next_check:
            watch.check(set(pending.values()))
            next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
        elif pending and not done:
            time.sleep(0.05)


def scatter_payload(client: Client, payload: bytes, chains: int) -> Any:
    """Put the pickled step on as many workers as there are chains (up to all of them).

    With one copy, Dask would run every chain on the worker that holds it (data locality);
    with a copy on ``k`` workers it spreads the chains over them. Any other worker that gets
    a chain fetches the copy from a peer.
    """
    info = client.scheduler_info(n_workers=-1).get("workers", {})
    # the least busy workers first; chains beyond their count fetch the payload from a peer
    busy = client.processing()
    ranked = sorted(info, key=lambda w: (len(busy.get(w, ())), w))[: max(1, chains)]
    return client.scatter(payload, hash=False, workers=ranked or None, broadcast=bool(ranked))


def replay_warnings(results: list[dict[str, Any]]) -> None:
    """Emit in the caller what the chains warned and logged on their workers, in chain
    order, each Python warning once (as the default warning filter shows it on one core)."""
    seen: set[tuple] = set()
    for result in results:
        for key in result["warnings"]:
            if key not in seen:
                seen.add(key)
                category, message, filename, lineno = key
                warnings.warn_explicit(message, category, filename, lineno)
        for stats in result["stats"] or []:
            for warning in stats.get("warning", ()):
                if warning is not None and warning != 0:
                    log_warning_stats([{"warning": warning}])
