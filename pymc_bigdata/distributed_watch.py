"""The caller's watch over a :func:`~pymc_bigdata.sample_dask` run's chains.

:class:`LostChainWatch` notices an attempt at a chain whose worker left the cluster while it
ran, turns a finished attempt's future into its result (or says that the attempt was lost,
or raises the :class:`ChainFailedError` saying why the chain failed), and frees the run's
scheduler events afterwards.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from pymc_bigdata.distributed_protocol import (
    ChainFailedError,
    attempt_of_key,
    event_name,
    ran_on_name,
    started_name,
)

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["LOST", "LostChainWatch"]

#: what :meth:`LostChainWatch.collect` returns for an attempt lost with its worker
LOST = "lost"


class LostChainWatch:
    """Notices an attempt at a chain whose worker left the cluster while the attempt ran.

    Each attempt, as it starts, sets an event named after its worker; the watch pins an
    attempt to the worker it started on (seen in ``client.processing()``) and reports the
    attempt lost when that worker is no longer in the cluster. Dask would run a lost task
    again; its re-run of an attempt that started raises on the worker
    (:func:`~pymc_bigdata.distributed_worker.chain_task`), and :meth:`collect` reports that
    attempt lost too.

    Parameters
    ----------
    client
        The run's client.
    run_id
        The run's id.
    """

    def __init__(self, client: Client, run_id: str):
        self.client = client
        self.run_id = run_id
        self.workers_at_start = set(client.scheduler_info(n_workers=-1).get("workers", {}))
        self.pinned: dict[tuple[int, int], str] = {}
        self.seen_workers = set(self.workers_at_start)

    def lost(self, pending: dict[int, int]) -> dict[int, str]:
        """The pending chains (``chain -> attempt``) whose attempt's worker left the
        cluster, with that worker's address."""
        processing = self.client.processing()
        self.seen_workers |= set(processing)
        self._pin(processing, pending)
        gone = {}
        for chain, attempt in sorted(pending.items()):
            worker = self.pinned.get((chain, attempt))
            if worker is not None and worker not in processing:
                gone[chain] = worker
        return gone

    def _pin(self, processing: dict[str, Any], pending: dict[int, int]) -> None:
        """Pin each pending attempt seen processing to its worker once it started there."""
        from distributed import Event

        for worker, keys in processing.items():
            for key in keys:
                found = attempt_of_key(self.run_id, key)
                if found is None or pending.get(found[0]) != found[1] or found in self.pinned:
                    continue
                if Event(ran_on_name(self.run_id, *found, worker), client=self.client).is_set():
                    self.pinned[found] = worker

    def started_on(self, chain: int, attempt: int) -> str | None:
        """The worker an attempt started on (pinned, or found by its event), if known."""
        from distributed import Event

        if (chain, attempt) in self.pinned:
            return self.pinned[(chain, attempt)]
        for worker in sorted(self.seen_workers):
            name = ran_on_name(self.run_id, chain, attempt, worker)
            with contextlib.suppress(Exception):
                if Event(name, client=self.client).is_set():
                    self.pinned[(chain, attempt)] = worker
                    return worker
        return None

    def collect(self, future: Any, chain: int, attempt: int, draws: int) -> dict[str, Any] | str:
        """The finished attempt's result, :data:`LOST` when it was lost with its worker, or
        :class:`ChainFailedError` saying why the chain failed."""
        try:
            result = future.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            if _is_loss(err):
                return LOST
            raise ChainFailedError(
                f"Chain {chain} failed on the Dask cluster: {type(err).__name__}: {err}.",
                chain=chain,
                worker=self.pinned.get((chain, attempt)),
            ) from err
        if result["n_draws"] != draws:
            raise ChainFailedError(
                f"Chain {chain} came back with {result['n_draws']} of {draws} draws from "
                f"worker {result['worker']}.",
                chain=chain,
                worker=result["worker"],
            )
        return result

    def workers_left(self) -> list[str]:
        """Workers that were in the cluster at the start of the run and are gone now."""
        workers = set(self.client.scheduler_info(n_workers=-1).get("workers", {}))
        return sorted(self.workers_at_start - workers)

    def clear_events(self, attempts: dict[int, int], keep_abort: bool) -> None:
        """Free the run's events on the scheduler (``attempts``: each chain's last attempt);
        after a failure, the abort event stays set for the attempts still running
        (cancelling a Dask task does not stop its thread)."""
        from distributed import Event

        names = [] if keep_abort else [event_name(self.run_id, "abort")]
        names += [
            started_name(self.run_id, chain, attempt)
            for chain, last in attempts.items()
            for attempt in range(last + 1)
        ]
        names += [ran_on_name(self.run_id, c, a, w) for (c, a), w in self.pinned.items()]
        for name in set(names):
            with contextlib.suppress(Exception):
                Event(name, client=self.client).clear()


def _is_loss(err: BaseException) -> bool:
    """Whether a task's error says it was lost with a worker (not that the chain raised)."""
    from distributed import KilledWorker

    if isinstance(err, ChainFailedError):  # Dask's re-run of an attempt that started
        return True
    if isinstance(err, KilledWorker):
        return True
    # the scattered step was lost with every worker that held it
    return type(err).__name__ in {"CancelledError", "FutureCancelledError"}
