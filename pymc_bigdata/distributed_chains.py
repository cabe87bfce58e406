"""The caller's side of a :func:`~pymc_bigdata.sample_dask` run: its chains as Dask tasks.

:func:`run_chains` does what ``pymc.sampling.mcmc._sample_many`` does, one task per chain:
it reads the chains a store already holds, pickles the step and an empty trace once, puts
them on the workers (:func:`scatter_payload`) and runs the other chains as
:class:`ChainTasks`: a chain lost with its worker runs again from its start (the same
draws) up to ``retries`` times, each finished chain goes to the store at once, and the
workers' progress events feed the progress bar. It then fills PyMC's traces with what came
back and replays the chains' warnings in the caller (:func:`replay_warnings`).
"""

from __future__ import annotations

import contextlib
import logging
import os
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

from pymc_bigdata.distributed_progress import ClusterProgress
from pymc_bigdata.distributed_protocol import ChainFailedError, chain_key, event_name
from pymc_bigdata.distributed_store import ChainStore, run_fingerprint
from pymc_bigdata.distributed_watch import LOST, LostChainWatch
from pymc_bigdata.distributed_worker import chain_task
from pymc_bigdata.shared_rows import rows_travel_with_pickles

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "LOST_WORKER_POLL_SECONDS",
    "NO_WORKER_SECONDS",
    "ChainTasks",
    "ClusterRun",
    "replay_warnings",
    "run_chains",
]

#: the logger docs/distributed.md names (chains finished, lost and run again)
_log = logging.getLogger("pymc_bigdata.distributed")

#: how often (seconds) the caller checks that the workers running its chains are still there
LOST_WORKER_POLL_SECONDS = 1.0

#: how long (seconds) a run waits for a worker when the cluster has none before it fails
NO_WORKER_SECONDS = 60.0


@dataclass
class ClusterRun:
    """One sample_dask call: where its chains go, how often a lost chain runs again, and
    where finished chains are kept."""

    client: Client
    thread: int
    retries: int = 3
    store: str | os.PathLike | None = None
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
    model: Any = None,
    progressbar: Any = False,
    progressbar_theme: Any = None,
    **_: Any,
) -> None:
    """What ``_sample_many`` does, one task per chain: fill ``traces`` with every chain's
    ``draws`` (tuning included) draws, or raise
    :class:`~pymc_bigdata.distributed.ChainFailedError`."""
    if not all(type(trace) is NDArray for trace in traces):
        raise ValueError("sample_dask records into PyMC's default in-memory traces only.")
    rng_states = [get_state_from_generator(rng) for rng in rngs]
    store = None
    if run.store is not None:
        fingerprint = run_fingerprint(
            model=model,
            step=step,
            traces=traces,
            start=start,
            rng_states=rng_states,
            draws=draws,
            tune=tune,
        )
        store = ChainStore.open(run.store, fingerprint)
    results = store.finished() if store is not None else {}
    progress = ClusterProgress(
        run.client,
        run.run_id,
        step,
        chains=chains,
        draws=draws,
        tune=tune,
        progressbar=progressbar,
        progressbar_theme=progressbar_theme,
    )
    with progress:
        for i in sorted(results):
            _log.info("chain %d read from the store %s", i, run.store)
            progress.finish(i, results[i])
        missing = [i for i in range(chains) if i not in results]
        if missing:
            # the chain function's inputs, taken before anything runs: the step in its
            # initial state (what _sample_many restores before each chain) and an empty
            # trace to record into
            # (with the rows: workers may be on other machines, beyond this one's shared
            # memory)
            with rows_travel_with_pickles():
                payload = cloudpickle.dumps((step, _empty_trace(traces[0])), protocol=-1)
            tasks = ChainTasks(
                run,
                payload,
                store=store,
                progress=progress,
                draws=draws,
                tune=tune,
                rng_states=rng_states,
                start=start,
                finished=results,
            )
            tasks.run(missing)
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


class ChainTasks:
    """The chains of a run still to sample, as Dask tasks: submitted, watched, run again
    when lost with their worker, collected into ``finished`` (and the store).

    Parameters
    ----------
    run
        The run.
    payload
        The pickled ``(step, empty trace)``.
    store
        Where finished chains are kept, or None.
    progress
        The run's progress bar.
    draws, tune
        Draws per chain (tuning included) and tuning draws.
    rng_states, start
        Every chain's generator state and initial point.
    finished
        The chains' results by chain, filled as they finish.
    """

    def __init__(
        self,
        run: ClusterRun,
        payload: bytes,
        *,
        store: ChainStore | None,
        progress: ClusterProgress,
        draws: int,
        tune: int,
        rng_states: Sequence[Any],
        start: Sequence[dict[str, np.ndarray]],
        finished: dict[int, dict[str, Any]],
    ):
        self.cluster_run, self.client, self.payload = run, run.client, payload
        self.store, self.progress, self.finished = store, progress, finished
        self.draws, self.tune = draws, tune
        self.rng_states, self.start = rng_states, start
        self.attempts: dict[int, int] = {}
        self.lost_on: dict[int, list[str | None]] = {}
        self.futures: dict[Any, int] = {}
        self.watch: LostChainWatch | None = None
        self.payload_future: Any = None

    def run(self, chains: Sequence[int]) -> None:
        """Sample ``chains`` on the cluster, or raise :class:`ChainFailedError`; on a
        failure the run's other tasks are cancelled. The payload and the run's events are
        freed either way."""
        from distributed import Event

        failed = True
        try:
            self._wait_for_a_worker(chains)
            self.watch = LostChainWatch(self.client, self.cluster_run.run_id)
            self.payload_future = scatter_payload(self.client, self.payload, len(chains))
            for chain in chains:
                self._submit(chain, attempt=0)
            self._wait()
            failed = False
        except BaseException:
            with contextlib.suppress(Exception):
                Event(event_name(self.cluster_run.run_id, "abort"), client=self.client).set()
            with contextlib.suppress(Exception):
                self.client.cancel(list(self.futures), force=True)
            raise
        finally:
            with contextlib.suppress(Exception):
                self.client.cancel([self.payload_future])
            if self.watch is not None:
                self.watch.clear_events(self.attempts, keep_abort=failed)

    def _submit(self, chain: int, attempt: int) -> None:
        if self.payload_future.status != "finished":  # lost with every worker that held it
            self.payload_future = scatter_payload(self.client, self.payload, 1)
        future = self.client.submit(
            chain_task,
            self.payload_future,
            run_id=self.cluster_run.run_id,
            chain=chain,
            attempt=attempt,
            rng_state=self.rng_states[chain],
            start=self.start[chain],
            draws=self.draws,
            tune=self.tune,
            progress=self.progress.active,
            key=chain_key(self.cluster_run.run_id, chain, attempt),
            pure=False,
        )
        self.futures[future] = chain
        self.attempts[chain] = attempt

    def _wait(self) -> None:
        """Collect the chains as they finish (releasing each future), checking every
        :data:`LOST_WORKER_POLL_SECONDS` that no pending chain's worker left."""
        t0 = time.perf_counter()
        next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
        no_worker_since: float | None = None
        while self.futures:
            self.progress.drain()
            done = [future for future in self.futures if future.done()]
            for future in done:
                self._collect(future, t0)
            if self.futures and time.monotonic() >= next_check:
                pending = {chain: self.attempts[chain] for chain in self.futures.values()}
                for chain, worker in self.watch.lost(pending).items():
                    self._lost(chain, worker)
                no_worker_since = self._check_workers(no_worker_since)
                next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
            elif self.futures and not done:
                time.sleep(0.05)
        self.progress.drain()

    def _collect(self, future: Any, t0: float) -> None:
        chain = self.futures.pop(future)
        attempt = self.attempts[chain]
        try:
            result = self.watch.collect(future, chain, attempt, self.draws)
        except ChainFailedError as err:
            raise self._failure(str(err), chain, err.worker) from err.__cause__
        future.release()  # its worker may go now without the chain being run again
        if result is LOST:
            self._lost(chain, self.watch.started_on(chain, attempt), cancel=False)
            return
        self.watch.pinned[(chain, attempt)] = result["worker"]
        if self.store is not None:
            self.store.write(chain, result)
        self.finished[chain] = result
        self.progress.finish(chain, result)
        _log.info(
            "chain %d finished on %s in %.1f s (%d chains done, %d to go, %.1f s elapsed)",
            chain,
            result["worker"],
            result["seconds"],
            len(self.finished),
            len(self.futures),
            time.perf_counter() - t0,
        )

    def _lost(self, chain: int, worker: str | None, cancel: bool = True) -> None:
        """Chain ``chain``'s attempt was lost with ``worker``: run it again, or fail once
        its retries are spent."""
        if cancel:
            future = next(f for f, c in self.futures.items() if c == chain)
            del self.futures[future]
            with contextlib.suppress(Exception):
                self.client.cancel([future], force=True)
        self.lost_on.setdefault(chain, []).append(worker)
        attempt, retries = self.attempts[chain] + 1, self.cluster_run.retries
        if attempt > retries:
            workers = ", ".join(str(w) for w in self.lost_on[chain])
            raise self._failure(
                f"Chain {chain} was lost {attempt} times, more than retries={retries} "
                f"allows: the workers running it ({workers}) left the Dask cluster (crashed, "
                "ran out of memory or were shut down).",
                chain,
                worker,
            )
        _log.warning(
            "chain %d was lost with worker %s; running it again from its start (retry %d of %d)",
            chain,
            worker,
            attempt,
            retries,
        )
        self._submit(chain, attempt)

    def _check_workers(self, no_worker_since: float | None) -> float | None:
        """Fail once the cluster has had no worker for :data:`NO_WORKER_SECONDS`."""
        if self.client.scheduler_info(n_workers=-1).get("workers"):
            return None
        now = time.monotonic()
        if no_worker_since is None:
            return now
        if now - no_worker_since > NO_WORKER_SECONDS:
            chain = min(self.futures.values())
            raise self._failure(
                f"No worker has been in the Dask cluster for {NO_WORKER_SECONDS:.0f} s; "
                f"chain {chain} cannot run.",
                chain,
                None,
            )
        return no_worker_since

    def _wait_for_a_worker(self, chains: Sequence[int]) -> None:
        try:
            self.client.wait_for_workers(1, timeout=NO_WORKER_SECONDS)
        except TimeoutError:
            raise self._failure(
                f"The Dask cluster has had no worker for {NO_WORKER_SECONDS:.0f} s; "
                f"chain {min(chains)} cannot run.",
                min(chains),
                None,
            ) from None

    def _failure(self, message: str, chain: int, worker: str | None) -> ChainFailedError:
        """The run's error: ``message``, then which chains finished and where they are."""
        done = sorted(self.finished)
        unfinished = sorted(set(range(len(self.start))) - set(done))
        if self.store is not None:
            kept = (
                f" Finished chains {done} are in store {str(self.store.path)!r}; calling "
                "sample_dask again with the same arguments and store= runs only chains "
                f"{unfinished}."
            )
        else:
            kept = (
                f" Finished chains: {done}; no draws are returned (pass store= to keep "
                "finished chains and resume)."
            )
        left = self.watch.workers_left() if self.watch is not None else []
        note = f" Workers that left the cluster during the run: {left}." if left else ""
        return ChainFailedError(f"{message}{kept}{note}", chain=chain, worker=worker, finished=done)


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
